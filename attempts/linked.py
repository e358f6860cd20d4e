"""Linked attempts: a new attempt that continues one whose authority changed, under today's
grant (never wider, ``authority.linked_authority``), waiting for a reviewer's approval. What it
would record is previewed first; people's decisions about it live in ``attempts.review``."""

from __future__ import annotations

from typing import Any

from attempts import authority, states
from attempts.ledger import MAX_TEXT, NotGranted, StateConflict, _reload
from attempts.locking import write_transaction
from attempts.models import Attempt, RecordedKey, State, Tool, key_digest
from attempts.states import Actor


def _next_link_key(original: Attempt) -> str:
    """``<root key>~r<n>`` for the n-th link of a lineage. A lineage is a chain (a superseded
    attempt is terminal, so it has one link at most); the name comes from the original's own key
    and is checked free through the permanent key index, never by scanning keys."""
    root_key, n = original.idempotency_key, 1
    if original.parent_id is not None and "~r" in root_key:
        head, _, tail = root_key.rpartition("~r")
        if tail.isdigit():
            root_key, n = head, int(tail) + 1
    # Free for the life of the ledger: never used, its attempt live or archived.
    while RecordedKey.objects.filter(key_digest=key_digest(f"{root_key}~r{n}")).exists():
        n += 1
    key = f"{root_key}~r{n}"
    if len(key) > MAX_TEXT["idempotency_key"]:
        raise StateConflict("the lineage's idempotency key would be too long", attempt=original)
    return key


def _preview(
    attempt: Attempt, *, idempotency_key: str, policy_version: str, credential_scope: list[str]
) -> dict[str, Any]:
    """What an approval of ``attempt``'s call records and sends, under the given key and
    authority: the one shape of a preview, and what its fingerprint covers."""
    critical = Tool.objects.filter(name=attempt.tool_name, critical=True).exists()
    return {
        "tenant": attempt.tenant_id,
        "tool_name": attempt.tool_name,
        "task_id": attempt.task_id,
        "idempotency_key": idempotency_key,
        "args": attempt.args,
        "args_hash": attempt.args_hash,
        "policy_version": policy_version,
        "credential_scope": credential_scope,
        "critical": critical,
        "approvals_needed": Tool(critical=critical).approvals_needed,
    }


def linked_preview(original: Attempt) -> dict[str, Any]:
    """Exactly what a linked attempt for ``original`` would record and send, under today's
    authority: shown to a reviewer before approval."""
    try:
        auth = authority.linked_authority(original)
    except authority.NotGranted as exc:
        raise NotGranted(str(exc), code=exc.code) from None
    return _preview(
        original,
        idempotency_key=_next_link_key(original),
        policy_version=auth.policy_version,
        credential_scope=auth.scopes,
    )


def recorded_preview(attempt: Attempt) -> dict[str, Any]:
    """What approving a prepared linked attempt sends: the attempt as it was recorded (its own
    key and authority), in ``linked_preview``'s shape."""
    return _preview(
        attempt,
        idempotency_key=attempt.idempotency_key,
        policy_version=attempt.policy_version,
        credential_scope=attempt.credential_scope,
    )


def linked_fields(original: Attempt, preview: dict[str, Any]) -> dict[str, Any]:
    """What a linked attempt takes from its original (tenant, task, tool, arguments) and from
    ``linked_preview`` (its key and today's authority)."""
    return {
        "tenant_id": original.tenant_id,
        "task_id": original.task_id,
        "tool_name": original.tool_name,
        "idempotency_key": preview["idempotency_key"],
        "args": original.args,
        "args_hash": original.args_hash,
        "policy_version": preview["policy_version"],
        "credential_scope": preview["credential_scope"],
        "parent": original,
        # A held call's linked attempt stays under its approval policy: its claim needs the
        # policy's approvals of its own (protocol section 11).
        "approval_policy_id": original.approval_policy_id,
    }


def create_linked_attempt(
    original: Attempt, *, actor: Actor, reason: str, review_reason: str = "authority_changed"
) -> Attempt:
    """Supersede ``original`` (INTENT_RECORDED or UNKNOWN) by a linked attempt under today's
    authority that waits in MANUAL_REVIEW for a reviewer's approval. One transaction."""
    with write_transaction():
        current = _reload(original)
        if current.state not in (State.INTENT_RECORDED, State.UNKNOWN):
            raise StateConflict(
                f"a linked attempt supersedes INTENT_RECORDED or UNKNOWN, not {current.state}",
                attempt=current,
            )
        if current.version != original.version:
            raise StateConflict("attempt changed concurrently", code="concurrent_change")
        preview = linked_preview(current)
        child = states.create(
            state=State.MANUAL_REVIEW,
            actor=actor,
            reason=reason,
            **linked_fields(current, preview),
            awaiting_approval=True,
            review_reason=review_reason,
        )
        states.move(
            current,
            State.RECONCILED,
            actor=actor,
            reason=reason,
            details={"linked_attempt_id": child.attempt_id},
        )
        original.__dict__.update(current.__dict__)
        return child
