"""Recovery's calls in flight to a provider adapt to it (reconciliation/bulkhead.py,
``AdaptiveLimit``): a healthy provider's backlog drains at the worker's full concurrency; a
provider that slows down or answers 429 part-way is sent fewer calls at once, then more again
when it recovers; never more than the operator allows.

A real demo provider process on 127.0.0.1 counts the requests it is answering at once (its
``/_stats``); the reconciler runs its loop (``run_pass(carry=True)``) in the test's thread while
a watcher thread samples its lookup bulkhead and changes the provider's behaviour part-way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from attempts.models import Attempt, State
from reconciliation.reconciler import Reconciler
from tests.reconciliation.conftest import DemoProvider, unknown

TOOL = "update_crm"
CONCURRENCY = 8


def _backlog(world, demo: DemoProvider, count: int) -> list[int]:
    """``count`` UNKNOWN attempts whose effects the provider holds, all due now."""
    ids = []
    for i in range(count):
        attempt = unknown(world, TOOL, f"adaptive:{i}", {"i": i})
        demo.inject(TOOL, attempt.idempotency_key, attempt.args)
        ids.append(attempt.pk)
    past = Attempt.objects.filter(pk__in=ids).values_list("created_at", flat=True)[0]
    Attempt.objects.filter(pk__in=ids).update(next_check_at=past)
    return ids


class Watcher(threading.Thread):
    """Samples the lookup bulkhead's calls in flight and limit every 10 ms and walks through
    ``phases``: each is (name, condition on the last sample, action when it holds)."""

    def __init__(
        self,
        reconciler: Reconciler,
        phases: list[tuple[str, Callable[[int, int], bool], Callable[[], None]]],
        timeout: float,
    ) -> None:
        super().__init__(daemon=True)
        self.reconciler = reconciler
        self.phases = phases
        self.deadline = time.monotonic() + timeout
        self.samples: list[tuple[str, int, int]] = []  # (phase, in flight, limit)
        self.reached: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for name, condition, action in self.phases:
                while time.monotonic() < self.deadline:
                    bulkhead = next(
                        (
                            b
                            for b in list(self.reconciler.bulkheads.providers.values())
                            if b.operation == "lookup"
                        ),
                        None,
                    )
                    if bulkhead is not None:
                        sample = (bulkhead.in_flight, bulkhead.cap)
                        self.samples.append((name, *sample))
                        if condition(*sample):
                            self.reached.append(name)
                            action()
                            break
                    time.sleep(0.01)
                else:
                    return
        finally:
            self.done.set()

    def in_flight(self, phase: str) -> list[int]:
        return [flight for name, flight, _ in self.samples if name == phase]


def _drive(reconciler: Reconciler, watcher: Watcher) -> None:
    """The worker's loop, until the watcher has seen every phase (or gave up)."""
    watcher.start()
    try:
        while not watcher.done.is_set():
            reconciler.run_pass(stop=watcher.done, carry=True)
            reconciler.wait_for_work(watcher.done, 0.02)
    finally:
        watcher.done.set()
        watcher.join(timeout=5)
        reconciler.close()


def _waiting(world, demo: DemoProvider, count: int, latency_ms: int, **tools) -> list[int]:
    """The demo's tools configured (``tools``), its lookups taking ``latency_ms``, a backlog of
    ``count`` (``_backlog``), and the provider's count of calls at once started afresh."""
    demo.configure_tools(**tools)
    demo.control(lookup_latency_ms=latency_ms)
    ids = _backlog(world, demo, count)
    demo.request("POST", "/_stats")
    return ids


def _fewer_then_more(
    demo: DemoProvider,
    trouble: dict,
    low: tuple[str, Callable[[int, int], bool]],
    fixed: dict,
) -> None:
    """At full concurrency the provider runs into ``trouble`` (``demo.control``); once the
    worker's lookups are ``low`` (a named condition on calls in flight and limit) it is
    ``fixed``; the calls in flight must have fallen, then risen to full again, and never passed
    the worker's concurrency."""
    name, condition = low
    reconciler = Reconciler(worker_id="adaptive", concurrency=CONCURRENCY)
    watcher = Watcher(
        reconciler,
        [
            (
                "healthy",
                lambda flight, cap: flight == CONCURRENCY,
                lambda: demo.control(**trouble),
            ),
            (name, condition, lambda: demo.control(**fixed)),
            ("recovered", lambda flight, cap: flight == CONCURRENCY, lambda: None),
        ],
        timeout=60,
    )
    _drive(reconciler, watcher)
    assert watcher.reached == ["healthy", name, "recovered"], watcher.samples[-20:]
    assert min(watcher.in_flight("recovered")) <= 2  # it fell, then rose again
    assert max(flight for _, flight, _ in watcher.samples) <= CONCURRENCY
    assert demo.request("GET", "/_stats")[1]["peak_in_flight"] <= CONCURRENCY


def test_a_healthy_providers_backlog_drains_at_the_workers_full_concurrency(
    world, demo: DemoProvider
) -> None:
    ids = _waiting(world, demo, 120, latency_ms=30)
    reconciler = Reconciler(worker_id="adaptive", concurrency=CONCURRENCY)
    reconciler.run_pass()
    assert not Attempt.objects.filter(pk__in=ids).exclude(state=State.OUTCOME_CONFIRMED).exists()
    assert demo.request("GET", "/_stats")[1]["peak_in_flight"] == CONCURRENCY
    (bulkhead,) = [b for b in reconciler.bulkheads.providers.values() if b.operation == "lookup"]
    assert bulkhead.cap == CONCURRENCY


def test_calls_in_flight_never_pass_what_the_operator_allows(world, demo, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_CONCURRENCY": 5}
    ids = _waiting(world, demo, 80, latency_ms=30)
    Reconciler(worker_id="adaptive", concurrency=CONCURRENCY).run_pass()
    assert not Attempt.objects.filter(pk__in=ids).exclude(state=State.OUTCOME_CONFIRMED).exists()
    assert demo.request("GET", "/_stats")[1]["peak_in_flight"] == 5


def test_a_provider_that_slows_down_gets_fewer_calls_then_more_when_it_recovers(
    world, demo: DemoProvider
) -> None:
    _waiting(world, demo, 200, latency_ms=20, timeout=5.0)
    _fewer_then_more(
        demo,
        trouble={"lookup_latency_ms": 400},
        low=("slow", lambda flight, cap: cap <= 2),
        fixed={"lookup_latency_ms": 20},
    )


def test_a_provider_that_answers_429_part_way_gets_fewer_calls_then_more_when_it_recovers(
    world, demo: DemoProvider, settings
) -> None:
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 1}
    _waiting(world, demo, 200, latency_ms=20, timeout=5.0)
    _fewer_then_more(
        demo,
        trouble={"lookup_mode": "rate_limited", "retry_after_seconds": 1},
        low=("limited", lambda flight, cap: cap <= 2 and flight == 0),
        fixed={"lookup_mode": "ok"},
    )
