"""The README's run command, end to end, in a fresh clone: scripts/run creates what it needs,
serves the dashboard, a demo user logs in and finds genuine UNKNOWN work; SIGINT stops every
process it started.

Slow (it starts the demo provider, gunicorn and the demo agents). To save the install, the
clone reuses this interpreter's virtualenv (LEDGERWEB_VENV); set LEDGERWEB_TEST_FRESH_VENV=1 to
let scripts/run create and install the clone's own .venv as a newcomer's machine would.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="the clone runs on its own SQLite database; the SQLite pass covers it",
    ),
]
PASSWORD = "demo-password-for-tests"
START_TIMEOUT = 420
STOP_WITHIN = 15.0


def wait_for(probe, seconds: float, message: str):
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, message
        time.sleep(0.5)


def worker_pids(data: Path) -> list[int]:
    with sqlite3.connect(data / "ledger.sqlite3") as db:
        return [row[0] for row in db.execute("SELECT pid FROM reconciliation_workerheartbeat")]


def restarted(browser: Browser) -> bool:
    status, body = browser.get("/healthz")
    return status == 200 and json.loads(body).get("worker_restarts", 0) >= 1


def load_the_machine() -> list[subprocess.Popen]:
    """Busy loops on every core, twice over, as a loaded machine has."""
    count = 2 * (os.cpu_count() or 2)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Browser:
    """Cookie-keeping HTTP client enough to log in through the real login form."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def login(self, username: str, password: str) -> tuple[int, str]:
        _, page = self.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token}
        ).encode()
        request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only)
            self.base + "/login/", data=data, headers={"Referer": self.base + "/login/"}
        )
        with self.opener.open(request, timeout=30) as response:
            return response.status, response.read().decode()


def test_run_command_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    port = free_port()
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERWEB_", "DATABASE_URL"))}
    env.update(
        LEDGERWEB_DATA_DIR=str(data),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_DEMO_PROVIDER_PORT="0",
        LEDGERWEB_DEMO_PASSWORD=PASSWORD,
        LEDGERWEB_DEMO_TASKS="40",
        LEDGERWEB_WORKERS="2",
        LEDGERWEB_THREADS="2",
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if os.environ.get("LEDGERWEB_TEST_FRESH_VENV") != "1":
        env["LEDGERWEB_VENV"] = str(Path(sys.executable).parent.parent)
    log = tmp_path / "run.out"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["scripts/run"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while "run: dashboard on" not in log.read_text():
            assert process.poll() is None, f"scripts/run exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no dashboard in time:\n{log.read_text()}"
            time.sleep(0.5)
        output = log.read_text()
        assert re.search(rf"reviewer +password {PASSWORD}", output), output
        assert "demo agents: 40 tasks" in output

        browser = Browser(f"http://127.0.0.1:{port}")
        status, page = browser.login("reviewer", PASSWORD)
        assert status == 200 and "Log out" in page, page[:500]

        # The demo agents' UNKNOWN work, with its genuine history, is in the database...
        with sqlite3.connect(data / "ledger.sqlite3") as db:
            unknown = [
                row[0]
                for row in db.execute(
                    "SELECT attempt_id FROM attempts_attempt WHERE state = 'UNKNOWN'"
                )
            ]
            history = db.execute(
                "SELECT count(*) FROM attempts_attemptevent e JOIN attempts_attempt a "
                "ON a.id = e.attempt_id WHERE a.state = 'UNKNOWN' AND e.to_state = 'UNKNOWN' "
                "AND e.actor_kind = 'agent'"
            ).fetchone()[0]
        assert unknown, output
        assert history >= len(unknown)
        # ...and the logged-in reviewer sees it in the UNKNOWN queue.
        status, queue = browser.get("/queues/unknown/")
        assert status == 200
        assert any(attempt_id in queue for attempt_id in unknown)

        assert browser.get("/healthz")[0] in (200, 503)
        metrics_status, metrics = browser.get("/metrics")
        assert metrics_status == 200 and 'state="UNKNOWN"' in metrics

        # A reconcile worker that dies is started again, and /healthz says so.
        worker_pid = wait_for(lambda: worker_pids(data), 60, "no worker heartbeat")[0]
        os.kill(worker_pid, signal.SIGKILL)
        wait_for(lambda: restarted(browser), 90, "the worker was not restarted")
        _, health = browser.get("/healthz")
        assert "killed by signal 9" in json.loads(health)["worker_last_exit"]

        # Ctrl-C on a busy machine still stops everything quickly.
        burners = load_the_machine()
        try:
            time.sleep(2)
            process.send_signal(signal.SIGINT)
            interrupted = time.monotonic()
            try:
                code = process.wait(timeout=STOP_WITHIN + 20)
            except subprocess.TimeoutExpired:
                code = None
            stopped_after = time.monotonic() - interrupted
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
        assert code is not None, f"scripts/run did not stop:\n{log.read_text()}"
        assert stopped_after <= STOP_WITHIN, f"stopping took {stopped_after:.1f}s"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert code == 130, log.read_text()
    assert "run: stopping" in log.read_text()
    time.sleep(1)
    assert not accepts(port), "the dashboard still answers after Ctrl-C"
    provider_port = int((data / "demo" / "provider.port").read_text())
    assert not accepts(provider_port), "the demo provider still answers after Ctrl-C"
