"""The Python client (ledgerweb_client) against the real API served over HTTP on 127.0.0.1
(pytest-django's live server), so the client and the server are held to the same contract."""

from __future__ import annotations

import pytest

from attempts.models import Attempt, AttemptEvent, State
from ledgerweb_client import (
    IdempotencyConflict,
    InvalidRequest,
    LedgerClient,
    NotFound,
    ProviderLostResponse,
    ProviderRefused,
    ProviderTimeout,
    Refused,
    SendResult,
    StateConflict,
    Unauthorized,
)
from tests.api.conftest import Tokens
from tests.conftest import CONFIRMED_IN_ORDER

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ledger(live_server, tokens: Tokens):
    with LedgerClient(live_server.url, tokens.acme, timeout=10) as client:
        yield client


def intent(key: str, **extra):
    return {
        "tenant": "acme",
        "task_id": "task-live",
        "tool_name": "charge_card",
        "idempotency_key": key,
        "args": {"customer": "cus_1", "amount_cents": 1200, "currency": "EUR"},
        **extra,
    }


def test_call_runs_the_safe_order_and_confirms(ledger: LedgerClient) -> None:
    sent = []

    def send(attempt):
        sent.append(attempt.idempotency_key)
        return SendResult(provider_request_id="prv_1", result_ref="ch_1")

    result = ledger.call(**intent("charge:live:1"), send=send)
    assert result.sent and result.confirmed
    assert result.attempt.provider_request_id == "prv_1"
    again = ledger.call(**intent("charge:live:1"), send=send)
    assert not again.sent and again.confirmed
    assert sent == ["charge:live:1"]
    stored = Attempt.objects.get(idempotency_key="charge:live:1")
    assert (stored.state, stored.result_ref, stored.send_count) == ("OUTCOME_CONFIRMED", "ch_1", 1)
    actions = list(stored.events.values_list("action", flat=True))
    assert actions == CONFIRMED_IN_ORDER


@pytest.mark.parametrize(
    "error", [ProviderTimeout("read timed out"), ProviderLostResponse("reset")]
)
def test_lost_response_leaves_the_attempt_unknown(ledger: LedgerClient, error) -> None:
    def send(attempt):
        raise error

    result = ledger.call(**intent("charge:live:unknown"), send=send)
    assert result.sent and result.state == "UNKNOWN"
    assert Attempt.objects.get().state == State.UNKNOWN
    # UNKNOWN is never re-sent by an agent: the next call does not send.
    again = ledger.call(**intent("charge:live:unknown"), send=send)
    assert not again.sent and again.state == "UNKNOWN"


def test_refusal_and_unexpected_exception(ledger: LedgerClient) -> None:
    def refuse(attempt):
        raise ProviderRefused("card declined", retryable=False)

    assert ledger.call(**intent("charge:live:refused"), send=refuse).state == "FAILED"

    with pytest.raises(ZeroDivisionError):
        with ledger.attempt(**intent("charge:live:crash")) as call:
            assert call.should_send
            _ = 1 / 0
    assert Attempt.objects.get(idempotency_key="charge:live:crash").state == State.UNKNOWN


def test_block_form_records_the_provider_id_before_confirming(ledger: LedgerClient) -> None:
    with ledger.attempt(**intent("charge:live:block")) as call:
        assert call.should_send
        call.provider_request("prv_block")
        call.confirm("ch_block")
    assert ledger.get(call.attempt.attempt_id).state == "OUTCOME_CONFIRMED"
    assert [a.attempt_id for a in ledger.find("charge:live:block")] == [call.attempt.attempt_id]


def test_errors_map_to_the_client_exceptions(ledger: LedgerClient, live_server, tokens) -> None:
    ledger.record_intent(**intent("charge:live:errors"))
    events = AttemptEvent.objects.count()
    with pytest.raises(IdempotencyConflict):
        ledger.record_intent(**{**intent("charge:live:errors"), "args": {"amount_cents": 1}})
    with pytest.raises(Refused) as unknown_tool:
        ledger.record_intent(**intent("charge:live:bad", tool_name="no_such_tool"))
    assert (unknown_tool.value.status, unknown_tool.value.code) == (403, "unknown_tool")
    with pytest.raises(Refused) as refused:
        ledger.record_intent(**intent("charge:live:globex", tenant="globex"))
    assert refused.value.code == "tenant_not_granted"
    with pytest.raises(NotFound):
        ledger.get("att_MISSING")
    attempt = ledger.find("charge:live:errors")[0]
    with pytest.raises(StateConflict):
        ledger.confirm(attempt.attempt_id, "r")
    with LedgerClient(live_server.url, "lwt_wrong") as stranger:
        with pytest.raises(Unauthorized):
            stranger.get(attempt.attempt_id)
    assert AttemptEvent.objects.count() == events
    assert ledger.dispatch(attempt.attempt_id) is True
    assert ledger.dispatch(attempt.attempt_id) is False


def test_a_body_too_large_is_a_non_retryable_413_not_unavailable(gunicorn: str, tokens) -> None:
    """8 MiB of arguments to gunicorn: InvalidRequest 413 (today's client said
    LedgerUnavailable, which its docs call safe to retry: an agent would retry forever)."""
    big = {"blob": "x" * (8 * 1024 * 1024)}
    with LedgerClient(gunicorn, tokens.acme) as ledger, pytest.raises(InvalidRequest) as refused:
        ledger.record_intent(**{**intent("charge:live:huge"), "args": big})
    assert (refused.value.status, refused.value.code) == (413, "too_large")
    assert not Attempt.objects.exists()


def test_the_servers_413_is_read_even_when_it_closes_mid_body(live_server, tokens) -> None:
    """A client allowed bigger bodies than the server: the server answers 413 without reading
    the body and closes; the client reports that answer, not a broken pipe."""
    big = {"blob": "x" * (8 * 1024 * 1024)}
    with LedgerClient(live_server.url, tokens.acme, max_body_bytes=64 * 1024 * 1024) as client:
        with pytest.raises(InvalidRequest) as refused:
            client.record_intent(**{**intent("charge:live:huge2"), "args": big})
    assert refused.value.status == 413
    assert not Attempt.objects.exists()


def test_gunicorns_early_413_is_not_unavailable(gunicorn: str, tokens) -> None:
    """The production server answers 413 from Content-Length and closes before reading the
    body: the client reports that answer (today's client said LedgerUnavailable, BrokenPipe)."""
    big = {"blob": "x" * (8 * 1024 * 1024)}
    with LedgerClient(gunicorn, tokens.acme, max_body_bytes=64 * 1024 * 1024) as client:
        with pytest.raises(InvalidRequest) as refused:
            client.record_intent(**{**intent("charge:live:gunicorn"), "args": big})
    assert (refused.value.status, refused.value.code) == (413, "too_large")
    assert not Attempt.objects.exists()


def test_the_client_sends_the_callers_traceparent(ledger: LedgerClient) -> None:
    from ledgerweb_client import InvalidRequest

    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    attempt = ledger.record_intent(**intent("live:traced"), traceparent=traceparent)
    assert attempt.raw["traceparent"] == traceparent
    assert Attempt.objects.get(attempt_id=attempt.attempt_id).trace_id == traceparent[3:35]
    with pytest.raises(InvalidRequest) as refused:
        ledger.record_intent(**intent("live:badtrace"), traceparent="00-nope")
    assert refused.value.code == "invalid_traceparent"


def _held_policy() -> None:
    from attempts.models import ApprovalPolicy

    ApprovalPolicy.objects.create(
        name="big-charges",
        tool_id="charge_card",
        condition="args.amount_cents > 100000",
        approvals_needed=2,
    )


def test_call_waits_for_approval_then_sends_once(gunicorn: str, tokens: Tokens, world) -> None:
    """A held call waits (long-polls gunicorn) while two people approve, then is claimed and
    sent; the same key later returns the outcome without a second send."""
    import threading
    import time

    from django.db import connection

    from attempts import review

    _held_policy()
    sent: list[str] = []
    results: list = []

    def send(attempt):
        sent.append(attempt.idempotency_key)
        return SendResult(provider_request_id="prv_9", result_ref="ch_9")

    big = intent("charge:live:held", args={"customer": "c", "amount_cents": 250000})

    def agent() -> None:
        with LedgerClient(gunicorn, tokens.acme, timeout=25) as client:
            results.append(client.call(**big, send=send, wait_for_approval=20))

    waiting = threading.Thread(target=agent)
    waiting.start()
    deadline = time.monotonic() + 10
    while not Attempt.objects.filter(idempotency_key="charge:live:held").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    attempt_id = Attempt.objects.get(idempotency_key="charge:live:held").attempt_id
    review.approve_held(attempt_id, user=world.reviewer)
    review.approve_held(attempt_id, user=world.reviewer2)
    connection.close()
    waiting.join(timeout=30)
    [result] = results
    assert result.sent and result.confirmed and sent == ["charge:live:held"]
    with LedgerClient(gunicorn, tokens.acme, timeout=25) as client:
        again = client.call(**big, send=send, wait_for_approval=5)
    assert not again.sent and again.confirmed and sent == ["charge:live:held"]


def test_call_without_approval_in_time_sends_nothing(ledger: LedgerClient, world) -> None:
    _held_policy()
    big = intent("charge:live:wait", args={"customer": "c", "amount_cents": 250000})
    result = ledger.call(**big, send=lambda a: SendResult(), wait_for_approval=1)
    assert not result.sent and result.state == "AWAITING_APPROVAL"
    attempt_id = result.attempt.attempt_id
    from attempts import review

    review.reject_held(attempt_id, user=world.reviewer, reason="no")
    assert ledger.wait_for_approval(attempt_id, 5).state == "FAILED"
    rejected = ledger.call(**big, send=lambda a: SendResult(), wait_for_approval=5)
    assert not rejected.sent and rejected.state == "FAILED"
