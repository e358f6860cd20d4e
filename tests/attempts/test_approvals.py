"""Protocol section 11: approval before dispatch. A policy's CEL condition holds an intent in
AWAITING_APPROVAL; enough valid approvals (bound to the args_hash and the policy version,
unexpired, by distinct people allowed to approve, never the recorder) release it; the claim
checks them again in its own transaction; expiry, rejection and the maximum wait end it."""

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from attempts import ledger, linked, review, states
from attempts.models import (
    Approval,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Membership,
    Role,
    SsoIdentity,
    State,
)
from attempts.states import Actor
from tests.conftest import PASSWORD, agent_intent, clock_ahead

S = State
LOAD = 'SELECT "attempts_approvalpolicy".'


def policy(**extra):
    values = {
        "name": "big-charges",
        "tool_id": "charge_card",
        "condition": "args.amount_cents > 100000",
        "approvals_needed": 2,
    }
    values.update(extra)
    found = ApprovalPolicy(**values)
    found.full_clean()
    found.save()
    return found


def charge(world, amount=250000, key="charge:acme:1", tenant="acme", tool="charge_card"):
    attempt, created = agent_intent(
        world,
        key,
        tool=tool,
        args={"amount_cents": amount, "currency": "eur"},
        task="t-1",
        tenant=tenant,
    )
    return attempt


def test_a_matching_policy_holds_the_intent_with_an_owner_and_what_held_it(world):
    policy()
    attempt = charge(world)
    assert attempt.state == S.AWAITING_APPROVAL
    assert attempt.approval_policy_id == "big-charges"
    assert Attempt.objects.get(pk=attempt.pk).owner_id == world.triage.pk
    first = attempt.events.get()
    assert first.to_state == S.AWAITING_APPROVAL
    held = first.details["approval"]
    assert held["policy"] == "big-charges" and held["policy_version"] == 1
    assert held["values"] == {"amount_cents": 250000}
    assert held["approvals_needed"] == 2
    # The same key and arguments again: the same held attempt.
    again, created = agent_intent(
        world,
        "charge:acme:1",
        tool="charge_card",
        args={"amount_cents": 250000, "currency": "eur"},
        task="t-1",
    )
    assert (again.pk, created) == (attempt.pk, False)


def test_no_match_records_as_before(world):
    policy()
    assert charge(world, amount=500).state == S.INTENT_RECORDED
    assert charge(world, key="crm", tool="update_crm").state == S.INTENT_RECORDED
    policy(name="globex-only", tenants=["globex"], condition="")
    assert charge(world, key="charge:acme:2", amount=99).state == S.INTENT_RECORDED
    assert charge(world, key="charge:globex:1", tenant="globex", amount=1).state == (
        S.AWAITING_APPROVAL
    )


def test_an_inactive_policy_holds_nothing(world):
    policy(active=False)
    assert charge(world).state == S.INTENT_RECORDED


def test_a_condition_that_cannot_be_evaluated_holds_the_call(world):
    policy(condition="args.missing_field > 3")
    attempt = charge(world)
    assert attempt.state == S.AWAITING_APPROVAL
    assert "error" in attempt.events.get().details["approval"]
    policy(
        name="not-a-bool", condition="args.amount_cents", tool_id="update_crm", approvals_needed=1
    )
    assert charge(world, key="crm", tool="update_crm").state == S.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("field", "values", "message"),
    [
        ("condition", {"condition": "args.amount_cents >"}, "not valid CEL"),
        ("condition", {"condition": "request.size > 3"}, "may use args"),
        ("approvals_needed", {"approvals_needed": 1}, "critical"),
        ("approver_role", {"approver_role": Role.VIEWER}, "viewer cannot approve"),
        ("approval_ttl", {"approval_ttl": dt.timedelta(0)}, "positive"),
    ],
)
def test_a_bad_policy_is_refused_at_configuration_time(world, field, values, message):
    with pytest.raises(ValidationError) as exc:
        policy(**values)
    assert message in " ".join(exc.value.message_dict[field])
    assert not ApprovalPolicy.objects.exists()


def test_nothing_claims_a_held_attempt(world):
    policy()
    attempt = charge(world)
    attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert not claimed and attempt.state == S.AWAITING_APPROVAL
    with pytest.raises(states.IllegalMove):
        states.move(attempt, S.DISPATCHED, actor=Actor.system())


def test_four_eyes_one_person_counts_once_then_the_agent_claims(world):
    policy()
    attempt = charge(world)
    review.approve_held(attempt, user=world.reviewer, comment="known customer")
    assert attempt.state == S.AWAITING_APPROVAL
    with pytest.raises(ledger.StateConflict) as exc:
        review.approve_held(attempt, user=world.reviewer)
    assert exc.value.code == "needs_second_reviewer"
    review.approve_held(attempt, user=world.reviewer2)
    assert attempt.state == S.INTENT_RECORDED
    rows = list(Approval.objects.filter(attempt=attempt).order_by("id"))
    assert [r.approver.username for r in rows] == ["reviewer", "reviewer2"]
    assert rows[0].args_hash == attempt.args_hash and rows[0].policy_version == 1
    # The comment lives in the approval's event (its reason), the one record that counts.
    first = attempt.events.filter(action="attempt.approval").order_by("id").first()
    assert (first.actor, first.reason) == ("reviewer", "known customer")
    assert rows[0].expires_at == rows[0].created_at + dt.timedelta(hours=1)
    attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed and attempt.state == S.DISPATCHED


@pytest.mark.parametrize("name", ["viewer", "operator", "outsider"])
def test_only_the_policys_role_may_approve_or_reject(world, name):
    policy()
    attempt = charge(world)
    with pytest.raises(ledger.NotAllowed):
        review.approve_held(attempt, user=getattr(world, name))
    with pytest.raises(ledger.NotAllowed):
        review.reject_held(attempt, user=getattr(world, name), reason="no")
    assert not Approval.objects.exists()
    assert Attempt.objects.get(pk=attempt.pk).state == S.AWAITING_APPROVAL


def test_an_operator_role_policy_lets_operators_approve(world):
    policy(
        name="small",
        tool_id="update_crm",
        condition="",
        approvals_needed=1,
        approver_role=Role.OPERATOR,
    )
    attempt = charge(world, key="crm", tool="update_crm")
    review.approve_held(attempt, user=world.operator)
    assert attempt.state == S.INTENT_RECORDED


def test_the_recorder_never_approves(world):
    policy(tool_id="update_crm", approvals_needed=1)
    person = User.objects.create_user("test-agent", password=PASSWORD)
    Membership.objects.create(user=person, tenant=world.acme, role=Role.ADMIN)
    attempt = charge(world, key="crm", tool="update_crm")
    with pytest.raises(ledger.NotAllowed):
        review.approve_held(attempt, user=person)


def test_a_named_group_must_also_hold(world):
    policy(approver_group="payments-approvers")
    attempt = charge(world)
    with pytest.raises(ledger.NotAllowed):
        review.approve_held(attempt, user=world.reviewer)
    SsoIdentity.objects.create(
        user=world.reviewer, subject="s1", last_login_groups=["payments-approvers"]
    )
    review.approve_held(attempt, user=world.reviewer)
    assert Approval.objects.count() == 1


def test_an_approval_that_expires_before_the_claim_is_void_and_the_attempt_waits_again(world):
    policy(approvals_needed=2, approval_ttl=dt.timedelta(minutes=5))
    attempt = charge(world)
    review.approve_held(attempt, user=world.reviewer)
    with clock_ahead(4 * 60):
        review.approve_held(attempt, user=world.reviewer2)
    assert attempt.state == S.INTENT_RECORDED
    # Six minutes on, reviewer's approval (for five) has expired; reviewer2's still counts.
    with clock_ahead(6 * 60):
        attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
        assert not claimed and attempt.state == S.AWAITING_APPROVAL
        void = attempt.events.get(action="attempt.approval_void")
        assert void.details["void"] == ["reviewer"] and void.details["valid"] == ["reviewer2"]
        # The wait goes on to the policy's deadline, and one fresh approval is enough again.
        assert attempt.next_check_at == attempt.created_at + dt.timedelta(hours=24)
        review.approve_held(attempt, user=world.reviewer)
        attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
        assert claimed


def test_a_new_policy_version_voids_earlier_approvals(world):
    found = policy(approvals_needed=2)
    attempt = charge(world)
    review.approve_held(attempt, user=world.reviewer)
    found.approvals_needed = 3
    found.save()
    assert found.version == 2
    review.approve_held(attempt, user=world.reviewer2)
    assert attempt.state == S.AWAITING_APPROVAL  # one of three valid: reviewer's was for v1
    review.approve_held(attempt, user=world.reviewer)
    review.approve_held(attempt, user=world.admin)
    assert attempt.state == S.INTENT_RECORDED


def test_a_deactivated_approver_no_longer_counts_at_the_claim(world):
    policy(approvals_needed=2)
    attempt = charge(world)
    review.approve_held(attempt, user=world.reviewer)
    review.approve_held(attempt, user=world.reviewer2)
    Membership.objects.filter(user=world.reviewer2).update(role=Role.OPERATOR)
    _, claimed = ledger.claim_dispatch(attempt.attempt_id, actor=world.agent)
    assert not claimed
    assert Attempt.objects.get(pk=attempt.pk).state == S.AWAITING_APPROVAL


def test_rejection_is_failed_with_the_reason_and_repeats_harmlessly(world):
    policy()
    attempt = charge(world)
    review.reject_held(attempt, user=world.reviewer, reason="customer disputed")
    assert attempt.state == S.FAILED and attempt.review_reason == "approval_rejected"
    events = AttemptEvent.objects.count()
    review.reject_held(attempt, user=world.reviewer, reason="customer disputed")
    assert AttemptEvent.objects.count() == events
    with pytest.raises(ledger.StateConflict):
        review.approve_held(attempt, user=world.reviewer2)
    _, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert not claimed


def test_the_maximum_wait_ends_in_failed_approval_expired(world):
    policy(max_wait=dt.timedelta(minutes=10))
    attempt = charge(world)
    waiting = charge(world, key="charge:acme:2")
    assert ledger.expire_waits(actor=Actor.worker("w1")) == 0
    later = timezone.now() + dt.timedelta(minutes=11)
    Attempt.objects.filter(pk=waiting.pk).update(next_check_at=later + dt.timedelta(hours=1))
    assert ledger.expire_waits(actor=Actor.worker("w1"), now=later) == 1
    attempt.refresh_from_db()
    assert attempt.state == S.FAILED and attempt.review_reason == "approval_expired"
    assert attempt.events.last().action == "attempt.approval_expired"
    assert Attempt.objects.get(pk=waiting.pk).state == S.AWAITING_APPROVAL


def test_an_unheld_claim_reads_no_approvals(world):
    policy()
    attempt = charge(world, amount=5)
    with CaptureQueriesContext(connection) as queries:
        ledger.claim_dispatch(attempt, actor=world.agent)
    assert attempt.state == S.DISPATCHED
    assert not [q for q in queries.captured_queries if "approval" in q["sql"].lower()]


def test_an_intent_no_policy_could_hold_reads_no_policies(world):
    """The write path's grant read says whether the tool has an active policy at all; only
    then are policies loaded and their conditions evaluated."""
    policy()
    with CaptureQueriesContext(connection) as queries:
        assert charge(world, key="crm", tool="update_crm").state == S.INTENT_RECORDED
    loads = [q for q in queries.captured_queries if q["sql"].startswith(LOAD)]
    assert loads == []
    with CaptureQueriesContext(connection) as queries:
        assert charge(world).state == S.AWAITING_APPROVAL
    loads = [q for q in queries.captured_queries if q["sql"].startswith(LOAD)]
    assert len(loads) == 1


def test_notices_tell_the_people_the_policy_lets_approve(world, settings):
    from attempts import notify
    from attempts.models import NoticeKind, Notification

    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": ""}
    notify.enqueue_from_events()  # start the cursor
    policy()
    attempt = charge(world)
    notify.enqueue_from_events()
    told = set(
        Notification.objects.filter(kind=NoticeKind.APPROVAL).values_list(
            "recipient__username", flat=True
        )
    )
    assert told == {"reviewer", "reviewer2", "admin"}
    notice = Notification.objects.filter(recipient=world.reviewer).get()
    assert "Approval needed before sending" in notice.subject
    assert f"/attempts/{attempt.attempt_id}/" in notice.body
    assert "€" not in notice.body  # the tool declares no amount: none is guessed
    Notification.objects.all().delete()
    review.approve_held(attempt, user=world.reviewer)
    notify.enqueue_from_events()
    told = set(Notification.objects.values_list("recipient__username", flat=True))
    assert told == {"reviewer2", "admin"}


def test_a_linked_attempt_of_a_held_call_needs_the_policys_approvals_again(world):
    """Authority changed after approval: the worker's linked attempt keeps the policy, so a
    reviewer's approval of the link alone does not let it be sent."""
    from attempts.models import Grant

    policy(tool_id="update_crm", approvals_needed=1)
    attempt = charge(world, key="crm", tool="update_crm")
    review.approve_held(attempt, user=world.reviewer)
    Grant.objects.filter(tenant_id="acme", tool_id="update_crm").update(policy_version="v2")
    child = linked.create_linked_attempt(attempt, actor=Actor.worker("w1"), reason="changed")
    assert child.approval_policy_id == "big-charges"
    review.approve_linked_attempt(child, user=world.reviewer2)
    assert child.state == S.INTENT_RECORDED
    child, claimed = ledger.claim_dispatch(child, actor=world.agent)
    assert not claimed and child.state == S.AWAITING_APPROVAL
    review.approve_held(child, user=world.reviewer2)
    _, claimed = ledger.claim_dispatch(child.attempt_id, actor=world.agent)
    assert claimed


def test_a_notice_shows_a_declared_amount_as_money(world, settings):
    from attempts import notify
    from attempts.models import Notification, Tool

    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True, "CHAT_WEBHOOK_URL": ""}
    Tool.objects.filter(name="charge_card").update(
        amount_arg="amount_cents", currency_arg="currency"
    )
    notify.enqueue_from_events()
    policy()
    charge(world, amount=115982)
    notify.enqueue_from_events()
    notice = Notification.objects.filter(recipient=world.reviewer).get()
    assert "€1,159.82" in notice.body
