"""The bulkhead's circuit breaker, cap and Retry-After, step by step (reconciliation/bulkhead.py)."""

from __future__ import annotations

import pytest

from attempts.models import EffectClass, Tool
from reconciliation.bulkhead import CLOSED, HALF_OPEN, OPEN, Bulkheads
from reconciliation.providers.base import LookupAnswer, LookupStatus
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


def adapter(port: int, name: str = "t") -> GenericHttpAdapter:
    return GenericHttpAdapter(
        Tool(
            name=name,
            effect_class=EffectClass.RECONCILABLE,
            lookup_url=f"http://127.0.0.1:{port}/lookup",
            dispatch_url=f"http://127.0.0.1:{port}/send",
        )
    )


def test_failures_in_a_row_open_the_breaker_and_a_probe_closes_it(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(2):
        bulkheads.started(a)
        bulkheads.finished(a, [TIMEOUT], now=100.0)
    assert bulkheads.of(a).state == CLOSED and bulkheads.refusal(a, now=100.0) is None
    bulkheads.started(a)
    bulkheads.finished(a, [TIMEOUT], now=100.0)
    assert bulkheads.of(a).state == OPEN
    wait, why = bulkheads.refusal(a, now=105.0)
    assert wait == pytest.approx(5.0) and "circuit open" in why
    assert a.tool.name in bulkheads.blocked_tools(now=105.0)
    assert bulkheads.probe_tools(now=111.0) == {"127.0.0.1:9001": {"t"}}
    assert bulkheads.refusal(a, now=111.0) is None  # half-open: one probe may go
    assert bulkheads.of(a).state == HALF_OPEN
    bulkheads.started(a)
    assert bulkheads.refusal(a, now=111.0) is not None  # only one probe at a time
    bulkheads.finished(a, [NOT_FOUND], now=112.0)  # a sound answer
    assert bulkheads.of(a).state == CLOSED and bulkheads.of(a).failures == 0


def test_a_failed_probe_opens_the_breaker_again_for_longer(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(3):
        bulkheads.started(a)
        bulkheads.finished(a, [TIMEOUT], now=0.0)
    assert bulkheads.refusal(a, now=11.0) is None
    bulkheads.started(a)
    bulkheads.finished(a, [TIMEOUT], now=11.0)
    assert bulkheads.of(a).state == OPEN
    assert bulkheads.refusal(a, now=11.0)[0] == pytest.approx(20.0)  # doubled


def test_retry_after_holds_that_provider_only(bulkheads) -> None:
    limited, other = adapter(9001), adapter(9003, "other")
    bulkheads.started(limited)
    bulkheads.finished(limited, [LIMITED], now=0.0)
    wait, why = bulkheads.refusal(limited, now=1.0)
    assert wait == pytest.approx(29.0) and "Retry-After" in why
    assert bulkheads.refusal(other, now=1.0) is None
    snapshot = bulkheads.snapshot(now=1.0)
    assert snapshot["127.0.0.1:9001"]["retry_after"] is True
    assert "127.0.0.1:9003" not in snapshot


def test_the_cap_comes_from_configuration_and_never_takes_the_whole_pool(bulkheads) -> None:
    a, b = adapter(9001), adapter(9002)
    assert bulkheads.of(a).cap == 2 and bulkheads.of(b).cap == 1
    bulkheads.started(b)
    assert not bulkheads.has_room(b)
    assert Bulkheads(concurrency=2).of(adapter(9004)).cap == 1


def test_tools_on_one_provider_share_its_bulkhead(bulkheads) -> None:
    assert bulkheads.of(adapter(9001, "x")) is bulkheads.of(adapter(9001, "y"))
    assert bulkheads.of(adapter(9001, "x")).tools == {"x", "y"}


def test_a_found_answer_is_not_a_failure(bulkheads) -> None:
    a = adapter(9001)
    for _ in range(5):
        bulkheads.started(a)
        bulkheads.finished(a, [FOUND])
    assert bulkheads.of(a).state == CLOSED
