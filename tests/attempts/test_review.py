"""People acting on the ledger: roles, ownership, reviewer outcomes, linked attempts (never wider
authority, same tenant) and four eyes for critical effects."""

import pytest

from attempts import ledger, linked, review
from attempts.locking import write_transaction
from attempts.models import Attempt, Grant, State
from attempts.states import Actor, move
from tests.conftest import agent_intent


def manual_review(world, tool="open_ticket", key="ticket:acme:1"):
    attempt, _ = agent_intent(world, key, tool=tool, args={"title": "Printer on fire"}, task="t-1")
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    with write_transaction():
        move(attempt, State.MANUAL_REVIEW, actor=Actor.worker("w1"), fields={"review_reason": "x"})
    return attempt


@pytest.mark.parametrize("name", ["viewer", "outsider"])
def test_operator_actions_need_the_operator_role_in_that_tenant(world, name):
    attempt = manual_review(world)
    with pytest.raises(ledger.NotAllowed):
        review.assign(attempt, user=getattr(world, name), owner=getattr(world, name))
    with pytest.raises(ledger.NotAllowed):
        review.add_note(attempt, user=getattr(world, name), text="hello")


def test_take_assign_and_note_are_recorded_with_the_person(world):
    attempt = manual_review(world)
    review.assign(attempt, user=world.operator, owner=world.operator)
    review.add_note(attempt, user=world.operator, text="calling the provider")
    events = list(attempt.events.order_by("id").values_list("action", "actor"))
    assert events[-2:] == [
        ("attempt.owner_changed", "operator"),
        ("attempt.note", "operator"),
    ]
    assert Attempt.objects.get(pk=attempt.pk).owner == world.operator


def test_owner_must_belong_to_the_tenant_and_review_work_keeps_an_owner(world):
    attempt = manual_review(world)
    with pytest.raises(ledger.NotAllowed):
        review.assign(attempt, user=world.operator, owner=world.outsider)
    with pytest.raises(ledger.StateConflict):
        review.assign(attempt, user=world.operator, owner=None)


def test_operators_cannot_mark_outcomes(world):
    attempt = manual_review(world)
    with pytest.raises(ledger.NotAllowed):
        review.review_confirm(attempt, user=world.operator, result_ref="T-1", evidence="seen")


def test_reviewer_confirms_with_evidence(world):
    attempt = manual_review(world)
    with pytest.raises(ledger.InvalidIntent):
        review.review_confirm(attempt, user=world.reviewer, result_ref="T-1", evidence=" ")
    review.review_confirm(attempt, user=world.reviewer, result_ref="T-1", evidence="ticket seen")
    stored = Attempt.objects.get(pk=attempt.pk)
    assert (stored.state, stored.result_ref) == (State.OUTCOME_CONFIRMED, "T-1")
    last = stored.events.last()
    assert (last.actor, last.reason) == ("reviewer", "ticket seen")


def test_stale_form_loses_to_a_concurrent_reviewer(world):
    attempt = manual_review(world)
    seen_version = attempt.version
    review.review_fail(
        attempt, user=world.reviewer, reason="not done", expected_version=seen_version
    )
    with pytest.raises(ledger.StateConflict) as exc:
        review.review_confirm(
            attempt,
            user=world.reviewer2,
            result_ref="T",
            evidence="e",
            expected_version=seen_version,
        )
    assert exc.value.code == "concurrent_change"
    assert Attempt.objects.get(pk=attempt.pk).state == State.FAILED


def test_linked_retry_of_a_non_critical_effect_needs_one_reviewer(world):
    attempt = manual_review(world)
    child = review.approve_linked_retry(attempt, user=world.reviewer)
    original = Attempt.objects.get(pk=attempt.pk)
    assert original.state == State.RECONCILED
    assert child.parent_id == original.pk and child.state == State.INTENT_RECORDED
    assert child.idempotency_key == "ticket:acme:1~r1"
    assert child.args_hash == original.args_hash and child.tenant_id == "acme"
    assert original.events.last().details["linked_attempt_id"] == child.attempt_id


def test_linked_retry_of_a_critical_effect_needs_two_distinct_reviewers(world):
    attempt = manual_review(world, tool="charge_card", key="charge:acme:9")
    assert review.approve_linked_retry(attempt, user=world.reviewer) is None
    assert Attempt.objects.get(pk=attempt.pk).state == State.MANUAL_REVIEW
    with pytest.raises(ledger.StateConflict) as exc:
        review.approve_linked_retry(attempt, user=world.reviewer)
    assert exc.value.code == "needs_second_reviewer"
    child = review.approve_linked_retry(attempt, user=world.reviewer2)
    assert child is not None and child.state == State.INTENT_RECORDED
    assert Attempt.objects.get(pk=attempt.pk).state == State.RECONCILED


def test_linked_attempts_never_widen_authority(world):
    attempt, _ = ledger.record_intent(
        tenant="acme",
        task_id="t",
        tool_name="update_crm",
        idempotency_key="crm:1",
        args={"a": 1},
        actor=world.agent,
        credential_scope=["update_crm:write"],
    )
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    Grant.objects.filter(tenant="acme", tool="update_crm").update(
        policy_version="v2", allowed_scopes=["update_crm:read", "update_crm:admin"]
    )
    child = linked.create_linked_attempt(attempt, actor=Actor.worker("w"), reason="policy v2")
    assert child.state == State.MANUAL_REVIEW and child.awaiting_approval
    assert child.tenant_id == "acme"
    assert child.policy_version == "v2"
    assert child.credential_scope == []  # neither the original's write nor the grant's admin
    assert child.owner == world.triage
    assert Attempt.objects.get(pk=attempt.pk).state == State.RECONCILED
    approved = review.approve_linked_attempt(child, user=world.reviewer)
    assert approved.state == State.INTENT_RECORDED and not approved.awaiting_approval


def test_a_revoked_grant_blocks_linked_attempts(world):
    attempt = manual_review(world)
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(active=False)
    with pytest.raises(ledger.NotGranted):
        review.approve_linked_retry(attempt, user=world.reviewer)
    assert Attempt.objects.get(pk=attempt.pk).state == State.MANUAL_REVIEW
    assert Attempt.objects.count() == 1


def test_each_link_of_a_lineage_gets_the_next_key(world):
    attempt = manual_review(world)
    child = review.approve_linked_retry(attempt, user=world.reviewer)
    ledger.claim_dispatch(child, actor=world.agent)
    with write_transaction():
        move(child, State.MANUAL_REVIEW, actor=Actor.worker("w1"), fields={"review_reason": "x"})
    grandchild = review.approve_linked_retry(child, user=world.reviewer)
    assert grandchild.idempotency_key == "ticket:acme:1~r2"
    assert grandchild.parent_id == child.pk and child.parent_id == attempt.pk
