"""What the adapters' approval tests need from the ledger's side: a policy that holds a tool's
calls, a person's decision through the ledger's own review functions, and edit-and-approve as
the protocol describes it (section 3: AWAITING_APPROVAL -> RECONCILED, a linked attempt with the
corrected arguments, same tenant, tool and scope, approved by the editor).

``edit_and_approve`` stands in for the dashboard's edit-and-approve until it lands, built only
from the ledger's own pieces (``linked_preview``, ``linked_fields``, ``states``, ``Approval``) so
that what the clients follow is the real link: ``Attempt.parent`` and the API's
``linked_attempt_id``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from attempts import review, states
from attempts.canonical import normalize_args
from attempts.ledger import linked_fields, linked_preview
from attempts.locking import write_transaction
from attempts.models import Approval, ApprovalPolicy, Attempt, State
from attempts.states import Actor


def hold(tool: str, condition: str = "", approvals_needed: int = 1) -> ApprovalPolicy:
    """An active approval policy that holds ``tool``'s calls matching ``condition``."""
    return ApprovalPolicy.objects.create(
        name=f"hold-{tool}",
        tool_id=tool,
        condition=condition,
        approvals_needed=approvals_needed,
    )


def held(key: str) -> Attempt:
    return Attempt.objects.get(idempotency_key=key)


def approve(attempt_id: str, user: Any) -> Attempt:
    try:
        return review.approve_held(attempt_id, user=user)
    finally:
        connection.close()  # the live server's threads see the commit at once


def reject(attempt_id: str, user: Any, reason: str = "not now") -> Attempt:
    try:
        return review.reject_held(attempt_id, user=user, reason=reason)
    finally:
        connection.close()


def edit_and_approve(attempt_id: str, user: Any, args: dict[str, Any]) -> Attempt:
    """The original (AWAITING_APPROVAL) becomes RECONCILED; a linked attempt carries ``args``,
    approved by ``user``: INTENT_RECORDED when that approval is enough (``Approval.verdict``: the
    policy's count, and never fewer than the tool's four-eyes rule), else still AWAITING_APPROVAL
    for a second person. Returns the linked attempt."""
    normalized = normalize_args(args)
    try:
        with write_transaction():
            original = Attempt.objects.select_for_update().get(attempt_id=attempt_id)
            assert original.state == State.AWAITING_APPROVAL, original.state
            policy = ApprovalPolicy.objects.get(pk=original.approval_policy_id)
            fields = linked_fields(original, linked_preview(original))
            fields.update(args=normalized.value, args_hash=normalized.args_hash)
            fields.pop("approval_policy_id")
            fields["approval_policy"] = policy
            now = timezone.now()
            child = states.create(
                state=State.AWAITING_APPROVAL,
                actor=Actor.user(user),
                reason="edited and approved",
                details={"edited_from": original.attempt_id},
                **fields,
                now=now,
            )
            Approval.objects.create(
                attempt=child,
                approver=user,
                args_hash=child.args_hash,
                policy=policy,
                policy_version=policy.version,
                created_at=now,
                expires_at=now + policy.approval_ttl,
            )
            if Approval.verdict(child, now).enough:
                grace = dt.timedelta(seconds=settings.LEDGER["APPROVAL_GRACE"])
                child = states.move(
                    child,
                    State.INTENT_RECORDED,
                    actor=Actor.user(user),
                    action="attempt.approved",
                    next_check_at=now + grace,
                    now=now,
                )
            states.move(
                original,
                State.RECONCILED,
                actor=Actor.user(user),
                action="attempt.edit_approved",
                details={"linked_attempt_id": child.attempt_id},
                now=now,
            )
            return child
    finally:
        connection.close()
