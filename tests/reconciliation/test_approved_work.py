"""Protocol section 11 in the reconcile worker, against a real demo provider process: approved
work an agent does not claim within LEDGERWEB_APPROVAL_GRACE is sent by the worker, exactly once
(the claim is the same compare-and-set, and checks the approvals again); approvals that expired
first are void and the attempt waits again; the maximum wait ends in FAILED approval_expired;
held work is never sent."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from attempts import ledger, review
from attempts.models import ApprovalPolicy, Attempt, State
from reconciliation.reconciler import Reconciler
from tests.conftest import clock_ahead
from tests.reconciliation.conftest import intent, make_due

ARGS = {"n": 1, "to": "a@example.test"}


def reconcile():
    return Reconciler(worker_id="test-worker", concurrency=2).run_pass()


def held(world, key="crm:held"):
    ApprovalPolicy.objects.get_or_create(name="crm", tool_id="update_crm")
    attempt = intent(world, "update_crm", key, ARGS)
    assert attempt.state == State.AWAITING_APPROVAL
    return attempt


def test_held_work_is_never_sent_by_the_worker(wired, demo):
    attempt = held(wired)
    Attempt.objects.filter(pk=attempt.pk).update(
        next_check_at=timezone.now() + dt.timedelta(hours=1),
        updated_at=timezone.now() - dt.timedelta(hours=1),
    )
    reconcile()
    assert Attempt.objects.get(pk=attempt.pk).state == State.AWAITING_APPROVAL
    assert demo.effects(idempotency_key="crm:held") == []


def test_approved_work_the_agent_never_claims_is_sent_once_by_the_worker(wired, demo, settings):
    attempt = held(wired)
    review.approve_held(attempt, user=wired.reviewer)
    grace = attempt.next_check_at - timezone.now()
    assert dt.timedelta(seconds=25) < grace <= dt.timedelta(seconds=30)
    reconcile()  # within the grace: the agent may still claim it
    assert Attempt.objects.get(pk=attempt.pk).state == State.INTENT_RECORDED
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state in (State.DISPATCHED, State.OUTCOME_CONFIRMED)
    assert attempt.send_count == 1
    # A late agent finds it claimed and does not send.
    _, claimed = ledger.claim_dispatch(attempt.attempt_id, actor=wired.agent)
    assert not claimed
    reconcile()
    assert len(demo.effects(idempotency_key="crm:held")) == 1


def test_approvals_that_expired_before_the_worker_claims_are_void(wired, demo):
    attempt = held(wired)
    review.approve_held(attempt, user=wired.reviewer)
    make_due(attempt)
    with clock_ahead(2 * 3600):  # past the approval's hour, within the day's wait
        summary = reconcile()
    attempt.refresh_from_db()
    assert attempt.state == State.AWAITING_APPROVAL
    assert summary.outcomes["approval_void"] == 1
    assert (attempt.lease_owner, attempt.lease_until) == ("", None)
    assert attempt.events.last().action == "attempt.approval_void"
    assert demo.effects(idempotency_key="crm:held") == []


def test_the_worker_ends_a_wait_past_the_maximum(wired, demo):
    attempt = held(wired)
    make_due(attempt)
    summary = reconcile()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.review_reason) == (State.FAILED, "approval_expired")
    assert summary.outcomes["approval_expired"] == 1
    assert demo.effects(idempotency_key="crm:held") == []
