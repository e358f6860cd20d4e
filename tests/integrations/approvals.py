"""What the adapters' approval tests need from the ledger's side: a policy that holds a tool's
calls, and a person's decisions through the ledger's own review functions (approve, reject,
edit-and-approve: the original RECONCILED, a linked attempt with the corrected arguments)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connection
from django.utils import timezone

from attempts import ledger, review
from attempts.actors import Actor
from attempts.models import ApprovalPolicy, Attempt, State


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
    """The dashboard's edit-and-approve (``review.edit_and_approve``). Returns the linked
    attempt: INTENT_RECORDED when the editor's approval is enough, else AWAITING_APPROVAL."""
    try:
        return review.edit_and_approve(attempt_id, user=user, args=args)
    finally:
        connection.close()


def expire_waits(days: float = 2) -> int:
    """The worker's expiry pass as if ``days`` from now: how many waits it expired."""
    later = timezone.now() + dt.timedelta(days=days)
    try:
        return ledger.expire_waits(actor=Actor.worker("test"), now=later)
    finally:
        connection.close()


def assert_only_the_correction_was_sent(linked: Attempt, original: Attempt) -> None:
    """After edit-and-approve: the linked attempt was sent once and confirmed, the original
    never."""
    linked.refresh_from_db()
    assert (linked.state, linked.send_count) == (State.OUTCOME_CONFIRMED, 1)
    assert Attempt.objects.get(pk=original.pk).send_count == 0
