"""The bulkhead's circuit breaker, cap and Retry-After, step by step (reconciliation/bulkhead.py)."""

from __future__ import annotations

import time

import pytest

from attempts.models import EffectClass, Tool
from reconciliation.bulkhead import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    START_LIMIT,
    AdaptiveLimit,
    Bulkheads,
)
from reconciliation.providers.base import LookupAnswer, LookupStatus, SendAnswer, SendStatus
from reconciliation.providers.http import GenericHttpAdapter

TIMEOUT = LookupAnswer(LookupStatus.UNAVAILABLE, detail="timeout: no complete answer")
FOUND = LookupAnswer(LookupStatus.FOUND, provider_request_id="p", args_hash="0" * 64)
LIMITED = LookupAnswer(LookupStatus.UNAVAILABLE, http_status=429, retry_after=30.0)
NOT_FOUND = LookupAnswer(LookupStatus.NOT_FOUND, http_status=404)


@pytest.fixture
def bulkheads(settings) -> Bulkheads:
    settings.LEDGER = {
        **settings.LEDGER,
        "PROVIDER_CONCURRENCY": 2,
        "PROVIDER_CONCURRENCY_BY_KEY": {"127.0.0.1:9002": 1},
        "PROVIDER_BREAKER_FAILURES": 3,
        "PROVIDER_BREAKER_OPEN_SECONDS": 10,
    }
    return Bulkheads(concurrency=16)


def adapter(port: int, name: str = "t", *, path: str = "") -> GenericHttpAdapter:
    return GenericHttpAdapter(
        Tool(
            name=name,
            effect_class=EffectClass.RECONCILABLE,
            lookup_url=f"http://127.0.0.1:{port}{path}/lookup",
            dispatch_url=f"http://127.0.0.1:{port}{path}/send",
        )
    )


def open_lookups(bulkheads: Bulkheads, a: GenericHttpAdapter, *, now: float = 0.0) -> None:
    for _ in range(3):
        bulkheads.started(a, "lookup")
        bulkheads.finished(a, "lookup", [TIMEOUT], now=now)
    assert bulkheads.of(a, "lookup").state == OPEN


def test_failures_in_a_row_open_the_breaker_and_a_probe_closes_it(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(2):
        bulkheads.started(a, "lookup")
        bulkheads.finished(a, "lookup", [TIMEOUT], now=100.0)
    assert (
        bulkheads.of(a, "lookup").state == CLOSED
        and bulkheads.refusal(a, "lookup", now=100.0) is None
    )
    bulkheads.started(a, "lookup")
    bulkheads.finished(a, "lookup", [TIMEOUT], now=100.0)
    assert bulkheads.of(a, "lookup").state == OPEN
    wait, why = bulkheads.refusal(a, "lookup", now=105.0)
    assert wait == pytest.approx(5.0) and "circuit open" in why
    assert a.tool.name in bulkheads.blocked(now=105.0)["lookup"]
    assert bulkheads.probes_due(now=111.0) == {"lookup 127.0.0.1:9001/lookup": ("lookup", {"t"})}
    assert bulkheads.refusal(a, "lookup", now=111.0) is None  # half-open: one probe may go
    assert bulkheads.of(a, "lookup").state == HALF_OPEN
    bulkheads.started(a, "lookup")
    assert bulkheads.refusal(a, "lookup", now=111.0) is not None  # only one probe at a time
    bulkheads.finished(a, "lookup", [NOT_FOUND], now=112.0)  # a sound answer
    assert bulkheads.of(a, "lookup").state == CLOSED and bulkheads.of(a, "lookup").failures == 0


def test_a_failed_probe_opens_the_breaker_again_for_longer(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(3):
        bulkheads.started(a, "lookup")
        bulkheads.finished(a, "lookup", [TIMEOUT], now=0.0)
    assert bulkheads.refusal(a, "lookup", now=11.0) is None
    bulkheads.started(a, "lookup")
    bulkheads.finished(a, "lookup", [TIMEOUT], now=11.0)
    assert bulkheads.of(a, "lookup").state == OPEN
    assert bulkheads.refusal(a, "lookup", now=11.0).seconds == pytest.approx(20.0)  # doubled


def test_retry_after_holds_that_provider_only(bulkheads) -> None:
    limited, other = adapter(9001), adapter(9003, "other")
    bulkheads.started(limited, "lookup")
    bulkheads.finished(limited, "lookup", [LIMITED], now=0.0)
    wait, why = bulkheads.refusal(limited, "lookup", now=1.0)
    assert wait == pytest.approx(29.0) and "Retry-After" in why
    assert bulkheads.refusal(other, "lookup", now=1.0) is None
    snapshot = bulkheads.snapshot(now=1.0)
    assert snapshot["lookup 127.0.0.1:9001/lookup"]["retry_after"] is True
    assert "lookup 127.0.0.1:9003/lookup" not in snapshot


def test_the_ceiling_comes_from_configuration_and_a_reserve_keeps_threads_for_the_others(
    bulkheads,
) -> None:
    a, b = adapter(9001), adapter(9002)
    assert bulkheads.of(a, "lookup").limit.ceiling == 2
    assert bulkheads.of(b, "lookup").limit.ceiling == 1
    bulkheads.started(b, "lookup")
    assert not bulkheads.has_room(b, "lookup")
    # Never above the worker's concurrency, whatever the configuration says.
    assert Bulkheads(concurrency=2).of(adapter(9004), "lookup").limit.ceiling == 2
    # One bulkhead may fill the worker's concurrency; a bulkhead using less than half of it
    # still finds a thread of the reserve.
    whole = Bulkheads(concurrency=4)
    hog, other = adapter(9005, "hog"), adapter(9006, "other")
    learnt = whole.of(hog, "lookup").limit
    learnt.ceiling, learnt.limit = 4, 4.0  # as a healthy provider's limit grows to
    for in_flight in range(4):
        assert whole.may_start(hog, "lookup", in_flight)
        whole.started(hog, "lookup")
    assert not whole.may_start(hog, "lookup", 4)
    assert whole.threads == 6
    assert whole.may_start(other, "lookup", 4)
    whole.started(other, "lookup")
    assert whole.may_start(other, "lookup", 5)
    whole.started(other, "lookup")
    assert not whole.may_start(other, "lookup", 6)  # the reserve is spent
    # A bulkhead using half of the concurrency or more takes no thread of the reserve.
    third = Bulkheads(concurrency=4)
    grown = third.of(adapter(9007, "x", path="/x"), "lookup").limit
    grown.ceiling, grown.limit = 4, 4.0
    for name in ("x", "y"):
        for _ in range(2):
            third.started(adapter(9007, name, path=f"/{name}"), "lookup")
    assert not third.may_start(adapter(9007, "x", path="/x"), "lookup", 4)


def test_the_limit_grows_while_answers_are_sound_and_quick_and_never_passes_its_ceiling() -> None:
    limit = AdaptiveLimit(ceiling=16)
    assert limit.cap == START_LIMIT
    for _ in range(100):
        limit.record(20, failed=False, in_flight=limit.cap)
    assert limit.cap == 16
    # An idle provider earns no room it never used.
    idle = AdaptiveLimit(ceiling=16)
    for _ in range(100):
        idle.record(20, failed=False, in_flight=1)
    assert idle.cap == START_LIMIT


def test_the_limit_shrinks_on_rising_latency_and_failures_then_grows_back() -> None:
    limit = AdaptiveLimit(ceiling=16)
    for _ in range(50):
        limit.record(20, failed=False, in_flight=limit.cap)
    assert limit.cap == 16
    for _ in range(10):
        limit.record(400, failed=False, in_flight=limit.cap)  # latency rises 20x
    slow = limit.cap
    assert slow < 8
    for _ in range(3):
        limit.record(0, failed=True, in_flight=limit.cap)  # 429, 5xx, a deadline passed
    assert 1 <= limit.cap < slow
    for _ in range(60):
        limit.record(20, failed=False, in_flight=limit.cap)  # recovered
    assert limit.cap == 16


def test_a_provider_slower_for_good_is_its_new_normal() -> None:
    limit = AdaptiveLimit(ceiling=8)
    for _ in range(20):
        limit.record(20, failed=False, in_flight=limit.cap)
    for _ in range(400):
        limit.record(200, failed=False, in_flight=limit.cap)
    assert limit.cap == 8


def test_tools_on_one_provider_share_its_bulkhead(bulkheads) -> None:
    assert bulkheads.of(adapter(9001, "x"), "lookup") is bulkheads.of(adapter(9001, "y"), "lookup")
    assert bulkheads.of(adapter(9001, "x"), "lookup").tools == {"x", "y"}


def test_a_found_answer_is_not_a_failure(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(5):
        bulkheads.started(a, "lookup")
        bulkheads.finished(a, "lookup", [FOUND])
    assert bulkheads.of(a, "lookup").state == CLOSED


def test_a_failing_lookup_of_one_tool_defers_no_send_and_no_other_tools_lookup_on_its_host(
    bulkheads,
) -> None:
    """Bulkheads are keyed by what fails together: the endpoint and the operation, not the
    host. The demo's ticket lookups answering 503 hold no CRM call on the same host."""
    tickets = adapter(9001, "open_ticket", path="/tools/open_ticket")
    crm = adapter(9001, "update_crm", path="/tools/update_crm")
    open_lookups(bulkheads, tickets)
    assert bulkheads.refusal(tickets, "lookup", now=1.0) is not None
    assert bulkheads.refusal(tickets, "send", now=1.0) is None
    assert bulkheads.refusal(crm, "lookup", now=1.0) is None
    assert bulkheads.refusal(crm, "send", now=1.0) is None
    assert bulkheads.blocked(now=1.0) == {"lookup": {"open_ticket"}, "send": set()}


def test_a_breaker_opened_by_lookups_does_not_stop_sends_that_succeed(bulkheads) -> None:
    a = adapter(9001)
    open_lookups(bulkheads, a)
    accepted = SendAnswer(SendStatus.ACCEPTED, provider_request_id="p1", http_status=201)
    for _ in range(5):
        assert bulkheads.refusal(a, "send", now=1.0) is None
        bulkheads.started(a, "send")
        bulkheads.finished(a, "send", [accepted], now=1.0)
    assert bulkheads.of(a, "send").state == CLOSED
    assert bulkheads.of(a, "lookup").state == OPEN


def test_a_second_worker_adopts_the_breaker_another_worker_opened(bulkheads) -> None:
    """Shared through the heartbeat: the second worker makes no call to a bulkhead the first
    found down until the first one's window ends, then probes it itself."""
    a = adapter(9001)
    open_lookups(bulkheads, a, now=time.monotonic())
    published = bulkheads.snapshot()
    second = Bulkheads(concurrency=16)
    second.adopt({"w1": published}, {"t": a})
    refusal = second.refusal(a, "lookup")
    assert refusal is not None and "circuit open" in refusal.why
    assert second.refusal(a, "send") is None
    assert second.of(a, "lookup").shared_from == "w1"
    # It does not publish what it adopted as its own finding.
    assert second.snapshot()["lookup 127.0.0.1:9001/lookup"]["shared_from"] == "w1"
    third = Bulkheads(concurrency=16)
    third.adopt({"w2": second.snapshot()}, {"t": a})
    assert third.refusal(a, "lookup") is None


def test_calls_cut_at_their_deadline_name_their_bulkhead_in_the_snapshot(bulkheads) -> None:
    a = adapter(9001)
    bulkheads.started(a, "lookup")
    bulkheads.finished(a, "lookup", [TIMEOUT], now=50.0)
    snapshot = bulkheads.snapshot(now=60.0)
    assert snapshot["lookup 127.0.0.1:9001/lookup"]["past_deadline"]
    assert snapshot["lookup 127.0.0.1:9001/lookup"]["cut_calls"] == 1


def test_calls_in_flight_when_the_breaker_opened_do_not_lengthen_its_window(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(6):
        bulkheads.started(a, "lookup")
    for _ in range(6):
        bulkheads.finished(a, "lookup", [TIMEOUT], now=100.0)
    state = bulkheads.of(a, "lookup")
    # Opened once, by the third failure; the three after it were started before it opened.
    assert state.state == OPEN and state.opened == 1 and state.open_until == 110.0
