"""The README's run command, end to end, in a fresh clone: scripts/run creates what it needs,
serves the dashboard, a demo user logs in and finds genuine UNKNOWN work; SIGINT stops every
process it started.

Slow (it starts the demo provider, gunicorn and the demo agents). To save the install, the
clone reuses this interpreter's virtualenv (LEDGERWEB_VENV); set LEDGERWEB_TEST_FRESH_VENV=1 to
let scripts/run create and install the clone's own .venv as a newcomer's machine would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO, free_port
from tests.demo_start import DEMO_MARKS, PASSWORD, Browser, demo_env, interrupt, start

pytestmark = DEMO_MARKS
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


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_run_command_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    port = free_port()
    data = tmp_path / "data"
    env = demo_env(data, port, tasks=40)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if os.environ.get("LEDGERWEB_TEST_FRESH_VENV") != "1":
        env["LEDGERWEB_VENV"] = str(Path(sys.executable).parent.parent)
    log = tmp_path / "run.out"
    process = start(["scripts/run"], cwd=clone, env=env, log=log)
    try:
        output = log.read_text()
        assert re.search(rf"reviewer +password {PASSWORD}", output), output
        assert "demo agents: 40 tasks" in output

        browser = Browser(f"http://127.0.0.1:{port}")
        status, page = browser.login("reviewer")
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
        code = interrupt(process)
    assert code == 130, log.read_text()
    assert "run: stopping" in log.read_text()
    time.sleep(1)
    assert not accepts(port), "the dashboard still answers after Ctrl-C"
    provider_port = int((data / "demo" / "provider.port").read_text())
    assert not accepts(provider_port), "the demo provider still answers after Ctrl-C"
