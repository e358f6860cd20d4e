"""The state machine: the table of legal moves, and the only code that writes an attempt's
``state`` or ``version``.

Every change is a compare-and-set on (attempt, expected state, version) that appends one event to
the attempt's own hash chain (``attempts.chain``) atomically with it (``attempts.rows`` writes
both); the reconciler's lease claim is a compare-and-set on the version too. One create or move
is atomic on its own; a caller whose several writes must commit together wraps them in
``attempts.locking.write_transaction()``. No lock is shared by unrelated attempts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection
from django.utils import timezone

from attempts import authority, chain, dbadapter, rows
from attempts.actors import Actor
from attempts.models import (
    ATTENTION_STATES,
    OWNED_STATES,
    ApprovalVerdict,
    Attempt,
    AttemptEvent,
    ProviderEffect,
    State,
)

S = State
LEGAL_MOVES: dict[str, frozenset[str]] = {
    # INTENT_RECORDED -> AWAITING_APPROVAL: a held attempt whose approvals became void (expired,
    # or the policy changed) before the claim waits again (protocol section 11).
    S.INTENT_RECORDED: frozenset(
        {S.DISPATCHED, S.FAILED, S.RECONCILED, S.MANUAL_REVIEW, S.AWAITING_APPROVAL}
    ),
    S.AWAITING_APPROVAL: frozenset({S.INTENT_RECORDED, S.FAILED, S.RECONCILED}),
    S.DISPATCHED: frozenset(
        {S.OUTCOME_CONFIRMED, S.FAILED_RETRYABLE, S.FAILED, S.UNKNOWN, S.MANUAL_REVIEW}
    ),
    S.FAILED_RETRYABLE: frozenset({S.DISPATCHED, S.FAILED, S.MANUAL_REVIEW}),
    S.UNKNOWN: frozenset(
        {S.OUTCOME_CONFIRMED, S.DISPATCHED, S.FAILED, S.MANUAL_REVIEW, S.RECONCILED}
    ),
    S.MANUAL_REVIEW: frozenset({S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED, S.INTENT_RECORDED}),
    S.OUTCOME_CONFIRMED: frozenset(),
    S.FAILED: frozenset(),
    S.RECONCILED: frozenset(),
}
# States a new attempt may be created in.
INITIAL_STATES = frozenset({S.INTENT_RECORDED, S.MANUAL_REVIEW, S.AWAITING_APPROVAL})
# Moves of an attempt an approval policy held that need enough valid approvals, checked in the
# same transaction as the compare-and-set: released to INTENT_RECORDED, and the claim.
APPROVED_MOVES = frozenset(
    {(S.AWAITING_APPROVAL, S.INTENT_RECORDED), (S.INTENT_RECORDED, S.DISPATCHED)}
)
# Moves of an attempt in review that a reviewer's approval makes (a linked retry approved, a
# prepared linked attempt approved): they need the tool's approvals too, from the same events.
REVIEW_APPROVED_MOVES = frozenset(
    {(S.MANUAL_REVIEW, S.RECONCILED), (S.MANUAL_REVIEW, S.INTENT_RECORDED)}
)


class TransitionError(Exception):
    """A move that cannot be made. Nothing was changed."""

    code = "illegal_move"


class IllegalMove(TransitionError):
    def __init__(self, attempt: Attempt, to_state: str) -> None:
        super().__init__(
            f"attempt {attempt.attempt_id} cannot move from {attempt.state} to {to_state}"
        )
        self.attempt = attempt
        self.to_state = to_state


class StaleAttempt(TransitionError):
    """Another process changed the attempt first (the compare-and-set found a newer version)."""

    code = "concurrent_change"

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(
            f"attempt {attempt.attempt_id} was changed by someone else "
            f"(expected {attempt.state} at version {attempt.version}); reload and retry"
        )
        self.attempt = attempt


class AuthorityChanged(TransitionError):
    """A move made only under the attempt's grant (a claim) found that the grant no longer
    covers it: revoked, at another policy version, or without a scope the attempt holds.
    Nothing was changed; ``why`` says which (``authority.authority_holds``)."""

    code = "authority_changed"

    def __init__(self, attempt: Attempt, why: str) -> None:
        super().__init__(f"attempt {attempt.attempt_id} is no longer granted: {why}")
        self.attempt = attempt
        self.why = why


class ApprovalsNotValid(TransitionError):
    """A held attempt may not move on: its valid approvals are fewer than its policy needs.
    Nothing was changed; ``verdict`` says who counts and who no longer does."""

    code = "awaiting_approval"

    def __init__(self, attempt: Attempt, verdict: ApprovalVerdict) -> None:
        super().__init__(
            f"attempt {attempt.attempt_id} has {len(verdict.valid)} valid approval(s) of the "
            f"{verdict.needed} its policy needs"
            + (f" ({', '.join(verdict.void)}: void)" if verdict.void else "")
        )
        self.attempt = attempt
        self.verdict = verdict


class TermsChanged(TransitionError):
    """A new attempt was not created because the grant terms it was built with (``create``'s
    ``terms``) are no longer the grant's; nothing was written."""


class EffectClaimed(TransitionError):
    """The move would give the attempt a provider request id that names an effect another
    attempt already claimed (protocol section 7, invariant 12: one provider effect confirms at
    most one attempt). Nothing was changed; ``claimed_by`` is the other attempt's public id.
    Whoever decided the move hands the attempt to a person (``ledger.effect_claimed``)."""

    code = "effect_claimed"

    def __init__(self, attempt: Attempt, provider_request_id: str, claimed_by: str) -> None:
        super().__init__(
            f"provider request id {provider_request_id!r} of {attempt.tool_name} is already "
            f"claimed by attempt {claimed_by}; attempt {attempt.attempt_id} cannot claim it"
        )
        self.attempt = attempt
        self.provider_request_id = provider_request_id
        self.claimed_by = claimed_by


def effect_holder(tool_name: str, provider_request_id: str) -> str | None:
    """The public id of the attempt that claimed the provider effect, or None."""
    return (
        ProviderEffect.objects.filter(tool_name=tool_name, provider_request_id=provider_request_id)
        .values_list("attempt_id", flat=True)
        .first()
    )


def receipt_effects(result_ref: str) -> tuple[str, ...]:
    """The provider effects a receipt names when an attempt is confirmed by its receipt alone
    (no provider request id): the receipt itself, and what follows its scheme
    (``receipt:<id>``, ``lookup:<id>``)."""
    _, colon, rest = result_ref.partition(":")
    return (result_ref, rest) if colon and rest else (result_ref,)


def receipt_claim(attempt: Attempt, result_ref: str) -> EffectClaimed | None:
    """Whether another attempt of ``attempt``'s tool claimed a provider effect that
    ``result_ref`` names (``receipt_effects``): the claim, or None. One indexed read; a move
    given ``receipt=`` makes the same check inside its compare-and-set instead."""
    held = (
        ProviderEffect.objects.filter(
            tool_name=attempt.tool_name, provider_request_id__in=receipt_effects(result_ref)
        )
        .exclude(attempt_id=attempt.attempt_id)
        .values_list("provider_request_id", "attempt_id")
        .first()
    )
    return EffectClaimed(attempt, *held) if held else None


def check_approvals(attempt: Attempt, now: dt.datetime) -> ApprovalVerdict:
    """The approvals of an attempt as they count at ``now`` (``Attempt.approval_verdicts``:
    the approval events of its chain, never rows beside it); ApprovalsNotValid unless enough.
    Read inside the caller's write transaction, so the move it guards commits with it."""
    _require_write_transaction()
    verdict = attempt.approval_verdict(now)
    if not verdict.enough:
        raise ApprovalsNotValid(attempt, verdict)
    return verdict


def _require_write_transaction() -> None:
    if not dbadapter.in_atomic_block(connection):
        raise RuntimeError("ledger writes must run inside locking.write_transaction()")


def default_next_check(to_state: str, now: dt.datetime) -> dt.datetime | None:
    """When recovery should look at an attempt that has just entered ``to_state``."""
    ledger = settings.LEDGER
    if to_state in (S.INTENT_RECORDED, S.DISPATCHED, S.FAILED_RETRYABLE):
        return now + dt.timedelta(seconds=ledger["STALE_AFTER"])
    if to_state == S.UNKNOWN:
        return now + dt.timedelta(seconds=ledger["BACKOFF_BASE"])
    return None


def _owner_on_attention(attempt: Attempt, to_state: str, fields: dict[str, Any]) -> None:
    """An attempt entering UNKNOWN, MANUAL_REVIEW or AWAITING_APPROVAL gets an owner then."""
    if (
        (to_state in ATTENTION_STATES or to_state in OWNED_STATES)
        and attempt.owner_id is None
        and "owner_id" not in fields
    ):
        from attempts.owners import owner_id_for

        owner_id = owner_id_for(attempt.tenant_id, attempt.tool_name)
        if owner_id is not None:
            fields["owner_id"] = owner_id


def create(
    *,
    state: str,
    actor: Actor,
    reason: str = "",
    details: dict[str, Any] | None = None,
    now: dt.datetime | None = None,
    terms: authority.GrantTerms | None = None,
    args_canonical: bytes | None = None,
    **fields: Any,
) -> Attempt:
    """Create a new attempt in an initial state with its first event. ``fields`` are the
    attempt's own (tenant_id, task_id, tool_name, ...). ``terms``: the grant terms the attempt
    was built with, which its INSERT checks still hold (TermsChanged when not).
    ``args_canonical``: the RFC 8785 bytes of ``args`` (``canonical.normalize_args``'s), which
    the first event's salted digest of the arguments is made from when given."""
    if state not in INITIAL_STATES:
        raise TransitionError(f"an attempt cannot be created in {state}")
    if state == S.AWAITING_APPROVAL and fields.get("approval_policy") is None:
        raise TransitionError("an attempt is created AWAITING_APPROVAL under an approval policy")
    now = now or timezone.now()
    fields.setdefault("next_check_at", default_next_check(state, now))
    attempt = Attempt.new(
        state=state,
        created_at=now,
        updated_at=now,
        recorded_by=actor.name,
        recorded_by_issuer=actor.issuer,
        **fields,
    )
    extra: dict[str, Any] = {}
    _owner_on_attention(attempt, state, extra)
    if "owner_id" in extra:
        attempt.owner_id = extra["owner_id"]
    record = {
        "tenant": attempt.tenant_id,
        "task_id": attempt.task_id,
        "tool_name": attempt.tool_name,
        "idempotency_key": attempt.idempotency_key,
        "args_hash": attempt.args_hash,
        "policy_version": attempt.policy_version,
        "credential_scope": attempt.credential_scope,
        "parent_attempt_id": attempt.parent.attempt_id if attempt.parent_id else None,
    }
    if not attempt.args_salt:
        # Chain format 3: the history commits to the arguments by a salted digest, so they
        # can be erased (attempts/erasure.py) and the chain still verifies.
        attempt.args_salt = chain.new_salt()
    record["args_digest"] = chain.args_digest(
        attempt.args_salt, attempt.args, canonical=args_canonical
    )
    if attempt.owner_id:
        record["owner_id"] = attempt.owner_id
    if attempt.traceparent:
        record["traceparent"] = attempt.traceparent
    if actor.issuer:
        # The token's issuer is its recorder too (invariant 13): in the chain, for the verifier.
        record["token_issuer"] = actor.issuer
    if attempt.parent_id:
        # A linked attempt's recorders are its original's (``Attempt.recorders``), not the
        # person or worker who made it: in the chain, so the verifier needs nothing else; and
        # its original's token issuer on the row, so the inbox leaves it out for them too.
        record["recorders"] = sorted(attempt.parent.recorders())
        attempt.recorded_by_issuer = attempt.recorded_by_issuer or attempt.parent.recorded_by_issuer
    event = chain.attempt_event(
        attempt,
        action="attempt.created",
        actor=actor,
        to_state=state,
        reason=reason,
        details={**record, **(details or {})},
        now=now,
    )
    attempt.chain_head, attempt.chain_length, attempt.sealed = event.hash, 1, False
    if not rows.insert_attempt(attempt, event, terms=terms):
        raise TermsChanged(f"the grant of {attempt.tool_name} for {attempt.tenant_id} changed")
    return attempt


# Fields only the state machine and the chain set.
_OWN_FIELDS = frozenset({"state", "version", "chain_head", "chain_length", "sealed"})


def move(
    attempt: Attempt,
    to_state: str | None,
    *,
    actor: Actor,
    action: str | None = None,
    reason: str = "",
    details: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    increments: dict[str, int] | None = None,
    next_check_at: dt.datetime | None | type[Ellipsis] = ...,
    now: dt.datetime | None = None,
    granted: bool = False,
    receipt: str = "",
) -> Attempt:
    """Apply one change to ``attempt`` as a compare-and-set on its (state, version), with its
    event linked into the attempt's chain.

    ``to_state`` None (or the current state) records an event and changes fields only (a note,
    an approval, an owner, a provider id). Raises IllegalMove for a move not in LEGAL_MOVES and
    StaleAttempt when another process got there first; in both cases nothing is written. On
    success ``attempt`` is updated in place.

    ``granted``: the move is made only while the attempt's grant still covers it, checked by
    the compare-and-set itself (no read before it); AuthorityChanged when it does not.
    ``receipt``: the move confirms the attempt by this receipt alone, and is made only while
    no other attempt of its tool claimed an effect the receipt names (``receipt_effects``),
    checked by the compare-and-set too; EffectClaimed when one did (invariant 12).
    """
    now = now or timezone.now()
    from_state = attempt.state
    changing_state = to_state is not None and to_state != from_state
    if changing_state and to_state not in LEGAL_MOVES[from_state]:
        raise IllegalMove(attempt, to_state)
    verdict = _approvals_needed(attempt, to_state, now) if changing_state else None
    fields = dict(fields or {})
    if _OWN_FIELDS & (fields.keys() | (increments or {}).keys()):
        raise TransitionError("state, version and the chain are set by the state machine only")
    if changing_state:
        _owner_on_attention(attempt, to_state, fields)
        if next_check_at is ...:
            next_check_at = default_next_check(to_state, now)
    event = chain.attempt_event(
        attempt,
        action=action or (f"attempt.{to_state.lower()}" if changing_state else "attempt.updated"),
        actor=actor,
        from_state=from_state,
        to_state=to_state if changing_state else from_state,
        reason=reason,
        details=_event_details(details, verdict, fields),
        now=now,
    )
    values: dict[str, Any] = {
        **fields,
        "updated_at": now,
        "chain_head": event.hash,
        "sealed": False,
    }
    if changing_state:
        values["state"] = to_state
    if next_check_at is not ...:
        values["next_check_at"] = next_check_at
    added = {**(increments or {}), "version": 1, "chain_length": 1}
    _compare_and_set(attempt, from_state, values, added, event, granted=granted, receipt=receipt)
    # Mirror the update in memory without another query (after everything that could fail).
    for name, value in values.items():
        setattr(attempt, name, value)
    for name, amount in added.items():
        setattr(attempt, name, getattr(attempt, name) + amount)
    return attempt


def _approvals_needed(attempt: Attempt, to_state: str, now: dt.datetime) -> ApprovalVerdict | None:
    """The approvals a move that needs them relies on (ApprovalsNotValid without enough), or
    None for a move that needs none."""
    from_state = attempt.state
    verdict = None
    if attempt.approval_policy_id is not None:
        if (from_state, to_state) in APPROVED_MOVES:
            verdict = check_approvals(attempt, now)
    elif to_state == S.AWAITING_APPROVAL:
        raise TransitionError("only an attempt an approval policy holds waits for approval")
    if (from_state, to_state) in REVIEW_APPROVED_MOVES:
        verdict = check_approvals(attempt, now)
    return verdict


def _event_details(
    details: dict[str, Any] | None, verdict: ApprovalVerdict | None, fields: dict[str, Any]
) -> dict[str, Any]:
    """The move's event details: the caller's, the approvals it relied on, and the fields of
    the attempt it sets that its history tracks."""
    event_details = dict(details or {})
    if verdict is not None:
        # The approvals this move relied on, in its own event.
        event_details["approvals"] = {
            "policy_version": verdict.policy_version,
            "approvers": list(verdict.valid),
            "needed": verdict.needed,
        }
        if verdict.approver_rule:
            event_details["approvals"]["approver_rule"] = verdict.approver_rule
    for name in ("owner_id", "provider_request_id", "result_ref", "review_reason"):
        if name in fields:
            event_details.setdefault(name, fields[name])
    return event_details


def _compare_and_set(
    attempt: Attempt,
    from_state: str,
    values: dict[str, Any],
    added: dict[str, int],
    event: Any,
    *,
    granted: bool,
    receipt: str,
) -> None:
    """The one write of a move: the compare-and-set on (attempt, state, version) with its
    event. Raises StaleAttempt (or AuthorityChanged, EffectClaimed) when it changed nothing."""
    # A provider request id the attempt did not hold yet claims that effect for it, in the
    # same compare-and-set (the effects' unique constraint decides between racing claims).
    claimed = values.get("provider_request_id") or ""
    effect = (
        (attempt.tool_name, claimed, attempt.attempt_id)
        if claimed and claimed != attempt.provider_request_id
        else None
    )
    try:
        done = rows.compare_and_set(
            attempt.pk,
            state=from_state,
            version=attempt.version,
            values=values,
            increments=added,
            event=event,
            granted=granted,
            effect=effect,
            unclaimed=(
                (attempt.tool_name, receipt_effects(receipt), attempt.attempt_id)
                if receipt
                else None
            ),
        )
    except IntegrityError:
        holder = effect_holder(attempt.tool_name, claimed) if effect else None
        if holder is None or holder == attempt.attempt_id:
            raise
        raise EffectClaimed(attempt, claimed, holder) from None
    if not done:
        if receipt:
            # As for the grant: a read says which condition failed, only on this path.
            claim = receipt_claim(attempt, receipt)
            if claim is not None:
                raise claim
        if granted:
            # The compare-and-set does not say which condition failed: a read does, and only
            # on this rare path.
            holds, why = authority.authority_holds(attempt)
            if not holds:
                raise AuthorityChanged(attempt, why)
        raise StaleAttempt(attempt)


def claim_lease(
    candidates: Iterable[tuple[int, int]],
    *,
    owner: str,
    until: dt.datetime,
    now: dt.datetime,
) -> list[int]:
    """Lease each candidate (pk, version) to ``owner`` until ``until`` if its lease is free and
    its version unchanged: a compare-and-set per attempt that bumps the version, the fencing
    token every later move of the lease holder compares against. Returns the pks claimed."""
    _require_write_transaction()
    candidates = list(candidates)
    leased = rows.claim_leases(candidates, owner=owner, until=until, now=now)
    return [pk for pk in dict.fromkeys(pk for pk, _ in candidates) if pk in leased]


def restore_archived(
    fields: dict[str, Any], events: Iterable[dict[str, Any]], *, owner_id: int | None
) -> Attempt:
    """Put back an attempt an archive holds, as it was: its state, version, events and chain
    unchanged, unsealed. Not a move: its history is the one written before, verified from the
    archive by the caller. Only for a restore's scratch database (``archive load``, which
    refuses a database that holds checkpoints), never the ledger."""
    attempt = Attempt.objects.create(**fields, owner_id=owner_id, sealed=False)
    AttemptEvent.objects.bulk_create(AttemptEvent(attempt=attempt, **e) for e in events)
    return attempt
