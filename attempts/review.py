"""What people decide: assign, take, note, acknowledge an SLA breach, mark outcomes, approve or
reject linked attempts (four eyes for critical tools), approve or reject intents an approval
policy held before dispatch (``approve_held``, ``reject_held``).

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
from attempts.ledger import (
    InvalidIntent,
    NotAllowed,
    StateConflict,
    _refreshes_caller,
    _reload,
    _text,
    linked_fields,
    linked_preview,
)
from attempts.locking import write_transaction
from attempts.models import (
    APPROVAL_ACTION,
    ATTENTION_STATES,
    Approval,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Role,
    SlaEscalation,
    State,
    has_role,
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
        current = _reload(attempt)
        require_role(user, current, Role.OPERATOR)
        new_id = owner.pk if owner is not None else None
        if current.owner_id == new_id:
            return current
        check_seen(current, _seen(expected_version, seen), user=user)
        if owner is not None and not owners.may_own(owner, current.tenant_id):
            raise NotAllowed(owners.why_not(owner, current.tenant_id))
        if owner is None and current.state == State.MANUAL_REVIEW:
            raise StateConflict("an attempt in MANUAL_REVIEW must always have an owner")
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
        current = _reload(attempt)
        require_role(user, current, Role.OPERATOR)
        states.move(current, None, action="attempt.note", actor=Actor.user(user), reason=text)
        return current.events.order_by("-id").first()


def acknowledge_sla(attempt: Attempt | str, *, user: Any, comment: str = "") -> SlaEscalation:
    """Acknowledge that an attempt is past its SLA: it stops escalating, and its owner stays
    who it was (acknowledging is not taking). Operators and above."""
    comment = (comment or "").strip()
    if len(comment) > MAX_COMMENT:
        raise InvalidIntent(f"a comment is at most {MAX_COMMENT} characters")
    with write_transaction():
        current = _reload(attempt)
        require_role(user, current, Role.OPERATOR)
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
        current = _reload(attempt)
        require_role(user, current, Role.REVIEWER)
        if current.state == State.OUTCOME_CONFIRMED and current.result_ref == result_ref:
            return current
        check_seen(current, _seen(expected_version, seen), user=user)
        if current.state not in (State.MANUAL_REVIEW, State.UNKNOWN) or current.awaiting_approval:
            raise StateConflict(f"cannot confirm an attempt in {current.state}", attempt=current)
        return states.move(
            current,
            State.OUTCOME_CONFIRMED,
            actor=Actor.user(user),
            action="attempt.review_confirmed",
            reason=evidence,
            fields={"result_ref": result_ref},
        )


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
        current = _reload(attempt)
        require_role(user, current, Role.REVIEWER)
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
    """Record one reviewer's approval; returns (enough approvals now, approvals needed)."""
    require_role(user, current, Role.REVIEWER)
    needed = current.approvals_needed()
    approved_by = current.approvers_since_last_move()
    if user.get_username() in approved_by:
        raise StateConflict(
            "you already approved this; a second, different reviewer must approve it",
            code="needs_second_reviewer",
            attempt=current,
        )
    if len(approved_by) + 1 < needed:
        states.move(
            current,
            None,
            action=APPROVAL_ACTION,
            actor=Actor.user(user),
            reason=comment,
            details={"kind": kind, "approvals": len(approved_by) + 1, "needed": needed},
        )
        return False, needed
    return True, needed


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
        current = _reload(attempt)
        require_role(user, current, Role.REVIEWER)
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
        child = states.create(
            state=State.INTENT_RECORDED,
            actor=Actor.user(user),
            reason="linked retry approved" + (f": {comment}" if comment else ""),
            details={"approvals_needed": needed},
            **linked_fields(current, preview),
            next_check_at=now,
            now=now,
        )
        states.move(
            current,
            State.RECONCILED,
            actor=Actor.user(user),
            action="attempt.linked_retry_approved",
            reason=comment,
            details={"linked_attempt_id": child.attempt_id},
        )
        return child


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
        current = _reload(attempt)
        require_role(user, current, Role.REVIEWER)
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


def _may_decide(user: Any, current: Attempt, policy: ApprovalPolicy) -> None:
    """The policy's approvers only; never whoever recorded the intent."""
    allowed, why = policy.may_approve(user, current.tenant_id)
    if not allowed:
        raise NotAllowed(why)
    recorded_by = current.events.order_by("id").values_list("actor", flat=True).first()
    if recorded_by == user.get_username():
        raise NotAllowed("whoever recorded an intent cannot approve or reject it")


@_refreshes_caller
def approve_held(
    attempt: Attempt | str,
    *,
    user: Any,
    comment: str = "",
    seen: Seen | None = None,
) -> Attempt:
    """One approver approves an attempt waiting in AWAITING_APPROVAL: the approval is bound to
    its args_hash and its policy's version and expires after the policy's ``approval_ttl``.
    With enough valid approvals from distinct people (``Approval.verdict``) the attempt moves
    to INTENT_RECORDED in the same transaction, and the agent may claim it; past
    ``LEDGERWEB_APPROVAL_GRACE`` seconds unclaimed the reconcile worker sends it."""
    comment = _comment(comment)
    with write_transaction():
        current, policy = _held(attempt)
        _may_decide(user, current, policy)
        now = timezone.now()
        verdict = Approval.verdict(current, now)
        if current.state != State.AWAITING_APPROVAL:
            if current.state == State.INTENT_RECORDED and user.get_username() in verdict.valid:
                return current  # the same approval again: nothing new
            raise StateConflict(
                f"this attempt is {current.state}, not waiting for approval", attempt=current
            )
        check_seen(current, seen)
        if user.get_username() in verdict.valid:
            raise StateConflict(
                "you already approved this; a different person must give the next approval",
                code="needs_second_reviewer",
                attempt=current,
            )
        Approval.objects.create(
            attempt=current,
            approver=user,
            args_hash=current.args_hash,
            policy=policy,
            policy_version=policy.version,
            comment=comment,
            created_at=now,
            expires_at=now + policy.approval_ttl,
        )
        count = len(verdict.valid) + 1
        states.move(
            current,
            None,
            action=APPROVAL_ACTION,
            actor=Actor.user(user),
            reason=comment,
            details={
                "kind": "held",
                "args_hash": current.args_hash,
                "policy": policy.name,
                "policy_version": policy.version,
                "expires_at": (now + policy.approval_ttl).isoformat(),
                "approvals": count,
                "needed": verdict.needed,
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
        check_seen(current, seen)
        if current.state != State.AWAITING_APPROVAL:
            raise StateConflict(
                f"this attempt is {current.state}, not waiting for approval", attempt=current
            )
        return states.move(
            current,
            State.FAILED,
            actor=Actor.user(user),
            action="attempt.approval_rejected",
            reason=reason,
            fields={"review_reason": "approval_rejected"},
            next_check_at=None,
        )
