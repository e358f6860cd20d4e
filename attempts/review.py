"""What people decide: assign, take, note, acknowledge an SLA breach, mark outcomes, approve or
reject linked attempts (four eyes for critical tools), approve or reject intents an approval
policy held before dispatch (``approve_held``, ``reject_held``, many at once with
``decide_held_many``), and correct a held intent's arguments (``edit_and_approve``).

Every function checks the person's role in the attempt's tenant (``attempts.models.has_role``,
read fresh), then what the person's form saw (``Seen``): background work that changes nothing a
person decides on (a lookup that stays UNKNOWN, a lease claim, a note) does not refuse the
action; a move, an owner change or another approval since the form was rendered does, with the
list of those changes so the page can show them. All writes go through ``attempts.states``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from attempts import authority, owners, states
from attempts.canonical import CanonicalArgs, InvalidArguments, normalize_args
from attempts.ledger import (
    EFFECT_CLAIMED,
    InvalidIntent,
    LedgerError,
    NotAllowed,
    StateConflict,
    _refreshes_caller,
    _reload,
    _text,
)
from attempts.linked import linked_fields, linked_preview
from attempts.locking import write_transaction
from attempts.models import (
    APPROVAL_ACTION,
    ATTENTION_STATES,
    OWNED_STATES,
    Approval,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Role,
    SlaEscalation,
    State,
    has_role,
    new_attempt_id,
)
from attempts.states import Actor

MAX_NOTE = 5000
MAX_COMMENT = 2000


@dataclass(frozen=True)
class Seen:
    """What a person's form showed: the attempt's ``version`` and the id of its newest event.

    Without ``event_id`` any change of version refuses the action (the strict, old behaviour
    API clients that only send a version get)."""

    version: int
    event_id: int | None = None
    # A held attempt's form also says which arguments and which policy version it showed.
    args_hash: str | None = None
    policy_version: int | None = None


class StaleForm(StateConflict):
    """The attempt changed, since the form was rendered, in a way the person decided on."""

    code = "concurrent_change"

    def __init__(self, attempt: Attempt, changes: list[AttemptEvent], *, user: Any = None) -> None:
        me = user.get_username() if user is not None else None
        recent = changes[-5:]
        what = "; ".join(describe_change(e, viewer=me) for e in recent)
        if recent and me is not None and all(e.actor == me for e in recent):
            opening = "you changed this attempt in another window or tab"
        else:
            opening = "someone else changed this attempt while you were looking at it"
        if attempt.is_terminal:
            closing = f". It is {attempt.state} now: nothing is left to decide"
        else:
            closing = ". Check what changed, then submit again"
        super().__init__(
            opening + (f": {what}" if what else "") + closing,
            code=self.code,
            attempt=attempt,
        )
        self.changes = changes


def describe_change(event: AttemptEvent, *, viewer: str | None = None) -> str:
    """One line a person can read: who did what (``you`` for the person reading it)."""
    if event.from_state != event.to_state:
        what = f"moved it {event.from_state or '(new)'} → {event.to_state}"
    elif event.action == APPROVAL_ACTION:
        what = "approved it"
    elif event.action == "attempt.owner_changed":
        what = "changed its owner"
    elif event.action == "attempt.unassigned":
        what = "unassigned it"
    else:
        what = event.action.removeprefix("attempt.").replace("_", " ")
    who = "you" if viewer is not None and event.actor == viewer else event.actor
    return f"{who} {what}"


def _seen(expected_version: int | None, seen: Seen | None) -> Seen | None:
    if seen is not None:
        return seen
    return Seen(expected_version) if expected_version is not None else None


def check_seen(current: Attempt, seen: Seen | None, *, user: Any = None) -> None:
    """Refuse (``StaleForm``) when what the form saw is out of date in a way that matters;
    ``user`` is who submitted it (their own changes are told as theirs)."""
    if seen is None or current.version == seen.version:
        return
    changes = current.decisive_changes_since(seen.event_id) if seen.event_id is not None else []
    if seen.event_id is not None and not changes:
        return
    raise StaleForm(current, changes, user=user)


def require_role(user: Any, attempt: Attempt, minimum: str) -> None:
    """Refuse (``NotAllowed``) unless ``user`` holds ``minimum`` in the attempt's tenant now."""
    if not has_role(user, attempt.tenant_id, minimum, fresh=True):
        raise NotAllowed(f"this needs the {minimum} role in tenant {attempt.tenant_id}")


def _reload_for(attempt: Attempt | str, user: Any, minimum: str) -> Attempt:
    """The attempt as it is now, inside the caller's write transaction, for ``user``: refused
    (``NotAllowed``) unless they hold ``minimum`` in its tenant."""
    current = _reload(attempt)
    require_role(user, current, minimum)
    return current


@_refreshes_caller
def assign(
    attempt: Attempt | str,
    *,
    user: Any,
    owner: Any | None,
    expected_version: int | None = None,
    seen: Seen | None = None,
) -> Attempt:
    """Give the attempt to ``owner`` (None: unassign). Operators and above; the new owner must
    be an operator or above in the tenant."""
    with write_transaction():
        current = _reload_for(attempt, user, Role.OPERATOR)
        new_id = owner.pk if owner is not None else None
        if current.owner_id == new_id:
            return current
        check_seen(current, _seen(expected_version, seen), user=user)
        if owner is not None and not owners.may_own(owner, current.tenant_id):
            raise NotAllowed(owners.why_not(owner, current.tenant_id))
        if owner is None and current.state in OWNED_STATES:
            raise StateConflict(
                f"an attempt in {current.state} always has an owner: give it to someone else"
            )
        return states.move(
            current,
            None,
            actor=Actor.user(user),
            action="attempt.owner_changed" if owner is not None else "attempt.unassigned",
            fields={"owner_id": new_id},
            details={"previous_owner_id": current.owner_id, "owner_id": new_id},
        )


def add_note(attempt: Attempt | str, *, user: Any, text: str) -> AttemptEvent:
    """A note in the attempt's history. Operators and above."""
    text = _text("note", text)
    if len(text) > MAX_NOTE:
        raise InvalidIntent(f"a note is at most {MAX_NOTE} characters")
    with write_transaction():
        current = _reload_for(attempt, user, Role.OPERATOR)
        states.move(current, None, action="attempt.note", actor=Actor.user(user), reason=text)
        return current.events.order_by("-id").first()


def acknowledge_sla(attempt: Attempt | str, *, user: Any, comment: str = "") -> SlaEscalation:
    """Acknowledge that an attempt is past its SLA: it stops escalating, and its owner stays
    who it was (acknowledging is not taking). Operators and above."""
    comment = (comment or "").strip()
    if len(comment) > MAX_COMMENT:
        raise InvalidIntent(f"a comment is at most {MAX_COMMENT} characters")
    with write_transaction():
        current = _reload_for(attempt, user, Role.OPERATOR)
        if current.state not in ATTENTION_STATES:
            raise StateConflict(f"an SLA applies to UNKNOWN and MANUAL_REVIEW, not {current.state}")
        row, _ = SlaEscalation.objects.get_or_create(attempt=current, state=current.state)
        if row.acknowledged_by_id is not None:
            return row
        row.acknowledged_by = user
        row.acknowledged_at = timezone.now()
        row.save(update_fields=["acknowledged_by", "acknowledged_at"])
        states.move(
            current,
            None,
            action="attempt.sla_acknowledged",
            actor=Actor.user(user),
            reason=comment,
        )
        return row


@_refreshes_caller
def review_confirm(
    attempt: Attempt | str,
    *,
    user: Any,
    result_ref: str,
    evidence: str,
    expected_version: int | None = None,
    seen: Seen | None = None,
) -> Attempt:
    """A reviewer confirms the effect happened, with evidence (MANUAL_REVIEW or UNKNOWN)."""
    result_ref = _text("result_ref", result_ref)
    evidence = _text("evidence", evidence)
    with write_transaction():
        current = _reload_for(attempt, user, Role.REVIEWER)
        if current.state == State.OUTCOME_CONFIRMED and current.result_ref == result_ref:
            return current
        check_seen(current, _seen(expected_version, seen), user=user)
        if current.state not in (State.MANUAL_REVIEW, State.UNKNOWN) or current.awaiting_approval:
            raise StateConflict(f"cannot confirm an attempt in {current.state}", attempt=current)
        try:
            return states.move(
                current,
                State.OUTCOME_CONFIRMED,
                actor=Actor.user(user),
                action="attempt.review_confirmed",
                reason=evidence,
                fields={"result_ref": result_ref},
                receipt="" if current.provider_request_id else result_ref,
            )
        except states.EffectClaimed as claim:
            # One provider effect confirms one attempt, whoever confirms (invariant 12).
            raise StateConflict(
                f"{claim}: confirm it with evidence of its own effect, or mark it failed",
                code=EFFECT_CLAIMED,
                attempt=current,
            ) from None


@_refreshes_caller
def review_fail(
    attempt: Attempt | str,
    *,
    user: Any,
    reason: str,
    expected_version: int | None = None,
    seen: Seen | None = None,
) -> Attempt:
    """A reviewer declares the effect not done (or rejects a linked attempt), with a reason."""
    reason = _text("reason", reason)
    with write_transaction():
        current = _reload_for(attempt, user, Role.REVIEWER)
        if current.state == State.FAILED and _failed_with(current, reason):
            return current  # the same decision repeated: success, nothing new written
        check_seen(current, _seen(expected_version, seen), user=user)
        if current.state not in (State.MANUAL_REVIEW, State.UNKNOWN):
            raise StateConflict(f"cannot fail an attempt in {current.state}", attempt=current)
        return states.move(
            current,
            State.FAILED,
            actor=Actor.user(user),
            action="attempt.review_failed",
            reason=reason,
            fields={"awaiting_approval": False},
        )


def _failed_with(attempt: Attempt, reason: str) -> bool:
    """Whether the move into FAILED recorded this reason (a repeat of the same decision).
    A different reason is another person's decision that lost the race: not a repeat."""
    recorded = (
        attempt.events.filter(to_state=State.FAILED)
        .exclude(from_state=State.FAILED)
        .order_by("-id")
        .values_list("reason", flat=True)
        .first()
    )
    return recorded == reason


def _approve(current: Attempt, user: Any, kind: str, comment: str) -> tuple[bool, int]:
    """Record one reviewer's approval of an attempt in review, as an ``attempt.approval``
    event of its chain (the last one too: the move that follows is checked against these
    events by ``states``); returns (enough approvals now, approvals needed)."""
    require_role(user, current, Role.REVIEWER)
    if recorded_it(user, current):
        raise NotAllowed(RECORDER_REFUSED)
    verdict = current.approval_verdict()
    if user.get_username() in verdict.valid:
        raise StateConflict(
            "you already approved this; a second, different reviewer must approve it",
            code="needs_second_reviewer",
            attempt=current,
        )
    count = len(verdict.valid) + 1
    _approval_event(
        current,
        user,
        comment,
        {"kind": kind, "approvals": count, "approvals_needed": verdict.needed},
    )
    return count >= verdict.needed, verdict.needed


def _approval_event(
    current: Attempt, user: Any, comment: str, details: dict[str, Any], now: Any = None
) -> Attempt:
    """The ``attempt.approval`` event of one person's approval (linked attempts and held
    intents alike): a field-only move, so it counts towards the attempt's next move."""
    return states.move(
        current,
        None,
        action=APPROVAL_ACTION,
        actor=Actor.user(user),
        reason=comment,
        details=details,
        now=now,
    )


def _comment(comment: str) -> str:
    comment = (comment or "").strip()
    if len(comment) > MAX_COMMENT:
        raise InvalidIntent(f"a comment is at most {MAX_COMMENT} characters")
    return comment


def approve_linked_retry(
    attempt: Attempt | str,
    *,
    user: Any,
    expected_version: int | None = None,
    seen: Seen | None = None,
    comment: str = "",
) -> Attempt | None:
    """A reviewer approves a linked retry of an attempt in MANUAL_REVIEW: the original becomes
    RECONCILED and the new attempt is recorded (INTENT_RECORDED, due now) in the same
    transaction. Critical tools need two distinct reviewers: the first approval is recorded and
    None is returned."""
    comment = _comment(comment)
    with write_transaction():
        current = _reload_for(attempt, user, Role.REVIEWER)
        check_seen(current, _seen(expected_version, seen), user=user)
        if current.state != State.MANUAL_REVIEW or current.awaiting_approval:
            raise StateConflict(
                f"a linked retry is approved from MANUAL_REVIEW, not {current.state}",
                attempt=current,
            )
        enough, needed = _approve(current, user, "linked_retry", comment)
        if not enough:
            return None
        preview = linked_preview(current)
        now = timezone.now()
        return _continue_in_linked(
            current,
            user,
            action="attempt.linked_retry_approved",
            comment=comment,
            state=State.INTENT_RECORDED,
            reason="linked retry approved" + (f": {comment}" if comment else ""),
            details={"approvals_needed": needed},
            fields={**linked_fields(current, preview), "next_check_at": now},
            now=now,
        )


def _continue_in_linked(
    current: Attempt,
    user: Any,
    *,
    action: str,
    comment: str,
    state: str,
    reason: str,
    details: dict[str, Any],
    fields: dict[str, Any],
    now: dt.datetime,
    link_details: dict[str, Any] | None = None,
) -> Attempt:
    """A person's decision that ``current`` continues in a linked attempt: ``current`` moves
    to RECONCILED pointing to it and the linked attempt is created (in ``state``, with
    ``fields``), inside the caller's write transaction. Returns the linked attempt.

    The move comes first: its compare-and-set locks the original's row, so of two people
    deciding at once the second waits, loses the compare-and-set and is told so, rather than
    racing the first for the linked attempt's key."""
    linked_id = new_attempt_id()
    states.move(
        current,
        State.RECONCILED,
        actor=Actor.user(user),
        action=action,
        reason=comment,
        details={"linked_attempt_id": linked_id, **(link_details or {})},
        now=now,
    )
    return states.create(
        state=state,
        actor=Actor.user(user),
        reason=reason,
        details=details,
        now=now,
        attempt_id=linked_id,
        **fields,
    )


@_refreshes_caller
def approve_linked_attempt(
    attempt: Attempt | str,
    *,
    user: Any,
    expected_version: int | None = None,
    seen: Seen | None = None,
    comment: str = "",
) -> Attempt:
    """A reviewer approves a linked attempt that waits in MANUAL_REVIEW: it becomes
    INTENT_RECORDED, due now, and recovery sends it. Critical tools need two reviewers (the
    attempt stays put after the first approval)."""
    comment = _comment(comment)
    with write_transaction():
        current = _reload_for(attempt, user, Role.REVIEWER)
        check_seen(current, _seen(expected_version, seen), user=user)
        if current.state != State.MANUAL_REVIEW or not current.awaiting_approval:
            raise StateConflict("this attempt is not waiting for approval", attempt=current)
        holds, why = authority.authority_holds(current)
        if not holds:
            raise StateConflict(
                f"authority changed again since this linked attempt was prepared: {why}",
                code="authority_changed",
                attempt=current,
            )
        enough, _ = _approve(current, user, "linked_attempt", comment)
        if not enough:
            return current
        return states.move(
            current,
            State.INTENT_RECORDED,
            actor=Actor.user(user),
            action="attempt.approved",
            reason=comment,
            fields={"awaiting_approval": False, "review_reason": ""},
            next_check_at=timezone.now(),
        )


# ---------------------------------------------------------------------------------------------
# Approval before dispatch (protocol section 11): attempts an approval policy held


def _held(attempt: Attempt | str) -> tuple[Attempt, ApprovalPolicy]:
    current = _reload(attempt)
    if current.approval_policy_id is None:
        raise StateConflict("no approval policy holds this attempt", attempt=current)
    return current, ApprovalPolicy.objects.get(pk=current.approval_policy_id)


def _recorded_by(current: Attempt) -> str | None:
    """Who recorded the intent: the attempt's own column, or for an attempt older than it
    (migration 0014 filled it for every attempt an approval check reads), its first event."""
    if current.recorded_by is not None:
        return current.recorded_by
    return current.events.order_by("id").values_list("actor", flat=True).first()


RECORDER_REFUSED = (
    "whoever recorded an intent (or issued the agent token that recorded it) cannot approve, "
    "reject or correct it"
)


def recorded_it(user: Any, attempt: Attempt) -> bool:
    """Whether ``user`` is one of the attempt's recorders (``Attempt.recorders``: the recorder,
    and for an agent token whoever issued it). Held intents and attempts in review alike."""
    return user.get_username() in attempt.recorders()


def may_decide_held(
    user: Any, attempt: Attempt, policy: ApprovalPolicy, *, fresh: bool = True
) -> tuple[bool, str]:
    """Whether ``user`` may approve, reject or correct this held attempt, and why not: the
    policy's approvers only (read fresh, or as ``read_people`` read them for this request),
    never whoever recorded the intent nor whoever issued the token that recorded it
    (``recorded_it``), nor whoever made this attempt (an editor's correction needs another
    person)."""
    allowed, why = policy.may_approve(user, attempt.tenant_id, fresh=fresh)
    if not allowed:
        return False, why
    if recorded_it(user, attempt) or _recorded_by(attempt) == user.get_username():
        return False, RECORDER_REFUSED
    return True, ""


def _may_decide(user: Any, current: Attempt, policy: ApprovalPolicy) -> None:
    allowed, why = may_decide_held(user, current, policy)
    if not allowed:
        raise NotAllowed(why)


def _check_held_form(current: Attempt, policy: ApprovalPolicy, seen: Seen | None, user: Any):
    """The attempt still waits for approval, and what its form showed still holds: the
    attempt (``check_seen``), its arguments and its policy's version (a new version voids
    approvals given under the old one, so a person must look at the policy again)."""
    if current.state != State.AWAITING_APPROVAL:
        raise StateConflict(
            f"this attempt is {current.state}, not waiting for approval", attempt=current
        )
    check_seen(current, seen, user=user)
    if seen is None:
        return
    if seen.args_hash is not None and seen.args_hash != current.args_hash:
        raise StateConflict(
            "the form was for other arguments than this attempt's; reload the page",
            code="args_changed",
            attempt=current,
        )
    if seen.policy_version is not None and seen.policy_version != policy.version:
        raise StateConflict(
            f"approval policy {policy.name} changed (version {seen.policy_version} → "
            f"{policy.version}) since the page was rendered; look at it again, then decide",
            code="policy_changed",
            attempt=current,
        )


def _record_held_approval(
    current: Attempt,
    policy: ApprovalPolicy,
    user: Any,
    comment: str,
    *,
    now: dt.datetime,
    kind: str = "held",
) -> Attempt:
    """One person's approval of a held attempt, inside the caller's write transaction: its
    ``attempt.approval`` event, bound to the args_hash and the policy's version and expiring
    after the policy's ``approval_ttl`` (with an ``Approval`` row indexing it); with enough
    valid approvals (``Attempt.approval_verdicts``, read from the events) the attempt moves to
    INTENT_RECORDED, and past ``LEDGERWEB_APPROVAL_GRACE`` seconds unclaimed the reconcile
    worker sends it."""
    verdict = current.approval_verdict(now)
    if user.get_username() in verdict.valid:
        raise StateConflict(
            "you already approved this; a different person must give the next approval",
            code="needs_second_reviewer",
            attempt=current,
        )
    expires = Approval.index(current, user, policy, now).expires_at
    count = len(verdict.valid) + 1
    _approval_event(
        current,
        user,
        comment,
        {
            "kind": kind,
            "args_hash": current.args_hash,
            "policy": policy.name,
            "policy_version": policy.version,
            "valid_until": expires.isoformat(),
            "approvals": count,
            "approvals_needed": verdict.needed,
        },
        now=now,
    )
    if count < verdict.needed:
        return current
    grace = dt.timedelta(seconds=settings.LEDGER["APPROVAL_GRACE"])
    return states.move(
        current,
        State.INTENT_RECORDED,
        actor=Actor.user(user),
        action="attempt.approved",
        reason=comment,
        details={"approvals": count, "needed": verdict.needed},
        next_check_at=now + grace,
        now=now,
    )


@_refreshes_caller
def approve_held(
    attempt: Attempt | str,
    *,
    user: Any,
    comment: str = "",
    seen: Seen | None = None,
) -> Attempt:
    """One approver approves an attempt waiting in AWAITING_APPROVAL (``_record_held_approval``):
    with enough valid approvals from distinct people it moves to INTENT_RECORDED in the same
    transaction, and the agent may claim it. Approving again what one approved already, once
    it was released, changes nothing."""
    comment = _comment(comment)
    with write_transaction():
        current, policy = _held(attempt)
        _may_decide(user, current, policy)
        now = timezone.now()
        if current.state != State.AWAITING_APPROVAL:
            verdict = current.approval_verdict(now)
            if current.state == State.INTENT_RECORDED and user.get_username() in verdict.valid:
                return current  # the same approval again: nothing new
            raise StateConflict(
                f"this attempt is {current.state}, not waiting for approval", attempt=current
            )
        _check_held_form(current, policy, seen, user)
        return _record_held_approval(current, policy, user, comment, now=now)


@_refreshes_caller
def reject_held(
    attempt: Attempt | str,
    *,
    user: Any,
    reason: str,
    seen: Seen | None = None,
) -> Attempt:
    """One approver rejects an attempt waiting in AWAITING_APPROVAL: FAILED with the reason;
    the agent sees it and must not send. Repeating the same rejection changes nothing."""
    reason = _text("reason", reason)
    with write_transaction():
        current, policy = _held(attempt)
        _may_decide(user, current, policy)
        if current.state == State.FAILED and _failed_with(current, reason):
            return current
        _check_held_form(current, policy, seen, user)
        return states.move(
            current,
            State.FAILED,
            actor=Actor.user(user),
            action="attempt.approval_rejected",
            reason=reason,
            fields={"review_reason": "approval_rejected"},
            next_check_at=None,
        )


def corrected_args(original: Attempt, args: Any) -> CanonicalArgs:
    """The arguments a person typed to replace a held attempt's, normalized and hashed as an
    agent's are (``canonical.normalize_args``: a JSON object, the size limit, RFC 8785).
    Tools declare no argument schema, so that is the whole check. InvalidIntent says why not."""
    try:
        normalized = normalize_args(args)
    except InvalidArguments as exc:
        raise InvalidIntent(str(exc), code=exc.code) from None
    if normalized.args_hash == original.args_hash:
        raise InvalidIntent(
            "the corrected arguments are the same as the original's: approve it instead",
            code="args_unchanged",
        )
    return normalized


def _policy_for_corrected(
    current: Attempt, policy: ApprovalPolicy, args: dict[str, Any]
) -> tuple[ApprovalPolicy, dict[str, Any]]:
    """The policy the linked attempt waits under: the original's, or the one that would hold
    the corrected arguments if it needs more approvals (a correction never gets past a
    stricter policy), with what its condition saw."""
    found = ApprovalPolicy.objects.holding(
        tenant=current.tenant_id, tool_name=current.tool_name, args=args
    )
    tool = current.tool_name
    if found is not None and found[0].approvals_for(tool) > policy.approvals_for(tool):
        return found
    _, decided = policy.condition_program().evaluate(
        args, tenant=current.tenant_id, tool_name=current.tool_name
    )
    return policy, decided


def _edit_authority(current: Attempt) -> dict[str, Any]:
    """``linked_preview`` of a held attempt to be corrected: its key and today's authority,
    which must be the original's exactly (a correction changes the arguments only)."""
    holds, why = authority.authority_holds(current)
    if not holds:
        raise StateConflict(
            f"authority changed since the intent was recorded: {why}; reject it instead",
            code="authority_changed",
            attempt=current,
        )
    preview = linked_preview(current)
    # Never wider, and here never different: authority holds, so today's grant covers the
    # original's scopes and policy version exactly.
    if (preview["credential_scope"], preview["policy_version"]) != (
        sorted(current.credential_scope),
        current.policy_version,
    ):
        raise StateConflict(
            "the linked attempt's authority would differ from the original's",
            code="authority_changed",
            attempt=current,
        )
    return preview


def edit_preview(attempt: Attempt, *, args: Any) -> dict[str, Any]:
    """Exactly what ``edit_and_approve`` with these arguments would record, read only: the
    linked attempt's key, authority and normalized arguments, the policy it would wait under
    and how many approvals that needs (the editor's is one). InvalidIntent for arguments that
    cannot be recorded; NotGranted when no grant would allow a linked attempt."""
    normalized = corrected_args(attempt, args)
    preview = _edit_authority(attempt)
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    linked_policy, decided = _policy_for_corrected(attempt, policy, normalized.value)
    return {
        **preview,
        "args": normalized.value,
        "args_hash": normalized.args_hash,
        "policy": linked_policy,
        "condition": decided,
        "approvals_needed": linked_policy.approvals_for(attempt.tool_name),
    }


def _edited_child(current: Attempt, user: Any, args_hash: str) -> Attempt | None:
    """The linked attempt this person's edit-and-approve of ``current`` with these arguments
    already made (a repeated confirmation), if any."""
    child = Attempt.objects.filter(parent_id=current.pk, args_hash=args_hash).first()
    if child is not None and _recorded_by(child) == user.get_username():
        return child
    return None


@_refreshes_caller
def edit_and_approve(
    attempt: Attempt | str,
    *,
    user: Any,
    args: Any,
    comment: str = "",
    seen: Seen | None = None,
    previewed_args_hash: str | None = None,
) -> Attempt:
    """An approver corrects a held attempt's arguments (protocol section 11). Nothing is
    edited: in one transaction a linked attempt with the corrected arguments is recorded (same
    tenant, task, tool, credential scope and policy version, a key derived from the original's,
    ``parent`` the original) in AWAITING_APPROVAL, the editor's approval of it is recorded, and
    the original becomes RECONCILED pointing to it. A policy needing more than one approval
    still needs another person (never the editor) on the linked attempt. Returns the linked
    attempt; confirming the same correction again returns it and writes nothing."""
    comment = _comment(comment)
    with write_transaction():
        current, policy = _held(attempt)
        _may_decide(user, current, policy)
        normalized = corrected_args(current, args)
        if previewed_args_hash is not None and previewed_args_hash != normalized.args_hash:
            raise StateConflict(
                "the arguments differ from the ones whose differences you were shown; "
                "preview them again",
                code="preview_changed",
                attempt=current,
            )
        if current.state == State.RECONCILED:
            child = _edited_child(current, user, normalized.args_hash)
            if child is not None:
                return child
        _check_held_form(current, policy, seen, user)
        preview = _edit_authority(current)
        linked_policy, decided = _policy_for_corrected(current, policy, normalized.value)
        allowed, why = linked_policy.may_approve(user, current.tenant_id)
        if not allowed:
            raise NotAllowed(
                f"the corrected arguments fall under approval policy {linked_policy.name}: {why}"
            )
        now = timezone.now()
        fields = linked_fields(current, preview)
        del fields["approval_policy_id"]
        fields.update(args=normalized.value, args_hash=normalized.args_hash)
        child = _continue_in_linked(
            current,
            user,
            action="attempt.edited_and_approved",
            comment=comment,
            state=State.AWAITING_APPROVAL,
            reason=f"edit-and-approve of {current.attempt_id}"
            + (f": {comment}" if comment else ""),
            details={
                "edited_from": current.attempt_id,
                "original_args_hash": current.args_hash,
                "approval": {
                    "policy": linked_policy.name,
                    "policy_version": linked_policy.version,
                    "condition": linked_policy.condition,
                    "approvals_needed": linked_policy.approvals_for(current.tool_name),
                    "wait_until": (now + linked_policy.max_wait).isoformat(),
                    **decided,
                },
                "hold": linked_policy.hold_record(current.tool_name),
            },
            fields={
                **fields,
                "approval_policy": linked_policy,
                "next_check_at": now + linked_policy.max_wait,
            },
            now=now,
            link_details={"args_hash": normalized.args_hash, "policy": linked_policy.name},
        )
        _record_held_approval(child, linked_policy, user, comment, now=now, kind="edit_and_approve")
        if isinstance(attempt, Attempt):
            attempt.__dict__.update({k: v for k, v in current.__dict__.items() if k != "_state"})
        return child


@dataclass(frozen=True)
class HeldDecision:
    """What one item of a bulk decision came to: ``outcome`` is approved (released),
    recorded (one approval of several), rejected or refused, with a sentence saying so."""

    attempt_id: str
    outcome: str
    message: str
    state: str = ""


MAX_BULK = 100


def decide_held_many(
    picks: list[tuple[str, Seen]],
    *,
    user: Any,
    decision: str,
    comment: str,
) -> list[HeldDecision]:
    """Approve (``decision`` "approve", ``comment`` optional) or reject ("reject", ``comment``
    the reason) several held attempts, each in its own transaction and checked on its own as
    a single decision is (role and group, four eyes, not the recorder, state, what the form
    showed: version, arguments, policy version), so one refusal leaves the others done and no
    item half-applied. Attempts outside the person's tenants are "not found"."""
    if decision not in ("approve", "reject"):
        raise InvalidIntent("decide approve or reject")
    if not picks:
        raise InvalidIntent("select at least one held attempt")
    if len(picks) > MAX_BULK:
        raise InvalidIntent(f"at most {MAX_BULK} attempts at once")
    if decision == "reject":
        comment = _text("reason", comment)
    else:
        comment = _comment(comment)
    visible = set(
        Attempt.objects.visible_to(user)
        .filter(attempt_id__in=[attempt_id for attempt_id, _ in picks])
        .values_list("attempt_id", flat=True)
    )
    results = []
    for attempt_id, seen in picks:
        if attempt_id not in visible:
            results.append(HeldDecision(attempt_id, "refused", "not found"))
            continue
        try:
            if decision == "reject":
                after = reject_held(attempt_id, user=user, reason=comment, seen=seen)
                results.append(
                    HeldDecision(attempt_id, "rejected", "FAILED, it will not be sent", after.state)
                )
            else:
                after = approve_held(attempt_id, user=user, comment=comment, seen=seen)
                if after.state == State.INTENT_RECORDED:
                    results.append(
                        HeldDecision(
                            attempt_id,
                            "approved",
                            "enough approvals, it may be sent now",
                            after.state,
                        )
                    )
                else:
                    verdict = after.approval_verdict()
                    results.append(
                        HeldDecision(
                            attempt_id,
                            "recorded",
                            f"{len(verdict.valid)} of {verdict.needed} approvals; "
                            "another person must approve too",
                            after.state,
                        )
                    )
        except LedgerError as exc:
            results.append(HeldDecision(attempt_id, "refused", exc.message))
        except states.TransitionError as exc:  # raced past the retries: nothing was written
            results.append(HeldDecision(attempt_id, "refused", str(exc)))
    return results
