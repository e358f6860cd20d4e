"""The probes a deployment wires separately: /livez (the process answers), /readyz (it can
serve: the database answers) and the worker's own heartbeat check (``worker_health``, the worker
container's healthcheck). A dead reconcile worker makes the worker unhealthy and /healthz say so;
it never takes the web tier out of service."""

from __future__ import annotations

import datetime as dt
import socket

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from reconciliation.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db


def beat(seconds_ago: float, host: str) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        worker_id=f"{host}:1",
        defaults={
            "hostname": host,
            "pid": 1,
            "started_at": now,
            "last_seen": now - dt.timedelta(seconds=seconds_ago),
        },
    )


def test_a_stale_worker_fails_healthz_but_not_readiness_or_liveness(client, settings) -> None:
    settings.OPS = {**settings.OPS, "HEARTBEAT_MAX_AGE": 60, "HEALTHZ_REQUIRE_WORKER": True}
    beat(600, socket.gethostname())
    assert client.get("/healthz").status_code == 503
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ok", "database": "ok"}
    assert client.get("/livez").status_code == 200
    assert ready["Cache-Control"].startswith("no-store") or "no-store" in ready["Cache-Control"]


def test_readiness_fails_without_the_database(client, monkeypatch) -> None:
    from django.db import DatabaseError, connection

    def broken(*args, **kwargs):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(connection, "cursor", broken)
    assert client.get("/readyz").status_code == 503
    assert client.get("/livez").status_code == 200


def test_worker_health_reads_this_hosts_heartbeat(settings) -> None:
    settings.OPS = {**settings.OPS, "HEARTBEAT_MAX_AGE": 60}
    host = socket.gethostname()
    with pytest.raises(CommandError, match=f"no reconcile worker has beaten on host {host}"):
        call_command("worker_health")
    beat(5, "another-host")
    with pytest.raises(CommandError, match="no reconcile worker has beaten"):
        call_command("worker_health")
    call_command("worker_health", "--any-host")
    beat(600, host)
    with pytest.raises(CommandError, match=r"is 600 s old \(more than 60 s\)"):
        call_command("worker_health")
    beat(3, host)
    call_command("worker_health")
