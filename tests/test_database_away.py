"""The database away is a 503, not a 500 (issue 23): a lost or refused database connection on
an API call answers ``503 ledger_unavailable`` with ``Retry-After`` (JSON), a dashboard page a
small HTML page that says so, the next request gets a new connection, and the reconcile worker
waits and resumes without exiting.

The real test restarts (and stops, then starts) a throwaway PostgreSQL 15 cluster of its own on a
free port, under load from agents through gunicorn; never the shared server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from django.db import OperationalError
from django.test import Client

from bench.private_postgres import PG_BIN
from tests.conftest import REPO


def test_a_page_whose_database_connection_fails_is_a_small_503_page(world, monkeypatch) -> None:
    from attempts.views import overview

    client = Client(raise_request_exception=False)
    client.force_login(world.operator)

    def lost(*args, **kwargs):
        raise OperationalError("connection failed")

    monkeypatch.setattr(overview, "render", lost)
    response = client.get("/")
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert b"The ledger is unavailable" in response.content


def _call(url: str, token: str, body: dict | None = None, cookie: str = "") -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return answer.status, {"headers": dict(answer.headers), "body": answer.read()}
    except urllib.error.HTTPError as error:
        return error.code, {"headers": dict(error.headers), "body": error.read()}
    except OSError:
        return 0, {}


@pytest.mark.slow
def test_a_postgresql_restart_under_load_answers_503_and_everything_resumes(
    tmp_path: Path,
) -> None:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL server binaries are not installed ({PG_BIN})")
    sys.path.insert(0, str(REPO))
    from bench.private_postgres import Server, free_port
    from bench.soak import BIN, stop_processes

    # Its own folder outside pytest's (the postgres user must be able to reach it).
    root = Path(tempfile.mkdtemp(prefix="ledgerweb-pg-"))
    postgres = Server(root, "pgdata")
    postgres.create("away")
    web_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERWEB_")}
    env.update(
        DATABASE_URL=postgres.url,
        DJANGO_SETTINGS_MODULE="ledgerweb.settings",
        PYTHONPATH=str(REPO),
        LEDGERWEB_DATA_DIR=str(tmp_path / "data"),
        LEDGERWEB_BIND=f"127.0.0.1:{web_port}",
        LEDGERWEB_WORKERS="2",
        LEDGERWEB_THREADS="4",
        LEDGERWEB_LOG_LEVEL="WARNING",
        LEDGERWEB_ACCESS_LOG=str(tmp_path / "access.log"),
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    processes: list[subprocess.Popen] = []
    try:
        manage("migrate", "--no-input", "-v", "0")
        manage("seed_demo", "--provider-url", "http://127.0.0.1:9")
        token = manage("create_agent_token", "away", "--tenant", "acme", "--quiet").strip()
        web_log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 (kept by the child)
        processes.append(
            subprocess.Popen(
                [str(BIN / "gunicorn"), "-c", "ledgerweb/gunicorn.conf.py", "ledgerweb.wsgi"],
                cwd=REPO,
                env=env,
                stdout=web_log,
                stderr=web_log,
            )
        )
        worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "reconcile", "--interval", "0.2", "--worker-id", "w"],
            cwd=REPO,
            env=env,
            stdout=worker_log,
            stderr=worker_log,
        )
        processes.append(worker)
        base = f"http://127.0.0.1:{web_port}"
        deadline = time.monotonic() + 60
        while _call(f"{base}/api/v1/openapi.json", "")[0] != 200:
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.2)

        statuses: Counter[int] = Counter()
        unavailable: list[dict] = []
        stop = threading.Event()

        def agent(n: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                body = {
                    "tenant": "acme",
                    "task_id": f"t{n}",
                    "tool_name": "open_ticket",
                    "idempotency_key": f"away:{n}:{i}",
                    "args": {"n": n, "i": i},
                }
                status, answer = _call(f"{base}/api/v1/attempts", token, body)
                statuses[status] += 1
                if status == 503:
                    unavailable.append(answer)
                time.sleep(0.02)

        agents = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
        for thread in agents:
            thread.start()
        time.sleep(1.5)
        postgres.restart()  # terminates every connection, refuses new ones while it restarts
        time.sleep(1.5)
        # Stopped outright: every call meanwhile is a 503, the API's JSON and a page's HTML.
        postgres.stop()
        api_status, api_answer = _call(f"{base}/api/v1/attempts?idempotency_key=x", token)
        page_status, page_answer = _call(f"{base}/", "", cookie="sessionid=" + "x" * 32)
        time.sleep(1.0)
        postgres.start()
        time.sleep(2.5)
        stop.set()
        for thread in agents:
            thread.join(timeout=30)

        assert statuses[500] == 0, statuses
        assert statuses[201] > 0, statuses
        assert api_status == 503, api_answer
        assert json.loads(api_answer["body"])["error"]["code"] == "ledger_unavailable"
        assert api_answer["headers"]["Retry-After"] == "2"
        assert page_status == 503 and b"The ledger is unavailable" in page_answer["body"]
        assert all(
            json.loads(a["body"])["error"]["code"] == "ledger_unavailable" for a in unavailable
        )
        # The connection is replaced: calls succeed again after the restart.
        status, _ = _call(
            f"{base}/api/v1/attempts",
            token,
            {
                "tenant": "acme",
                "task_id": "t",
                "tool_name": "open_ticket",
                "idempotency_key": "away:after",
                "args": {},
            },
        )
        assert status == 201
        # The worker waited and resumed: still running, and its heartbeat is fresh again.
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        deadline = time.monotonic() + 20
        while True:
            status, answer = _call(f"{base}/healthz", "")
            if status == 200 and json.loads(answer["body"]).get("worker") == "ok":
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.3)
    finally:
        stop_processes(processes)
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
