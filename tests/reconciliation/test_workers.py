"""Recovery is safe to run concurrently and twice (protocol section 7, invariant 6): real
``manage.py reconcile`` processes over one database and a real provider process."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter

import pytest
from django.core.management import call_command
from django.utils import timezone

from attempts import ledger
from attempts.locking import write_transaction
from attempts.models import Attempt, AttemptEvent, State
from attempts.states import Actor
from reconciliation.models import WorkerHeartbeat
from tests.conftest import child_env, make_world, start_manage
from tests.reconciliation.conftest import make_due, unknown

ATTEMPTS = 500


def _bulk_unknown(count: int, demo) -> None:
    """``count`` attempts left UNKNOWN by crashed agents, all due: half of them (open_ticket,
    reconcilable) did reach the provider, the other half (update_crm, idempotent) did not."""
    agent = Actor.agent("crashed-agent")
    for i in range(count):
        tool = "open_ticket" if i % 2 else "update_crm"
        key = f"bulk:{i}"
        args = {"i": i, "tool": tool}
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id=f"t{i}",
            tool_name=tool,
            idempotency_key=key,
            args=args,
            actor=agent,
        )
        attempt, _ = ledger.claim_dispatch(attempt, actor=agent)
        ledger.mark_unknown(attempt, reason="agent killed", actor=agent)
        if tool == "open_ticket":
            demo.inject(tool, key, args)
    Attempt.objects.update(next_check_at=timezone.now() - timezone.timedelta(seconds=1))


def _reconcile_process(worker: str, *extra: str) -> subprocess.Popen[str]:
    return start_manage(
        ["reconcile", "--once", "--json", "--worker-id", worker, *extra],
        env=child_env(),
    )


@pytest.mark.slow
def test_three_workers_at_once_settle_every_attempt_exactly_once(transactional_db, demo) -> None:
    make_world()
    demo.configure_tools(timeout=10)
    _bulk_unknown(ATTEMPTS, demo)

    workers = [_reconcile_process(f"w{n}", "--concurrency", "8") for n in range(3)]
    summaries = []
    for process in workers:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        summaries.append(json.loads(out.strip().splitlines()[-1]))

    print("claimed per worker:", [s["claimed"] for s in summaries])
    attempts = list(Attempt.objects.order_by("id"))
    assert len(attempts) == ATTEMPTS
    assert Counter(a.state for a in attempts) == {State.OUTCOME_CONFIRMED: ATTEMPTS}
    # Each attempt was claimed by exactly one worker, which did all of its recovery.
    assert sum(s["claimed"] for s in summaries) == ATTEMPTS
    assert sum(s["lost"] for s in summaries) == 0
    worker_events = AttemptEvent.objects.filter(actor_kind="worker")
    actors_per_attempt = Counter()
    for attempt_id, _actor in (
        worker_events.values_list("attempt_id", "actor").order_by().distinct()
    ):
        actors_per_attempt[attempt_id] += 1
    assert set(actors_per_attempt.values()) == {1}
    assert len(actors_per_attempt) == ATTEMPTS
    # Looked up once each (plus the confirming lookup right after a resend), sent at most once.
    for attempt in attempts:
        answers = [
            e.details["lookup"]["answer"] for e in attempt.events.all() if "lookup" in e.details
        ]
        if attempt.tool_name == "open_ticket":
            assert (answers, attempt.send_count) == (["found"], 1)
        else:
            assert (answers, attempt.send_count) == (["not_found", "found"], 2)
    summary = demo.summary()
    assert summary["duplicates"] == {}
    assert summary["total"] == ATTEMPTS
    assert sum(s["sends"] for s in summaries) == ATTEMPTS // 2
    assert WorkerHeartbeat.objects.filter(worker_id__in=["w0", "w1", "w2"]).count() == 3


def _snapshot() -> dict[str, tuple]:
    return {
        a.attempt_id: (a.state, a.version, a.next_check_at, a.owner_id, a.result_ref)
        for a in Attempt.objects.all()
    }


def test_running_once_twice_changes_nothing_the_first_run_settled(wired, demo, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "BACKOFF_BASE": 30}
    found = make_due(unknown(wired, "open_ticket", "t:1", {"a": 1}))
    demo.inject("open_ticket", "t:1", {"a": 1})
    make_due(unknown(wired, "open_ticket", "t:2", {"a": 2}))  # not found: review
    make_due(unknown(wired, "update_crm", "c:3", {"a": 3}))  # resent and confirmed
    make_due(unknown(wired, "deploy_service", "d:4", {"a": 4}))  # manual: review
    slow = make_due(unknown(wired, "send_invoice_email", "inv:5", {"a": 5}))
    demo.control(tools={"send_invoice_email": {"lookup_mode": "error_5xx"}})  # stays UNKNOWN

    call_command("reconcile", "--once", stdout=open("/dev/null", "w"))
    after_first = _snapshot()
    events_after_first = AttemptEvent.objects.count()
    effects_after_first = demo.summary()
    call_command("reconcile", "--once", stdout=open("/dev/null", "w"))

    assert _snapshot() == after_first
    assert AttemptEvent.objects.count() == events_after_first
    assert demo.summary() == effects_after_first
    assert Attempt.objects.get(pk=found.pk).state == State.OUTCOME_CONFIRMED
    assert Attempt.objects.get(pk=slow.pk).state == State.UNKNOWN


def test_a_leased_attempt_is_not_claimed_until_its_lease_expires(wired, demo) -> None:
    from reconciliation.reconciler import Reconciler

    attempt = make_due(unknown(wired, "update_crm", "c:lease", {"a": 1}))
    demo.inject("update_crm", "c:lease", {"a": 1})
    other = Reconciler(worker_id="other")
    lease = timezone.timedelta(seconds=60)
    [claimed] = other.claim(cutoff=timezone.now(), limit=10, lease=lease)
    assert claimed.version == attempt.version + 1  # the claim is the fencing token

    assert Reconciler(worker_id="me").run_pass().claimed == 0
    assert Attempt.objects.get(pk=attempt.pk).state == State.UNKNOWN

    Attempt.objects.filter(pk=attempt.pk).update(
        lease_until=timezone.now() - timezone.timedelta(seconds=1)
    )
    assert Reconciler(worker_id="me").run_pass().outcomes["confirmed"] == 1
    # The first worker's lease was overtaken: its fenced move changes nothing.
    from attempts import states

    with pytest.raises(states.StaleAttempt), write_transaction():
        states.move(claimed, State.MANUAL_REVIEW, actor=Actor.worker("other"))
    assert Attempt.objects.get(pk=attempt.pk).state == State.OUTCOME_CONFIRMED


def test_sigterm_stops_the_loop_cleanly_after_in_flight_work(transactional_db, demo) -> None:
    world = make_world()
    demo.configure_tools(timeout=10)
    attempts = [make_due(unknown(world, "open_ticket", f"t:{i}", {"i": i})) for i in range(4)]
    for i in range(4):
        demo.inject("open_ticket", f"t:{i}", {"i": i})
    demo.control(tools={"open_ticket": {"lookup_latency_ms": 1500}})
    process = start_manage(
        ["reconcile", "--interval", "0.2", "--worker-id", "looper"],
        env=child_env(),
    )
    deadline = time.monotonic() + 30
    while not Attempt.objects.filter(lease_owner="looper").exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the worker never claimed anything"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    assert "(stopped)" in out
    # In-flight lookups were finished and recorded, not abandoned half-way.
    for attempt in attempts:
        attempt.refresh_from_db()
        assert attempt.state == State.OUTCOME_CONFIRMED
        assert attempt.lease_owner == ""
    heartbeat = WorkerHeartbeat.objects.get(worker_id="looper")
    assert heartbeat.settled_total == 4
