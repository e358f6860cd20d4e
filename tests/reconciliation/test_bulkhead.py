"""One provider slow, silent, huge, rate-limiting or lying must not hold up anybody else's
recovery, and nothing it says unchecked is stored (issue 23).

Real processes throughout: a misbehaving provider (tests/reconciliation/bad_provider.py), the
demo provider for the healthy tool, and a real ``manage.py reconcile`` loop."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from django.test import Client
from django.utils import timezone

from attempts.models import AttemptEvent, State, Tool
from reconciliation.models import WorkerHeartbeat
from reconciliation.providers.registry import Registry
from reconciliation.reconciler import Reconciler
from tests.conftest import child_env, make_world, start_manage
from tests.reconciliation.conftest import (
    BadProvider,
    intent,
    make_due,
    make_stale,
    seconds_to_confirm,
    unknown,
)

BAD_TOOL = "open_ticket"
HEALTHY_TOOL = "update_crm"
TIMEOUT = 1.0


def _settle_time(world, key: str, limit: float, worker: subprocess.Popen) -> float:
    """Seconds from a stale intent of the healthy tool to its confirmation, checking all the
    while that the worker's heartbeat stays fresh."""
    attempt = make_stale(intent(world, HEALTHY_TOOL, key, {"key": key}))
    return seconds_to_confirm(attempt, limit, worker, also=_heartbeat_fresh)


def _heartbeat_fresh() -> None:
    beat = WorkerHeartbeat.objects.order_by("-last_seen").first()
    if beat is not None:
        age = (timezone.now() - beat.last_seen).total_seconds()
        assert age < 3.0, f"the worker's heartbeat is {age:.1f}s old"


@pytest.mark.parametrize(
    "bad_provider",
    [
        "trickle",
        # The same trickle in the framings http.client stops holding the socket for, and
        # chunked: each call cut at its deadline by the transport (issue 40).
        "trickle_http10",
        "trickle_closedelim",
        "trickle_chunked",
        "blackhole",
        "slow_headers",
        "huge",
        "huge_chunked",
        "ratelimit",
    ],
    indirect=True,
)
def test_one_misbehaving_provider_holds_up_nobody_else(
    transactional_db, demo, bad_provider: BadProvider
) -> None:
    world = make_world()
    demo.configure_tools()
    bad_provider.point(BAD_TOOL, TIMEOUT)
    worker = start_manage(
        ["reconcile", "--interval", "0.2", "--worker-id", "bulkhead"],
        env=child_env(
            LEDGERWEB_STALE_AFTER="1",
            LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS="60",
            # A worker that does not stop is stopped with SIGABRT: every thread's stack printed.
            PYTHONFAULTHANDLER="1",
        ),
    )
    try:
        alone = _settle_time(world, "alone", 15.0, worker)
        bad = [make_due(unknown(world, BAD_TOOL, f"bad:{i}", {"i": i})) for i in range(24)]
        deadline = time.monotonic() + 10
        while bad_provider.hits() == 0:
            assert time.monotonic() < deadline, "the worker never called the bad provider"
            time.sleep(0.05)
        # The bad provider's calls are in flight (or its breaker is open) from here on.
        with_bad = _settle_time(world, "with-bad", max(3.0, 1.5 * alone + 1.0), worker)
        assert with_bad <= max(1.5 * alone, alone + 1.0), (alone, with_bad)
        time.sleep(TIMEOUT * 2.5)  # every call to the bad provider has met its deadline
        hits = bad_provider.hits()
        if bad_provider.mode.startswith("huge"):
            assert hits <= len(bad), hits  # each answer refused early, none asked again
        else:
            # A bounded number of calls: capped, then the breaker or Retry-After stopped them.
            assert hits <= 6, hits
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            out, err = worker.communicate(timeout=TIMEOUT * 4 + 5)
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGABRT)
            try:
                out, err = worker.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                out, err = worker.communicate()
            raise AssertionError(
                f"the worker did not stop within its calls' deadlines; where it was:\n{err[-8000:]}"
            ) from None
    assert worker.returncode == 0, err
    for attempt in bad:
        attempt.refresh_from_db()
        # Nothing the provider said was stored as a fact.
        assert attempt.provider_request_id == "" and attempt.result_ref == ""
        assert attempt.lease_owner == ""
        assert attempt.state in (State.UNKNOWN, State.MANUAL_REVIEW)
    mode = bad_provider.mode
    if mode.startswith("huge"):
        reviewed = [a for a in bad if a.state == State.MANUAL_REVIEW]
        assert reviewed and all(a.review_reason == "invalid_provider_answer" for a in reviewed)
        event = reviewed[0].events.order_by("-id").first()
        assert "limit" in event.details["lookup"]["invalid"]
    else:
        assert all(a.state == State.UNKNOWN for a in bad)
        # Left alone while the provider may not be called: deferred, or not even claimed.
        looked_up = AttemptEvent.objects.filter(attempt__in=bad, action="attempt.lookup").count()
        assert looked_up <= 6, looked_up
        beat = WorkerHeartbeat.objects.get(worker_id="bulkhead")
        key = f"lookup 127.0.0.1:{bad_provider.port}/lookup"
        assert beat.providers[key]["state"] in ("open", "half_open", "closed")
        if mode == "ratelimit":
            assert beat.providers[key]["retry_after"] is True
        else:
            assert beat.providers[key]["state"] == "open"


@pytest.mark.parametrize(
    "bad_provider",
    ["bad_id_newline", "bad_id_nul", "bad_id_long", "bad_encoding"],
    indirect=True,
)
def test_a_provider_id_the_api_would_refuse_goes_to_a_person_not_into_the_ledger(
    world, bad_provider: BadProvider
) -> None:
    bad_provider.point(BAD_TOOL, TIMEOUT)
    attempt = make_due(unknown(world, BAD_TOOL, "lying", {"n": 1}))
    Reconciler(worker_id="w").run_pass()
    attempt.refresh_from_db()
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "invalid_provider_answer"
    assert attempt.provider_request_id == "" and attempt.result_ref == ""
    assert attempt.owner_id is not None
    event = attempt.events.order_by("-id").first()
    evidence = event.details["lookup"]["evidence"]
    # Kept escaped and truncated: no control character, no bidi override, bounded.
    assert evidence.isascii() and evidence.isprintable() and len(evidence) < 1100
    assert "provider_request_id" not in event.details["lookup"]


def test_healthz_and_metrics_name_an_open_circuited_provider(world, settings) -> None:
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": True}
    WorkerHeartbeat.objects.create(
        worker_id="w1",
        hostname="h",
        pid=1,
        started_at=timezone.now(),
        last_seen=timezone.now(),
        providers={
            "127.0.0.1:9": {"state": "open", "failures": 3, "retry_after": False, "tools": []}
        },
    )
    body = Client().get("/healthz").json()
    assert body["providers_degraded"] == {"127.0.0.1:9": "open"}
    text = Client().get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'ledger_provider_degraded{provider="127.0.0.1:9",state="open"} 1' in text
    assert 'ledger_provider_failures{provider="127.0.0.1:9"} 3' in text


@pytest.mark.parametrize("bad_provider", ["ratelimit"], indirect=True)
def test_the_attempt_page_says_when_recovery_deferred_it_for_its_provider(
    world, bad_provider: BadProvider
) -> None:
    bad_provider.point(BAD_TOOL, TIMEOUT)
    attempts = [make_due(unknown(world, BAD_TOOL, f"held:{i}", {"i": i})) for i in range(8)]
    Reconciler(worker_id="w", concurrency=8).run_pass()
    assert bad_provider.hits() <= 4  # the cap, then Retry-After held the rest
    deferred = [a for a in attempts if a.events.filter(action="attempt.provider_deferred").exists()]
    assert deferred
    client = Client()
    client.force_login(world.operator)
    page = client.get(f"/attempts/{deferred[0].attempt_id}/").content.decode()
    assert 'data-testid="provider-degraded"' in page
    assert "Retry-After" in page
    # One that was looked up (and answered 429) shows its lookup, not the banner.
    looked_up = next(a for a in attempts if a not in deferred)
    quiet = client.get(f"/attempts/{looked_up.attempt_id}/").content.decode()
    assert 'data-testid="provider-degraded"' not in quiet


def _timed_pass(reconciler: Reconciler) -> float:
    started = time.monotonic()
    reconciler.run_pass(carry=True)
    return time.monotonic() - started


@pytest.mark.parametrize("bad_provider", ["blackhole", "trickle"], indirect=True)
def test_a_slow_providers_call_in_flight_holds_back_no_other_answer(
    world, demo, bad_provider: BadProvider
) -> None:
    """Answers are written in groups, but a group stays open only while answers keep coming:
    a call of another provider that takes its whole deadline does not hold it open."""
    demo.configure_tools()
    bad_provider.point(BAD_TOOL, TIMEOUT)
    Tool.objects.filter(name=BAD_TOOL).update(timeout_seconds=30)
    reconciler = Reconciler(worker_id="w")
    try:
        make_due(unknown(world, BAD_TOOL, "slow", {"n": 1}))
        assert _timed_pass(reconciler) < 2.0  # its call carries over, within its deadline
        # A group window long enough to tell: the healthy answer must not wait for it.
        reconciler.FLUSH_AFTER = 5.0
        demo.inject(HEALTHY_TOOL, "healthy", {"n": 2})
        healthy = make_due(unknown(world, HEALTHY_TOOL, "healthy", {"n": 2}))
        assert _timed_pass(reconciler) < 2.0
        healthy.refresh_from_db()
        assert healthy.state == State.OUTCOME_CONFIRMED
    finally:
        bad_provider.stop()  # its calls end now rather than at their deadline
        reconciler.close()


@pytest.mark.parametrize("bad_provider", ["blackhole"], indirect=True)
def test_a_pass_does_not_wait_for_the_probe_of_a_failing_provider(
    world, bad_provider: BadProvider
) -> None:
    """The loop's pass waits a moment for the calls it started, to write fast answers at
    once; not for a probe of a provider whose last calls failed (it takes its deadline), so
    the worker looks for due work again on time."""
    bad_provider.point(BAD_TOOL, TIMEOUT)
    Tool.objects.filter(name=BAD_TOOL).update(timeout_seconds=30)
    reconciler = Reconciler(worker_id="w")
    reconciler.FLUSH_AFTER = 5.0
    try:
        make_due(unknown(world, BAD_TOOL, "probe", {"n": 1}))
        adapter, _ = Registry.load().usable(BAD_TOOL)
        provider = reconciler.bulkheads.of(adapter, "lookup")
        provider.state, provider.failures, provider.open_until = "open", 3, time.monotonic() - 1
        assert _timed_pass(reconciler) < 2.0
        assert provider.state == "half_open" and provider.probing
        deadline = time.monotonic() + 5
        while bad_provider.hits() == 0:  # the probe is on its way, in its pool thread
            assert time.monotonic() < deadline, "the probe was never made"
            time.sleep(0.02)
    finally:
        bad_provider.stop()
        reconciler.close()
