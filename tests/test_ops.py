"""/healthz and /metrics."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from attempts import ledger
from attempts.models import State
from attempts.states import Actor
from reconciliation.models import WorkerHeartbeat
from tests.conftest import agent_intent

pytestmark = pytest.mark.django_db


@pytest.fixture
def open_metrics(settings):
    """A deployment that opened /metrics to loopback clients explicitly."""
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": True}


def beat(seconds_ago: float, worker: str = "w1") -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker,
        defaults={
            "hostname": "h",
            "pid": 1,
            "started_at": now,
            "last_seen": now - dt.timedelta(seconds=seconds_ago),
            "lookups_total": 7,
            "settled_total": 3,
        },
    )


def test_healthz_needs_a_fresh_worker_heartbeat(client) -> None:
    missing = client.get("/healthz")
    assert (missing.status_code, missing.json()["worker"]) == (503, "missing")
    beat(5)
    ok = client.get("/healthz")
    assert (ok.status_code, ok.json()["status"], ok.json()["database"]) == (200, "ok", "ok")
    beat(600)
    stale = client.get("/healthz")
    assert (stale.status_code, stale.json()["worker"]) == (503, "stale")


def test_healthz_says_when_a_supervisor_restarted_the_worker(client) -> None:
    beat(1)
    assert "worker_last_exit" not in client.get("/healthz").json()
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        worker_id="w2",
        hostname="h",
        pid=2,
        started_at=now,
        last_seen=now,
        restarts=3,
        last_exit="killed by signal 9 at 2026-12-01T02:00:00Z",
    )
    body = client.get("/healthz").json()
    assert body["worker"] == "ok"
    assert body["worker_restarts"] == 3
    assert body["worker_last_exit"] == "killed by signal 9 at 2026-12-01T02:00:00Z"


def test_healthz_without_worker_requirement(client, settings) -> None:
    settings.OPS = {**settings.OPS, "HEALTHZ_REQUIRE_WORKER": False}
    assert client.get("/healthz").status_code == 200


def parse(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_counts_attempts_by_state_tenant_and_tool(client, world, open_metrics) -> None:
    agent = world.agent
    for n in range(3):
        attempt, _ = agent_intent(world, f"k{n}", tool="open_ticket", args={"n": n})
    ledger.claim_dispatch(attempt, actor=agent)
    ledger.mark_unknown(attempt, reason="timeout", actor=agent)
    confirmed, _ = agent_intent(world, "done", tool="open_ticket", args={})
    ledger.claim_dispatch(confirmed, actor=agent)
    ledger.confirm(confirmed, result_ref="r", actor=agent)
    beat(2)
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse(response.content.decode())
    assert samples['ledger_attempts{state="INTENT_RECORDED",tenant="acme"}'] == 2
    assert samples['ledger_attempts{state="UNKNOWN",tenant="acme"}'] == 1
    assert (
        samples['ledger_open_attempts{state="INTENT_RECORDED",tenant="acme",tool="open_ticket"}']
        == 2
    )
    assert samples['ledger_open_attempts{state="UNKNOWN",tenant="acme",tool="open_ticket"}'] == 1
    assert samples['ledger_attempts{state="OUTCOME_CONFIRMED",tenant="acme"}'] == 1
    assert not [name for name in samples if "OUTCOME_CONFIRMED" in name and "open" in name]
    assert samples["ledger_unknown_oldest_age_seconds"] >= 0
    assert samples["ledger_workers_alive"] == 1
    assert samples["ledger_reconcile_lookups_total"] == 7
    assert samples['ledger_worker_heartbeat_age_seconds{worker="w1"}'] >= 2
    assert "# TYPE ledger_reconcile_lag_seconds gauge" in response.content.decode()
    assert State.UNKNOWN in response.content.decode()


def test_reconcile_lag_reports_overdue_work(client, world, open_metrics) -> None:
    attempt, _ = agent_intent(world, "k", tool="open_ticket", args={})
    type(attempt).objects.filter(pk=attempt.pk).update(
        next_check_at=timezone.now() - dt.timedelta(seconds=90)
    )
    samples = parse(client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode())
    assert samples["ledger_reconcile_lag_seconds"] >= 90
    assert samples["ledger_reconcile_due_attempts"] == 1


def test_metrics_need_the_token_by_default_even_from_loopback(client) -> None:
    """Behind a reverse proxy on the same host every client is loopback: closed by default."""
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 403
    assert b"ledger_attempts" not in response.content


def test_metrics_from_elsewhere_needs_the_metrics_token(client, settings) -> None:
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": True}
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.5").status_code == 403
    settings.OPS = {**settings.OPS, "METRICS_TOKEN": "s3cret-metrics"}
    wrong = client.get("/metrics", REMOTE_ADDR="10.0.0.5", headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 403
    right = client.get(
        "/metrics", REMOTE_ADDR="10.0.0.5", headers={"Authorization": "Bearer s3cret-metrics"}
    )
    assert right.status_code == 200
    settings.OPS = {**settings.OPS, "METRICS_ALLOW_LOOPBACK": False}
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


def test_metrics_count_recent_lookup_answers_by_kind(client, world, open_metrics) -> None:
    from attempts.locking import write_transaction
    from attempts.states import move

    attempt, _ = agent_intent(world, "k", tool="open_ticket", args={})
    worker = Actor.worker("w1")
    with write_transaction():
        for answer in ("found", "unavailable", "unavailable", "not_found"):
            move(
                attempt,
                None,
                action="attempt.lookup",
                actor=worker,
                details={"lookup": {"answer": answer, "latency_ms": 3}},
            )
        # Not a lookup, and an agent's event: neither is counted.
        move(attempt, None, action="attempt.note", actor=worker, details={"x": 1})
        move(
            attempt,
            None,
            action="attempt.lookup",
            actor=Actor.agent("a"),
            details={"lookup": {"answer": "found"}},
        )
    samples = parse(client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode())
    assert samples['ledger_reconcile_lookup_answers_recent{answer="found"}'] == 1
    assert samples['ledger_reconcile_lookup_answers_recent{answer="unavailable"}'] == 2
    assert samples['ledger_reconcile_lookup_answers_recent{answer="not_found"}'] == 1


def metric_families(source: str) -> set[str]:
    """The names of the families ``/metrics`` writes (each ``out.family("name", ...)``)."""
    import ast

    return {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "family"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_every_metric_is_documented() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    exported = metric_families((root / "ledgerweb" / "ops.py").read_text())
    assert len(exported) > 20
    rows = [line for line in (root / "docs/operations.md").read_text().splitlines() if "|" in line]
    documented = {name for row in rows for name in re.findall(r"`(ledger_[a-z_]+)", row)}
    assert sorted(exported - documented) == []
