"""Every row of the decision table (protocol section 6), against a real demo provider process on
127.0.0.1. Each test puts an attempt where a crash would leave it, runs one reconcile pass, and
checks the ledger *and* the provider's own record of effects."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from attempts import ledger, review
from attempts.canonical import normalize_args
from attempts.models import Attempt, Grant, State, Tool
from reconciliation.reconciler import Reconciler, Summary
from tests.reconciliation.conftest import dispatched, intent, make_due, unknown

ARGS = {"n": 1, "to": "a@example.test"}


def reconcile() -> Summary:
    return Reconciler(worker_id="test-worker", concurrency=4).run_pass()


def reload(attempt: Attempt) -> Attempt:
    return Attempt.objects.get(pk=attempt.pk)


def actions(attempt: Attempt) -> list[str]:
    return list(attempt.events.values_list("action", flat=True))


def lookup_events(attempt: Attempt) -> list[dict]:
    return [e.details["lookup"] for e in attempt.events.all() if "lookup" in e.details]


def sent_count(demo, key: str) -> int:
    return demo.summary()["by_key"].get(key, 0)


# ------------------------------------------------------------------------------ found


def test_found_with_matching_hash_is_confirmed_with_provider_id(wired, demo) -> None:
    attempt = make_due(unknown(wired, "open_ticket", "t:found", ARGS))
    effect = demo.inject("open_ticket", "t:found", ARGS)

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.provider_request_id == effect["id"]
    assert attempt.result_ref == f"lookup:{effect['id']}"
    assert attempt.lookup_count == 1
    assert attempt.next_check_at is None
    assert (attempt.lease_owner, attempt.lease_until) == ("", None)
    [lookup] = lookup_events(attempt)
    assert lookup["answer"] == "found"
    assert lookup["provider_request_id"] == effect["id"]
    assert lookup["provider_args_hash"] == attempt.args_hash
    assert isinstance(lookup["latency_ms"], int)
    assert summary.outcomes["confirmed"] == 1
    assert sent_count(demo, "t:found") == 1  # nothing sent again


def test_found_with_different_hash_goes_to_review_with_an_owner(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:mismatch", ARGS))
    demo.inject("update_crm", "c:mismatch", {"n": 2, "to": "a@example.test"})

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "payload_mismatch"
    assert attempt.owner == wired.triage
    assert attempt.result_ref == ""
    assert lookup_events(attempt)[0]["provider_args_hash"] != attempt.args_hash
    assert sent_count(demo, "c:mismatch") == 1


def test_found_under_changed_authority_is_still_confirmed(wired, demo) -> None:
    """Observing is always allowed: a found effect is confirmed whatever the grant says now."""
    attempt = make_due(unknown(wired, "open_ticket", "t:obs", ARGS))
    demo.inject("open_ticket", "t:obs", ARGS)
    Grant.objects.filter(tool_id="open_ticket").update(policy_version="v2")

    reconcile()

    assert reload(attempt).state == State.OUTCOME_CONFIRMED


# ------------------------------------------------------------------------------ not found


def test_not_found_idempotent_authority_holds_is_sent_again_with_the_same_key(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:resend", ARGS))
    assert attempt.send_count == 1

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.send_count == 2
    [effect] = demo.effects(idempotency_key="c:resend")
    assert effect["ledger_attempt_id"] == attempt.attempt_id
    assert effect["ledger_args_hash"] == attempt.args_hash
    assert attempt.provider_request_id == effect["id"]
    assert [
        e.details["lookup"]["answer"] for e in attempt.events.all() if "lookup" in e.details
    ] == [
        "not_found",
        "found",
    ]
    states = list(attempt.events.values_list("from_state", "to_state"))
    assert (State.UNKNOWN, State.DISPATCHED) in states
    assert (State.DISPATCHED, State.OUTCOME_CONFIRMED) in states
    assert summary.sends == 1


def test_not_found_reconcilable_goes_to_review_and_is_not_sent(wired, demo) -> None:
    attempt = make_due(unknown(wired, "open_ticket", "t:nf", ARGS))

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "not_found"
    assert attempt.owner == wired.triage
    assert attempt.send_count == 1
    assert demo.summary()["total"] == 0


def test_not_found_critical_idempotent_is_never_resent_without_a_person(wired, demo) -> None:
    attempt = make_due(unknown(wired, "send_invoice_email", "inv:nf", ARGS))

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "not_found_critical"
    assert demo.summary()["total"] == 0


def test_manual_class_goes_to_review_without_a_lookup(wired, demo) -> None:
    attempt = make_due(unknown(wired, "deploy_service", "d:1", ARGS))
    demo.inject("deploy_service", "d:1", ARGS)  # even if it exists, manual means no lookup

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "manual_class"
    assert attempt.lookup_count == 0
    assert summary.lookups == 0


def test_not_found_idempotent_with_sends_exhausted_fails(wired, demo) -> None:
    Tool.objects.filter(name="update_crm").update(max_sends=1)
    attempt = make_due(unknown(wired, "update_crm", "c:exhausted", ARGS))

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.FAILED
    assert demo.summary()["total"] == 0


# ------------------------------------------------------------------------------ unavailable


@pytest.mark.parametrize("mode", ["error_5xx", "hang"])
def test_unavailable_or_timeout_stays_unknown_with_backoff(wired, demo, mode, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "BACKOFF_BASE": 10, "BACKOFF_CAP": 600}
    Tool.objects.update(timeout_seconds=0.4)
    attempt = make_due(unknown(wired, "update_crm", f"c:{mode}", ARGS))
    demo.inject("update_crm", f"c:{mode}", ARGS)
    demo.control(lookup_mode=mode, hang_seconds=2)
    before = timezone.now()

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.UNKNOWN
    assert attempt.lookup_count == 1
    assert before <= attempt.next_check_at <= timezone.now() + dt.timedelta(seconds=10)
    assert attempt.lease_owner == ""
    [lookup] = lookup_events(attempt)
    assert lookup["answer"] == "unavailable"
    if mode == "hang":
        assert lookup["detail"].startswith("timeout")
    else:
        assert lookup["http_status"] == 503
    assert actions(attempt)[-1] == "attempt.lookup"
    assert summary.outcomes["still_unknown"] == 1
    assert sent_count(demo, f"c:{mode}") == 1


def test_backoff_grows_with_each_failed_lookup(wired, demo, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "BACKOFF_BASE": 1, "BACKOFF_CAP": 3600}
    attempt = make_due(unknown(wired, "update_crm", "c:grow", ARGS))
    demo.control(lookup_mode="error_5xx")
    delays = []
    for _ in range(8):
        make_due(attempt)
        started = timezone.now()
        reconcile()
        delays.append((reload(attempt).next_check_at - started).total_seconds())
    assert reload(attempt).lookup_count == 8
    # Full jitter: each delay is within base * 2**n; the ceiling doubles every time.
    for n, delay in enumerate(delays):
        assert 0 <= delay <= 2**n + 1
    assert max(delays[5:]) > 2  # later ceilings are well above the first ones


def test_unavailable_past_the_maximum_age_goes_to_review(wired, demo, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "UNKNOWN_MAX_AGE": 60}
    attempt = unknown(wired, "update_crm", "c:old", ARGS)
    Attempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - dt.timedelta(seconds=61)
    )
    make_due(attempt)
    demo.control(lookup_mode="error_5xx")

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "max_age"
    assert attempt.owner == wired.triage
    assert lookup_events(attempt)[0]["answer"] == "unavailable"


# ------------------------------------------------------------------------------ authority


def test_not_found_after_authority_changed_creates_a_linked_attempt(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:auth", ARGS))
    Grant.objects.filter(tenant_id="acme", tool_id="update_crm").update(
        policy_version="v2", allowed_scopes=["update_crm:write"]
    )

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.RECONCILED
    [child] = attempt.children.all()
    assert child.state == State.MANUAL_REVIEW
    assert child.awaiting_approval
    assert child.review_reason == "authority_changed"
    assert child.tenant_id == attempt.tenant_id
    assert child.policy_version == "v2"
    assert set(child.credential_scope) <= set(attempt.credential_scope)
    assert child.credential_scope == ["update_crm:write"]
    assert child.args_hash == attempt.args_hash
    assert child.owner == wired.triage
    assert lookup_events(attempt)[0]["answer"] == "not_found"
    assert demo.summary()["total"] == 0  # never sent under the old authority
    assert summary.outcomes["linked"] == 1


def test_not_found_after_grant_revoked_goes_to_review(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:revoked", ARGS))
    Grant.objects.filter(tenant_id="acme", tool_id="update_crm").update(active=False)

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "authority_revoked"
    assert demo.summary()["total"] == 0


def test_approved_linked_attempt_is_sent_under_todays_authority(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:approve", ARGS))
    Grant.objects.filter(tenant_id="acme", tool_id="update_crm").update(policy_version="v2")
    reconcile()
    child = reload(attempt).children.get()
    review.approve_linked_attempt(child, user=wired.reviewer)

    reconcile()

    child = reload(child)
    assert child.state == State.OUTCOME_CONFIRMED
    [effect] = demo.effects()
    assert effect["idempotency_key"] == child.idempotency_key
    assert child.idempotency_key != attempt.idempotency_key


# ------------------------------------------------------------------------------ stale intents


def test_stale_intent_with_authority_unchanged_is_claimed_and_sent(wired, demo) -> None:
    attempt = make_due(intent(wired, "open_ticket", "t:stale", ARGS))

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.send_count == 1
    [effect] = demo.effects(idempotency_key="t:stale")
    assert effect["args"] == normalize_args(ARGS).value
    assert attempt.provider_request_id == effect["id"]
    moves = list(attempt.events.values_list("from_state", "to_state"))
    assert moves[1] == (State.INTENT_RECORDED, State.DISPATCHED)


def test_stale_intent_with_authority_changed_gets_a_linked_attempt(wired, demo) -> None:
    attempt = make_due(intent(wired, "open_ticket", "t:stale-auth", ARGS))
    Grant.objects.filter(tenant_id="acme", tool_id="open_ticket").update(policy_version="v3")

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.RECONCILED
    child = attempt.children.get()
    assert (child.state, child.policy_version, child.awaiting_approval) == (
        State.MANUAL_REVIEW,
        "v3",
        True,
    )
    assert demo.summary()["total"] == 0


def test_stale_intent_of_a_revoked_grant_fails_without_sending(wired, demo) -> None:
    attempt = make_due(intent(wired, "open_ticket", "t:stale-revoked", ARGS))
    Grant.objects.filter(tenant_id="acme", tool_id="open_ticket").update(active=False)

    reconcile()

    assert reload(attempt).state == State.FAILED
    assert demo.summary()["total"] == 0


def test_stale_dispatch_becomes_unknown_then_is_looked_up(wired, demo) -> None:
    attempt = make_due(dispatched(wired, "charge_card", "pay:stale", ARGS))
    demo.inject("charge_card", "pay:stale", ARGS)  # the send happened before the crash

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    moves = [m for m in attempt.events.values_list("from_state", "to_state") if m[0] != m[1]]
    assert moves[-2:] == [
        (State.DISPATCHED, State.UNKNOWN),
        (State.UNKNOWN, State.OUTCOME_CONFIRMED),
    ]
    assert sent_count(demo, "pay:stale") == 1


def test_stale_dispatch_not_found_critical_is_not_resent(wired, demo) -> None:
    attempt = make_due(dispatched(wired, "charge_card", "pay:lost", ARGS))

    reconcile()

    attempt = reload(attempt)
    assert (attempt.state, attempt.review_reason) == (State.MANUAL_REVIEW, "not_found")
    assert demo.summary()["total"] == 0


# ------------------------------------------------------------------------------ sending on recovery


def test_resend_answered_5xx_is_unknown_not_failure(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:5xx", ARGS))
    demo.control(send_mode="error_5xx")

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.UNKNOWN
    assert attempt.send_count == 2
    assert attempt.next_check_at is not None


def test_resend_that_times_out_after_the_effect_is_unknown_then_confirmed(wired, demo) -> None:
    Tool.objects.update(timeout_seconds=0.4)
    attempt = make_due(unknown(wired, "update_crm", "c:hang", ARGS))
    demo.control(send_mode="hang_after_effect", hang_seconds=1)

    reconcile()
    assert reload(attempt).state == State.UNKNOWN
    demo.reset()
    make_due(attempt)
    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert sent_count(demo, "c:hang") == 1


def test_resend_refused_for_good_fails(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:refused", ARGS))
    demo.control(send_mode="refuse")

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.FAILED
    assert demo.summary()["total"] == 0


def test_retryable_refusal_is_sent_again_when_due(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:429", ARGS))
    demo.control(send_mode="refuse_retryable", remaining_faults=1)

    reconcile()
    attempt = reload(attempt)
    assert attempt.state == State.FAILED_RETRYABLE
    make_due(attempt)
    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.send_count == 3
    assert sent_count(demo, "c:429") == 1


def test_retryable_failure_of_a_reconcilable_tool_is_sent_again(wired, demo) -> None:
    """The provider definitively did not perform it: sending again is safe in any class."""
    attempt = dispatched(wired, "open_ticket", "t:retry", ARGS)
    ledger.fail(attempt, reason="429 from provider", retryable=True, actor=wired.agent)
    make_due(attempt)

    reconcile()

    assert reload(attempt).state == State.OUTCOME_CONFIRMED
    assert sent_count(demo, "t:retry") == 1


def test_work_never_sent_while_the_provider_is_down_is_sent_when_it_is_back(wired, demo) -> None:
    """Protocol section 6's FAILED_RETRYABLE row: a stale intent of a reconcilable tool meets
    a provider that refuses connections; nothing was sent, so it is sent again later, never
    FAILED silently."""
    attempt = intent(wired, "open_ticket", "t:blip", ARGS)
    Attempt.objects.filter(pk=attempt.pk).update(
        next_check_at=timezone.now() - dt.timedelta(seconds=1)
    )
    real_url = Tool.objects.get(name="open_ticket").dispatch_url
    Tool.objects.filter(name="open_ticket").update(
        dispatch_url="http://127.0.0.1:9/tools/open_ticket/send"  # nothing listens on port 9
    )
    reconcile()
    attempt = reload(attempt)
    assert attempt.state == State.FAILED_RETRYABLE
    make_due(attempt)
    reconcile()  # still down: stays retryable (today's code made it FAILED here)
    attempt = reload(attempt)
    assert attempt.state == State.FAILED_RETRYABLE

    Tool.objects.filter(name="open_ticket").update(dispatch_url=real_url)
    make_due(attempt)
    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert sent_count(demo, "t:blip") == 1


def test_unsent_work_past_the_send_limit_goes_to_a_person_with_an_owner(wired, demo) -> None:
    attempt = intent(wired, "open_ticket", "t:exhausted", ARGS)
    Tool.objects.filter(name="open_ticket").update(
        dispatch_url="http://127.0.0.1:9/tools/open_ticket/send", max_sends=2
    )
    for _ in range(3):
        make_due(attempt)
        reconcile()
        attempt = reload(attempt)

    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "sends_exhausted"
    assert attempt.owner == wired.triage
    assert demo.summary()["total"] == 0


def test_unsent_work_whose_authority_changed_goes_to_a_person(wired, demo) -> None:
    attempt = dispatched(wired, "open_ticket", "t:revoked", ARGS)
    ledger.fail(attempt, reason="429 from provider", retryable=True, actor=wired.agent)
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(policy_version="v2")
    make_due(attempt)

    reconcile()

    attempt = reload(attempt)
    assert (attempt.state, attempt.review_reason) == (State.MANUAL_REVIEW, "authority_changed")
    assert attempt.owner == wired.triage
    assert demo.summary()["total"] == 0


def test_provider_unreachable_on_resend_is_a_retryable_refusal(wired, demo) -> None:
    attempt = make_due(unknown(wired, "update_crm", "c:down", ARGS))
    Tool.objects.filter(name="update_crm").update(
        dispatch_url="http://127.0.0.1:9/tools/update_crm/send"  # nothing listens on port 9
    )

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.FAILED_RETRYABLE
    send = [e.details["send"] for e in attempt.events.all() if "send" in e.details][0]
    assert send["answer"] == "refused" and send["retryable"] is True


def test_several_effects_under_one_key_go_to_review(wired, demo) -> None:
    """A provider that did not honour the key performed the effect twice: a person must know."""
    attempt = make_due(unknown(wired, "open_ticket", "t:dup", ARGS))
    demo.control(tools={"open_ticket": {"honour_keys": False}})
    demo.inject("open_ticket", "t:dup", ARGS)
    demo.inject("open_ticket", "t:dup", ARGS)

    reconcile()

    attempt = reload(attempt)
    assert (attempt.state, attempt.review_reason) == (State.MANUAL_REVIEW, "duplicate_effects")
    assert lookup_events(attempt)[0]["count"] == 2


def test_critical_not_found_is_sent_only_after_two_reviewers_approve_a_linked_retry(
    wired, demo
) -> None:
    attempt = make_due(unknown(wired, "send_invoice_email", "inv:4eyes", ARGS))
    reconcile()
    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW

    assert review.approve_linked_retry(attempt, user=wired.reviewer) is None  # one of two
    reconcile()
    assert demo.summary()["total"] == 0
    child = review.approve_linked_retry(attempt, user=wired.reviewer2)
    reconcile()

    child = reload(child)
    assert child.state == State.OUTCOME_CONFIRMED
    assert child.parent_id == attempt.pk
    [effect] = demo.effects()
    assert effect["idempotency_key"] == child.idempotency_key
    assert reload(attempt).state == State.RECONCILED
