"""Why an attempt waits for a person, in words: each ``review_reason`` code the ledger and the
reconciler write, and each effect class, as a sentence an operator can act on. Pages show the
sentence and keep the code beside it (it is what the API, exports and filters use)."""

from __future__ import annotations

REVIEW_REASONS = {
    "approval_expired": "The approval policy's maximum wait passed before enough people approved;"
    " nothing was sent.",
    "approval_rejected": "An approver rejected the call; nothing was sent.",
    "authority_changed": "The tenant's grant, scopes or policy version changed since the intent;"
    " a linked attempt under today's authority needs approval.",
    "authority_revoked": "The grant no longer allows this call, so recovery did not send it.",
    "duplicate_effects": "The provider reports more than one effect for this key: check which one"
    " is real.",
    "effect_claimed": "The provider's answer names an effect another attempt already confirmed:"
    " both are linked; decide which attempt it belongs to.",
    "invalid_provider_answer": "The provider's answer could not be read as the protocol says;"
    " check with the provider.",
    "manual_class": "This tool cannot be looked up (manual effect class): a person must find out"
    " whether it happened.",
    "max_age": "It stayed unresolved past the maximum age, so recovery stopped trying on its own.",
    "not_found": "The provider has no record of it, and this tool cannot be resent safely without"
    " a person.",
    "not_found_critical": "The provider has no record of it; the tool is critical, so a person"
    " decides whether to retry.",
    "payload_mismatch": "The provider has an effect under this key with other arguments (its"
    " payload hash differs).",
    "provider_request_mismatch": "The provider's request id differs from the one recorded when it"
    " was sent.",
    "sends_exhausted": "Nothing was sent, and the tool's send limit is used up.",
    "worker_error": "Recovery failed on this attempt alone (the error is in its history); the"
    " rest went on.",
}

EFFECT_CLASSES = {
    "idempotent": "the provider honours the idempotency key: recovery may resend with it",
    "reconcilable": "the provider can be asked whether it happened, but a resend could repeat it",
    "manual": "the provider can neither be asked nor trusted with a resend: a person decides",
}


def reason_text(code: str) -> str:
    """The sentence for a ``review_reason`` code (the code itself for one not listed here)."""
    return REVIEW_REASONS.get(code, code.replace("_", " ").capitalize() + ".") if code else ""
