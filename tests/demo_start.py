"""The demo started as a newcomer starts it, for the tests that run it whole
(tests/test_run_command.py: ``scripts/run`` in a fresh clone; tests/reconciliation/
test_demo_run_approval.py: ``ledgerweb demo``): its environment, its start, a browser that
uses the dashboard's own forms, and Ctrl-C."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

PASSWORD = "demo-password-for-tests"
START_TIMEOUT = 420


# A test that starts the demo: slow, and on SQLite only (the demo runs on its own SQLite
# database, whatever the suite's; the SQLite pass covers it).
DEMO_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")),
        reason="the demo runs on its own SQLite database; the SQLite pass covers it",
    ),
]


def demo_env(data: Path, port: int, *, tasks: int, **extra: str) -> dict[str, str]:
    """This process's environment without its ledgerweb settings, and the demo's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERWEB_", "DATABASE_URL"))}
    env.update(
        LEDGERWEB_DATA_DIR=str(data),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_DEMO_PROVIDER_PORT="0",
        LEDGERWEB_DEMO_PASSWORD=PASSWORD,
        LEDGERWEB_DEMO_TASKS=str(tasks),
        LEDGERWEB_WORKERS="2",
        LEDGERWEB_THREADS="2",
        **extra,
    )
    return env


def start(command: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the demo in its own process group, its output in ``log``, and wait until it says
    where the dashboard is."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT
    while "run: dashboard on" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            interrupt(process)
            raise AssertionError(f"no dashboard from {command[-1]}:\n{log.read_text()}")
        time.sleep(0.5)
    return process


def interrupt(process: subprocess.Popen) -> int:
    """Ctrl-C, if it still runs; its exit status (the whole group is killed if it hangs)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise


class Browser:
    """A cookie-keeping client that uses the dashboard's own forms (login, approve)."""

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

    def post(self, path: str, page: str, fields: dict[str, str]) -> tuple[int, str]:
        """Submit a form of ``page`` (its CSRF token) to ``path``."""
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only)
            self.base + path, data=data, headers={"Referer": self.base + path}
        )
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def login(self, username: str, password: str = PASSWORD) -> tuple[int, str]:
        _, page = self.get("/login/")
        return self.post("/login/", page, {"username": username, "password": password})
