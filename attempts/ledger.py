"""The write-ahead API: everything an agent, the worker or a person does to the ledger.

Agents call it in-process or through ``attempts.api``; the dashboard and the reconciler call it
too. Each function is one short write transaction built on ``attempts.states``. The safe order of
protocol section 4 is ``run_tool_call``: record, claim, send, attach the id, confirm, and a lost
answer becomes UNKNOWN, never success and never failure.
"""

from __future__ import annotations

import functools
import logging
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from attempts import authority, states, tracing
from attempts.canonical import InvalidArguments, normalize_args
from attempts.faults import crash_point, mutation
from attempts.locking import write_transaction
from attempts.models import (
    ATTEMPT_ID,
    ApprovalPolicy,
    ArchivedAttempt,
    Attempt,
    RecordedKey,
    State,
    Tenant,
    Tool,
    key_digest,
)
from attempts.states import Actor

log = logging.getLogger("ledgerweb.ledger")

MAX_TEXT = {
    "task_id": 200,
    "tool_name": 100,
    "idempotency_key": 255,
    "tenant": 64,
    "provider_request_id": 255,
    "policy_version": 64,
}
MAX_SCOPE = 500
# How many times an agent's action is decided again on a fresh read when its compare-and-set
# lost to a concurrent change (each retry reads the row anew).
STALE_RETRIES = 3
# Free text (reasons, notes, evidence) may span lines; every other text is one line.
MULTILINE_TEXT = frozenset({"reason", "note", "evidence"})
PERSON_TEXT = frozenset({"note", "evidence"})
LINE_BREAKS = frozenset("\n\r\t")


def text_problem(value: str, *, multiline: bool = False) -> str:
    """Why ``value`` cannot be stored and carried to a provider as it is ('' when it can).

    Control characters (C0, DEL, C1) have no faithful form in an HTTP header, a CSV cell or a
    log line, and lone surrogates cannot be encoded as UTF-8 at all: both are refused at intake.
    Multi-line text may keep line breaks and tabs. Every other Unicode character is kept and
    carried faithfully (see the generic HTTP provider's key encoding).
    """
    if value.isascii() and value.isprintable():
        return ""  # printable ASCII: no control character, no surrogate (the common case)
    for position, char in enumerate(value):
        if multiline and char in LINE_BREAKS:
            continue
        category = unicodedata.category(char)
        if category == "Cc":
            return f"contains the control character U+{ord(char):04X} at position {position}"
        if category == "Cs":
            return f"contains a lone surrogate U+{ord(char):04X} at position {position}"
    return ""


def stored_text_problem(name: str, value: Any) -> str:
    """Why ``value`` cannot be stored as the field ``name`` (``provider_request_id``,
    ``result_ref``, ...) under the rules agent input is held to ('' when it can be, as it is).
    The one home of those rules, so that what a provider says is checked like what an agent
    says (reconciliation.providers.answers)."""
    try:
        kept = _text(name, value)
    except InvalidIntent as exc:
        return exc.message
    return "" if kept == value else f"{name} has surrounding spaces"


class LedgerError(Exception):
    """Base of the ledger's refusals. ``code`` is stable and shown to API clients."""

    code = "ledger_error"
    status = 409

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class InvalidIntent(LedgerError):
    code = "invalid_field"
    status = 422


class NotGranted(LedgerError):
    code = "not_granted"
    status = 403


class NotAllowed(LedgerError):
    """The person's role in this tenant does not allow the action."""

    code = "forbidden"
    status = 403


class AttemptNotFound(LedgerError):
    code = "not_found"
    status = 404


class IdempotencyConflict(LedgerError):
    code = "idempotency_conflict"
    status = 409

    def __init__(self, message: str, existing: Attempt) -> None:
        super().__init__(message)
        self.existing = existing


class StateConflict(LedgerError):
    """The attempt is not in a state that allows this (or it changed under us)."""

    code = "state_conflict"
    status = 409

    def __init__(self, message: str, *, code: str | None = None, attempt: Attempt | None = None):
        super().__init__(message, code=code)
        self.attempt = attempt


# ---------------------------------------------------------------------------------------------
# Loading


def get_attempt(attempt_id: str, *, tenants: set[str] | None = None) -> Attempt:
    """The attempt by public id, optionally only within ``tenants`` (404 for anyone else's)."""
    if not isinstance(attempt_id, str) or not ATTEMPT_ID.fullmatch(attempt_id):
        raise AttemptNotFound(f"no attempt {attempt_id!r}")
    qs = Attempt.objects.all()
    if tenants is not None:
        qs = qs.for_tenants(tenants)
    try:
        return qs.get(attempt_id=attempt_id)
    except Attempt.DoesNotExist:
        raise AttemptNotFound(f"no attempt {attempt_id!r}") from None


def _current(
    attempt: Attempt | str, tenants: set[str] | None, writable: tuple[str, ...]
) -> Attempt:
    """The attempt to act on. An Attempt in hand, in a state this action writes from, is used
    as it is: the compare-and-set in states.move proves it current (a stale copy raises
    StaleAttempt and the action is retried on a fresh one). Anything else is read fresh."""
    if isinstance(attempt, Attempt) and tenants is None and attempt.state in writable:
        return attempt
    return _reload(attempt, tenants)


def _reload(attempt: Attempt | str, tenants: set[str] | None = None) -> Attempt:
    attempt_id = attempt if isinstance(attempt, str) else attempt.attempt_id
    return get_attempt(attempt_id, tenants=tenants)


def _refreshes_caller(func):
    """Functions that take an Attempt (or its id) and return the changed attempt also update the
    caller's in-memory copy, so ``fail(attempt, ...)`` then ``attempt.state`` reads the truth."""

    @functools.wraps(func)
    def wrapper(attempt, *args, **kwargs):
        try:
            result = func(attempt, *args, **kwargs)
        except states.StaleAttempt:
            # Our copy was stale (see _current), or the row changed between our read and our
            # compare-and-set (a worker's lease claim, a concurrent attach of the same id):
            # decide again on what the database says now. Only a real conflict is refused.
            attempt_id = attempt.attempt_id if isinstance(attempt, Attempt) else attempt
            for _ in range(STALE_RETRIES - 1):
                try:
                    result = func(attempt_id, *args, **kwargs)
                    break
                except states.StaleAttempt:
                    continue
            else:
                result = func(attempt_id, *args, **kwargs)
        current = result[0] if isinstance(result, tuple) else result
        if isinstance(attempt, Attempt):
            attempt.__dict__.pop("repeated_call", None)
        if (
            isinstance(attempt, Attempt)
            and isinstance(current, Attempt)
            and current.pk == attempt.pk
            and current is not attempt
        ):
            attempt.__dict__.update({k: v for k, v in current.__dict__.items() if k != "_state"})
        return result

    return wrapper


def _repeated(attempt: Attempt) -> Attempt:
    """A call repeating a move that already happened: the attempt as it is, nothing written.
    Marked, so the API logs changes only (``attempt.repeated_call``)."""
    attempt.repeated_call = True
    return attempt


def _text(name: str, value: Any, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidIntent(f"{name} must be a string")
    # Checked before stripping: str.strip() would silently drop some control characters.
    # A person's note or evidence is kept as typed (exports escape it); only what cannot be
    # stored at all is refused there.
    if name in PERSON_TEXT:
        problem = "contains a NUL character" if "\x00" in value else ""
        if not problem and any("\ud800" <= char <= "\udfff" for char in value):
            problem = "contains a lone surrogate"
    else:
        problem = text_problem(value, multiline=name in MULTILINE_TEXT)
    if problem:
        raise InvalidIntent(f"{name} {problem}")
    # The limit counts what was sent, surrounding spaces included, as the OpenAPI document says.
    limit = MAX_TEXT.get(name, 500)
    if len(value) > limit:
        raise InvalidIntent(f"{name} is longer than {limit} characters")
    value = value.strip()
    if required and not value:
        raise InvalidIntent(f"{name} must not be empty")
    return value


# ---------------------------------------------------------------------------------------------
# The agent's path


def record_intent(
    *,
    tenant: str,
    task_id: str,
    tool_name: str,
    idempotency_key: str,
    args: Any,
    actor: Actor,
    policy_version: str | None = None,
    credential_scope: list[str] | None = None,
    traceparent: str = "",
) -> tuple[Attempt, bool]:
    """Record the intent durably before anything is sent. Returns (attempt, created).

    Same key and same args hash (and tenant and tool) returns the existing attempt, whatever its
    state; anything else under that key raises IdempotencyConflict and overwrites nothing.
    ``traceparent`` (W3C Trace Context, the agent's span) is kept on a new attempt; a malformed
    one is refused (InvalidIntent ``invalid_traceparent``); a replay keeps the first one's.
    """
    trace = None
    if traceparent:
        try:
            trace = tracing.parse_traceparent(traceparent)
        except tracing.InvalidTraceparent as exc:
            raise InvalidIntent(str(exc), code="invalid_traceparent") from None
    with tracing.span("ledger.intent", traceparent=trace.header if trace else "") as s:
        attempt, created = _record_intent(
            tenant=tenant,
            task_id=task_id,
            tool_name=tool_name,
            idempotency_key=idempotency_key,
            args=args,
            actor=actor,
            policy_version=policy_version,
            credential_scope=credential_scope,
            trace=trace,
        )
        tracing.describe(s, attempt)
        if s is not None:
            s.set_attribute("ledger.created", created)
        return attempt, created


def _record_intent(
    *,
    tenant: str,
    task_id: str,
    tool_name: str,
    idempotency_key: str,
    args: Any,
    actor: Actor,
    policy_version: str | None,
    credential_scope: list[str] | None,
    trace: tracing.TraceParent | None,
) -> tuple[Attempt, bool]:
    tenant = _text("tenant", tenant)
    task_id = _text("task_id", task_id)
    tool_name = _text("tool_name", tool_name)
    idempotency_key = _text("idempotency_key", idempotency_key)
    if policy_version is not None:
        policy_version = _text("policy_version", policy_version)
    if credential_scope is not None and (
        not isinstance(credential_scope, list)
        or not all(
            isinstance(s, str) and 0 < len(s) <= MAX_SCOPE and not text_problem(s)
            for s in credential_scope
        )
    ):
        raise InvalidIntent(
            f"credential_scope must be a list of strings of 1 to {MAX_SCOPE} characters, "
            "without control characters"
        )
    try:
        normalized = normalize_args(args)
    except InvalidArguments as exc:
        raise InvalidIntent(str(exc), code=exc.code) from None

    fields = {"actor": actor, "tenant_id": tenant, "task_id": task_id, "tool_name": tool_name}
    fields |= {"idempotency_key": idempotency_key, "args": normalized.value}
    fields |= {"args_hash": normalized.args_hash}
    if trace:
        fields |= {"traceparent": trace.header, "trace_id": trace.trace_id}
    # Built first from this process's guess of the grant's terms, which the INSERT checks; a
    # guess that no longer holds, or that would refuse the intent, is read again.
    for fresh in (False, True):
        terms, guessed = authority.intent_terms(tenant, tool_name, fresh=fresh)
        try:
            if terms is None:
                _explain_missing_grant(tenant, tool_name)
            auth = authority.authority_for_intent(
                terms, policy_version=policy_version, scopes=credential_scope
            )
        except (LedgerError, authority.NotGranted) as exc:
            if guessed:
                continue
            return _refused_intent(exc, idempotency_key, tenant, tool_name, normalized.args_hash)
        held = (
            _held_fields(tenant, tool_name, normalized.value)
            if terms.approval_policies
            else {"state": State.INTENT_RECORDED}
        )
        try:
            attempt = states.create(
                policy_version=auth.policy_version,
                credential_scope=auth.scopes,
                terms=terms if guessed else None,
                args_canonical=normalized.canonical,
                **fields,
                **held,
            )
        except states.TermsChanged:
            continue
        except IntegrityError:
            # The key is already recorded: a replay of the same intent, a race, or a
            # conflict; its attempt live or archived.
            existing = _recorded(idempotency_key)
            if existing is None:
                raise
            return _same_intent_or_conflict(
                existing, tenant, tool_name, normalized.args_hash
            ), False
        return attempt, True
    raise AssertionError("a fresh read of the grant's terms is never a guess")


def _refused_intent(
    exc: Exception, idempotency_key: str, tenant: str, tool_name: str, args_hash: str
) -> tuple[Attempt, bool]:
    """An intent the grant refuses: a replay of an intent already recorded is answered with
    it, whatever changed since; anything else is refused."""
    existing = _recorded(idempotency_key)
    if existing is not None:
        return _same_intent_or_conflict(existing, tenant, tool_name, args_hash), False
    if isinstance(exc, authority.NotGranted):
        raise NotGranted(str(exc), code=exc.code) from None
    raise exc


def _held_fields(tenant: str, tool_name: str, args: Any) -> dict[str, Any]:
    """How a new intent is created: INTENT_RECORDED, or AWAITING_APPROVAL under the approval
    policy that holds it (protocol section 11), waiting at most its ``max_wait``."""
    found = ApprovalPolicy.objects.holding(tenant=tenant, tool_name=tool_name, args=args)
    if found is None:
        return {"state": State.INTENT_RECORDED}
    policy, decided = found
    now = timezone.now()
    return {
        "state": State.AWAITING_APPROVAL,
        "approval_policy": policy,
        "next_check_at": now + policy.max_wait,
        "now": now,
        "reason": f"held by approval policy {policy.name}",
        "details": {
            "approval": {
                "policy": policy.name,
                "policy_version": policy.version,
                "condition": policy.condition,
                "approvals_needed": policy.approvals_for(tool_name),
                "wait_until": (now + policy.max_wait).isoformat(),
                **decided,
            },
            # In the clear: what the verifiers check this hold's release against.
            "hold": policy.hold_record(tool_name),
        },
    }


def _explain_missing_grant(tenant: str, tool_name: str) -> None:
    """Say precisely why there is no active grant (the error path may spend queries)."""
    if not Tool.objects.filter(name=tool_name, active=True).exists():
        # A 403 like any other missing grant: the request is well formed (docs/openapi.json).
        raise NotGranted(f"unknown tool {tool_name!r}", code="unknown_tool")
    if not Tenant.objects.filter(slug=tenant).exists():
        raise NotGranted(f"unknown tenant {tenant!r}", code="tenant_not_granted")
    raise NotGranted(
        f"tenant {tenant!r} has no active grant for {tool_name!r}", code="tool_not_granted"
    )


def _recorded(idempotency_key: str) -> Attempt | None:
    """The attempt that recorded ``idempotency_key``: the live one, else, from the permanent key
    index (``RecordedKey``), a stand-in for the archived one (``Attempt.archived`` set: its
    outcome as archived, not in the database, never claimable). None for a key never recorded.
    Read only on a replay or a conflict, never by a new intent."""
    live = Attempt.objects.filter(idempotency_key=idempotency_key).first()
    if live is not None:
        return live
    entry = RecordedKey.objects.filter(key_digest=key_digest(idempotency_key)).first()
    if entry is None:
        return None
    stand_in = Attempt(
        attempt_id=entry.attempt_id,
        tenant_id=entry.tenant_id,
        tool_name=entry.tool_name,
        idempotency_key=idempotency_key,
        args_hash=entry.args_hash,
        args=None,
        credential_scope=[],
        version=0,
    )
    archived = ArchivedAttempt.objects.select_related("archive").filter(attempt_id=entry.attempt_id)
    stand_in.archived = archived.first()
    if stand_in.archived is None:
        # Indexed, yet neither live nor archived (removed behind the ledger's back, or a
        # restore's scratch database): nothing may be recorded again under the key.
        stand_in.state = ""
        return stand_in
    stand_in.state = stand_in.archived.state
    stand_in.provider_request_id = stand_in.archived.provider_request_id
    stand_in.result_ref = stand_in.archived.result_ref or ""
    stand_in.created_at = stand_in.archived.created_at
    stand_in.updated_at = stand_in.archived.archived_at
    return stand_in


def _same_intent_or_conflict(
    existing: Attempt, tenant: str, tool_name: str, args_hash: str
) -> Attempt:
    if existing.pk is None and existing.archived is None:
        raise IdempotencyConflict(
            f"idempotency key {existing.idempotency_key!r} was recorded by attempt "
            f"{existing.attempt_id}, which is neither in the ledger nor in an archive it knows: "
            "nothing is recorded or sent under the key again",
            existing,
        )
    if existing.pk is None and not existing.args_hash:
        raise IdempotencyConflict(
            f"idempotency key {existing.idempotency_key!r} was recorded by attempt "
            f"{existing.attempt_id}, now in archive {existing.archived.archive.name}, archived "
            "before the ledger kept archived attempts' arguments hashes: a repeat cannot be "
            "proven the same call, so it is refused and nothing is sent (an operator can "
            "compare it with the archive)",
            existing,
        )
    if (existing.tenant_id, existing.tool_name, existing.args_hash) == (
        tenant,
        tool_name,
        args_hash,
    ):
        return existing
    differs = [
        name
        for name, mine, theirs in (
            ("tenant", tenant, existing.tenant_id),
            ("tool_name", tool_name, existing.tool_name),
            ("args_hash", args_hash, existing.args_hash),
        )
        if mine != theirs
    ]
    raise IdempotencyConflict(
        f"idempotency key {existing.idempotency_key!r} is already recorded with a different "
        f"{', '.join(differs)}; nothing was changed",
        existing,
    )


@_refreshes_caller
def claim_dispatch(attempt: Attempt | str, *, actor: Actor, tenants: set[str] | None = None):
    """Claim the send (INTENT_RECORDED or FAILED_RETRYABLE -> DISPATCHED), committed before any
    byte leaves. Returns (attempt, claimed); only the caller that got ``claimed`` may send.

    UNKNOWN is never claimable here: only reconciliation resends it, after a lookup. The
    stand-in of an archived attempt (``record_intent``'s answer to a key replayed after its
    attempt was archived) is never claimed.
    """
    if isinstance(attempt, Attempt) and attempt.archived is not None:
        return attempt, False
    current = _current(attempt, tenants, (State.INTENT_RECORDED, State.FAILED_RETRYABLE))
    if current.state not in (State.INTENT_RECORDED, State.FAILED_RETRYABLE):
        return current, False
    with tracing.span("ledger.claim", current) as s:
        if current.approval_policy_id is not None and current.state == State.INTENT_RECORDED:
            # Authority first, then the approvals (which may void them and wait again).
            holds, why = authority.authority_holds(current)
            if not holds:
                raise _authority_changed(current, why)
            claimed = _claim_approved(current, actor)
            tracing.describe(s, claimed)
            return claimed, current.state == State.DISPATCHED
        try:
            # The grant is checked by the claim's compare-and-set itself.
            states.move(
                current, State.DISPATCHED, actor=actor, increments={"send_count": 1}, granted=True
            )
        except states.AuthorityChanged as exc:
            raise _authority_changed(current, exc.why) from None
        tracing.describe(s, current)
    return current, True


def _authority_changed(current: Attempt, why: str) -> StateConflict:
    return StateConflict(
        f"authority changed since the intent was recorded: {why}",
        code="authority_changed",
        attempt=current,
    )


def _claim_approved(current: Attempt, actor: Actor) -> Attempt:
    """The claim of an attempt an approval policy held: in one transaction, its approvals are
    read (``states.check_approvals``) and the claim is made; approvals that no longer suffice
    are void, and the attempt waits again (``void_approvals``)."""
    with write_transaction():
        try:
            return states.move(current, State.DISPATCHED, actor=actor, increments={"send_count": 1})
        except states.ApprovalsNotValid as exc:
            return void_approvals(current, exc.verdict, actor=actor)


def void_approvals(
    current: Attempt, verdict: Any, *, actor: Actor, fields: dict[str, Any] | None = None
) -> Attempt:
    """INTENT_RECORDED -> AWAITING_APPROVAL: the approvals that released this attempt expired
    (or its policy changed) before it was claimed. An event says who no longer counts, the
    approvers are told (attempts.notify), and the wait goes on to the policy's deadline."""
    policy = ApprovalPolicy.objects.get(pk=current.approval_policy_id)
    return states.move(
        current,
        State.AWAITING_APPROVAL,
        actor=actor,
        action="attempt.approval_void",
        reason="approvals expired or no longer valid before the claim; waiting again",
        details={
            "approval": {"policy": policy.name, "policy_version": policy.version},
            "hold": policy.hold_record(current.tool_name),
            **verdict.as_dict(),
        },
        fields=fields,
        next_check_at=current.created_at + policy.max_wait,
    )


def expire_waits(*, actor: Actor, now: Any = None, limit: int = 500) -> int:
    """AWAITING_APPROVAL attempts past their policy's maximum wait become FAILED
    ``approval_expired`` (the reconcile worker sweeps them each pass). Returns how many."""
    now = now or timezone.now()
    due = Attempt.objects.filter(next_check_at__lte=now, state=State.AWAITING_APPROVAL).order_by(
        "next_check_at", "id"
    )[:limit]
    expired = 0
    for attempt in due:
        try:
            states.move(
                attempt,
                State.FAILED,
                actor=actor,
                action="attempt.approval_expired",
                reason="approval_expired: the policy's maximum wait passed without approval",
                fields={"review_reason": "approval_expired"},
                next_check_at=None,
                now=now,
            )
        except states.TransitionError:
            continue  # approved or rejected meanwhile
        expired += 1
    return expired


@_refreshes_caller
def attach_provider_request(
    attempt: Attempt | str,
    provider_request_id: str,
    *,
    actor: Actor,
    tenants: set[str] | None = None,
) -> Attempt:
    """Persist the provider's request id the moment it is known. The same id again is a no-op;
    a different one is refused."""
    provider_request_id = _text("provider_request_id", provider_request_id)
    current = _current(attempt, tenants, (State.DISPATCHED, State.UNKNOWN))
    if current.provider_request_id == provider_request_id:
        return _repeated(current)
    if current.provider_request_id:
        raise StateConflict(
            f"attempt already has provider request id {current.provider_request_id!r}",
            code="provider_request_conflict",
            attempt=current,
        )
    if current.state == State.INTENT_RECORDED:
        raise StateConflict(
            "nothing was dispatched yet: claim the dispatch before sending",
            code="not_dispatched",
            attempt=current,
        )
    if current.state not in (State.DISPATCHED, State.UNKNOWN):
        # Never sent (INTENT_RECORDED -> FAILED), settled, or with a person: an id arriving
        # now is not this attempt's send in flight.
        raise StateConflict(
            f"attempt is {current.state}: a provider request id is attached only while it "
            "is DISPATCHED or UNKNOWN",
            code="not_in_flight",
            attempt=current,
        )
    try:
        return states.move(
            current,
            None,
            actor=actor,
            action="attempt.provider_request_attached",
            fields={"provider_request_id": provider_request_id},
        )
    except states.EffectClaimed as claim:
        raise _claimed_refusal(effect_claimed(claim, actor=actor)) from None


@_refreshes_caller
def confirm(
    attempt: Attempt | str,
    *,
    result_ref: str,
    actor: Actor,
    provider_request_id: str | None = None,
    evidence: dict[str, Any] | None = None,
    tenants: set[str] | None = None,
) -> Attempt:
    """DISPATCHED or UNKNOWN -> OUTCOME_CONFIRMED with a durable result reference.

    Confirming again with the same reference is success and writes nothing. Without a
    ``provider_request_id`` (given here or attached before) the receipt ``result_ref`` is what
    identifies the effect: an agent that has the id sends it with the confirm (docs/api.md,
    "Confirm without a provider request id").
    """
    result_ref = _text("result_ref", result_ref)
    if provider_request_id is not None:
        provider_request_id = _text("provider_request_id", provider_request_id)
    current = _current(attempt, tenants, (State.DISPATCHED, State.UNKNOWN))
    if current.state == State.OUTCOME_CONFIRMED:
        if current.result_ref == result_ref and provider_request_id in (
            None,
            current.provider_request_id,
        ):
            return _repeated(current)
        raise StateConflict("attempt is already confirmed with a different result", attempt=current)
    if current.state not in (State.DISPATCHED, State.UNKNOWN):
        raise StateConflict(f"cannot confirm an attempt in {current.state}", attempt=current)
    fields: dict[str, Any] = {"result_ref": result_ref, "review_reason": ""}
    # Confirmed by its receipt alone, the receipt names the effect (docs/api.md): the move's
    # compare-and-set checks no other attempt claimed it.
    by_receipt = not provider_request_id and not current.provider_request_id
    if provider_request_id:
        if current.provider_request_id and current.provider_request_id != provider_request_id:
            raise StateConflict(
                f"attempt already has provider request id {current.provider_request_id!r}",
                code="provider_request_conflict",
                attempt=current,
            )
        fields["provider_request_id"] = provider_request_id
    with tracing.span("ledger.confirm", current) as s:
        try:
            confirmed = states.move(
                current,
                State.OUTCOME_CONFIRMED,
                actor=actor,
                fields=fields,
                details=evidence or {},
                receipt=result_ref if by_receipt else "",
            )
        except states.EffectClaimed as claim:
            raise _claimed_refusal(
                effect_claimed(claim, actor=actor, details=evidence or {})
            ) from None
        tracing.describe(s, confirmed)
    return confirmed


# The review reason, and the event on the attempt that claimed the effect first, when a second
# attempt claims a provider effect (protocol section 7, invariant 12).
EFFECT_CLAIMED = "effect_claimed"
EFFECT_CONTESTED = "attempt.effect_contested"


def effect_claimed(
    claim: states.EffectClaimed,
    *,
    actor: Actor,
    details: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    increments: dict[str, int] | None = None,
) -> Attempt:
    """The one decision when an attempt claims a provider effect another attempt already
    claimed (``states.EffectClaimed``), from wherever the claim came (the agent's confirm or
    provider-request call, the reconciler's lookup or send): the attempt goes to MANUAL_REVIEW
    (``effect_claimed``, with an owner as every attempt in review) without the provider's id,
    its event naming the other attempt, and the other attempt, if it is still in the ledger,
    gets an ``attempt.effect_contested`` event naming this one. One transaction. ``fields``
    and ``increments`` are the caller's own (the reconciler's lease and counters). Returns the
    attempt, in review."""
    attempt = claim.attempt
    effect = {
        "tool_name": attempt.tool_name,
        "provider_request_id": claim.provider_request_id,
    }
    with write_transaction():
        moved = states.move(
            attempt,
            State.MANUAL_REVIEW,
            actor=actor,
            reason=(
                f"the provider's effect {claim.provider_request_id!r} is already claimed by "
                f"attempt {claim.claimed_by}: one effect confirms one attempt, a person decides"
            ),
            details={
                **(details or {}),
                EFFECT_CLAIMED: {**effect, "claimed_by": claim.claimed_by},
            },
            fields={**(fields or {}), "review_reason": EFFECT_CLAIMED},
            increments=increments,
            next_check_at=None,
        )
        other = Attempt.objects.filter(attempt_id=claim.claimed_by).first()
        if other is not None:
            states.move(
                other,
                None,
                actor=actor,
                action=EFFECT_CONTESTED,
                reason=(
                    f"attempt {attempt.attempt_id} also claimed this attempt's provider effect "
                    f"{claim.provider_request_id!r}; it went to review"
                ),
                details={"effect_contested": {**effect, "contested_by": attempt.attempt_id}},
            )
    return moved


def _claimed_refusal(attempt: Attempt) -> StateConflict:
    return StateConflict(
        f"the provider request id is already claimed by another attempt: attempt "
        f"{attempt.attempt_id} went to MANUAL_REVIEW ({EFFECT_CLAIMED}) for a person to decide",
        code=EFFECT_CLAIMED,
        attempt=attempt,
    )


@_refreshes_caller
def fail(
    attempt: Attempt | str,
    *,
    reason: str,
    retryable: bool,
    actor: Actor,
    tenants: set[str] | None = None,
) -> Attempt:
    """The provider definitively refused: DISPATCHED -> FAILED_RETRYABLE or FAILED; an intent
    abandoned before sending -> FAILED; retries exhausted, FAILED_RETRYABLE -> FAILED."""
    reason = _text("reason", reason)
    if not isinstance(retryable, bool):
        raise InvalidIntent("retryable must be true or false")
    target = State.FAILED_RETRYABLE if retryable else State.FAILED
    current = _current(
        attempt, tenants, (State.DISPATCHED, State.INTENT_RECORDED, State.FAILED_RETRYABLE)
    )
    if current.state == target:
        return _repeated(current)
    allowed = {
        State.DISPATCHED: (State.FAILED_RETRYABLE, State.FAILED),
        State.INTENT_RECORDED: (State.FAILED,),
        State.FAILED_RETRYABLE: (State.FAILED,),
    }.get(current.state, ())
    if target not in allowed:
        raise StateConflict(
            f"cannot mark an attempt in {current.state} as {target}", attempt=current
        )
    return states.move(current, target, actor=actor, reason=reason)


@_refreshes_caller
def mark_unknown(
    attempt: Attempt | str,
    *,
    reason: str,
    actor: Actor,
    details: dict[str, Any] | None = None,
    tenants: set[str] | None = None,
) -> Attempt:
    """DISPATCHED -> UNKNOWN: a timeout or lost answer. Repeating it is a no-op."""
    reason = _text("reason", reason)
    current = _current(attempt, tenants, (State.DISPATCHED,))
    if current.state == State.UNKNOWN:
        return _repeated(current)
    if current.state != State.DISPATCHED:
        raise StateConflict(
            f"only a dispatched attempt can become UNKNOWN (this one is {current.state})",
            attempt=current,
        )
    return states.move(current, State.UNKNOWN, actor=actor, reason=reason, details=details)


# ---------------------------------------------------------------------------------------------
# The safe order around one provider call


class ProviderTimeout(Exception):
    """Raised by a send function: no answer in time. The effect may have happened."""


class ProviderLostResponse(Exception):
    """Raised by a send function: the connection broke before the answer. May have happened."""


class ProviderRefused(Exception):
    """Raised by a send function: the provider definitively did not perform the effect."""

    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a send function returns. ``result_ref`` is a durable receipt; without one the attempt
    stays DISPATCHED until reconciliation confirms it by lookup."""

    provider_request_id: str | None = None
    result_ref: str | None = None


@dataclass(frozen=True, slots=True)
class CallOutcome:
    attempt: Attempt
    sent: bool


def run_tool_call(
    *,
    tenant: str,
    task_id: str,
    tool_name: str,
    idempotency_key: str,
    args: Any,
    send: Callable[[Attempt], SendResult],
    actor: Actor,
    policy_version: str | None = None,
    credential_scope: list[str] | None = None,
) -> CallOutcome:
    """Run one side effect in the safe order of protocol section 4.

    ``send`` receives the attempt (its ``idempotency_key`` and ``args_hash`` go to the provider)
    and is called only by the process that won the claim.
    """
    attempt, _ = record_intent(
        tenant=tenant,
        task_id=task_id,
        tool_name=tool_name,
        idempotency_key=idempotency_key,
        args=args,
        actor=actor,
        policy_version=policy_version,
        credential_scope=credential_scope,
    )
    crash_point("intent_committed")
    if attempt.archived is not None:
        return CallOutcome(attempt, sent=False)  # its outcome is in an archive: never again
    if mutation("claim_after_send"):  # crashtest's self-test: the unsafe order, on purpose
        return _send_then_claim(attempt, send, actor)
    attempt, claimed = claim_dispatch(attempt, actor=actor)
    if not claimed:
        return CallOutcome(attempt, sent=False)
    crash_point("dispatch_claimed")
    try:
        result = send(attempt)
    except ProviderRefused as exc:
        return CallOutcome(
            fail(attempt, reason=str(exc) or "refused", retryable=exc.retryable, actor=actor),
            sent=True,
        )
    except (ProviderTimeout, ProviderLostResponse, TimeoutError, ConnectionError, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        return CallOutcome(mark_unknown(attempt, reason=reason, actor=actor), sent=True)
    except BaseException as exc:
        # The send may have happened: the outcome is unknown, and the error is the caller's.
        mark_unknown(attempt, reason=f"send raised {type(exc).__name__}: {exc}", actor=actor)
        raise
    crash_point("response_received")
    if result.provider_request_id:
        attempt = attach_provider_request(attempt, result.provider_request_id, actor=actor)
        crash_point("request_id_attached")
    if result.result_ref:
        attempt = confirm(attempt, result_ref=result.result_ref, actor=actor)
    return CallOutcome(attempt, sent=True)


def _send_then_claim(attempt: Attempt, send: Callable[[Attempt], SendResult], actor: Actor):
    """The ``claim_after_send`` mutation: a deliberately broken write path (send, then claim),
    only reachable with fault injection on. crashtest must catch it."""
    if attempt.state not in (State.INTENT_RECORDED, State.FAILED_RETRYABLE):
        return CallOutcome(attempt, sent=False)
    result = send(attempt)
    crash_point("response_received")
    attempt, _ = claim_dispatch(attempt, actor=actor)
    if result.provider_request_id:
        attempt = attach_provider_request(attempt, result.provider_request_id, actor=actor)
    if result.result_ref:
        attempt = confirm(attempt, result_ref=result.result_ref, actor=actor)
    return CallOutcome(attempt, sent=True)
