"""``ledgerweb demo`` (and ``scripts/run``): the whole product from one command (docs/run.md).

migrate -> demo provider -> demo world and logins (``seed_demo``) -> static files -> dashboard
(gunicorn) -> demo agents (first run, or when the queues are empty) -> reconcile worker. Ctrl-C
(or SIGTERM) stops everything it started within 15 seconds, even on a busy machine: each child
runs in its own process group (gunicorn with its workers), which gets SIGTERM and, 8 seconds
later, SIGKILL. A reconcile worker that dies is started again, with ``--restarts N --last-exit``
so that ``/healthz`` says so. Running it again reuses the database and the users.
Works from a checkout and from an installed package alike: every step is ``python -m ledgerweb``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ledgerweb.paths import default_data_dir
from ledgerweb.settings_reference import read
from reconciliation.demo_provider import wait_for_port_file

PR_SET_PDEATHSIG = 1
# Seconds children get to stop after SIGTERM before SIGKILL (well within 15 s under load).
STOP_GRACE = 8.0
# The longest a setup step (migrate, seed_demo, demo_agents...) may take before it is stopped.
STEP_TIMEOUT = 30 * 60
# Pause before restarting a worker that died; doubles while it keeps dying at once, up to 30 s.
RESTART_PAUSE = 1.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Children get SIGTERM if this process dies without stopping them (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Stop(Exception):
    """SIGINT or SIGTERM: stop everything, exit with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


class DemoRun:
    def __init__(self, *, demo: bool) -> None:
        self.demo = demo
        self.data = Path(os.environ.setdefault("LEDGERWEB_DATA_DIR", str(default_data_dir())))
        self.bind = os.environ.setdefault("LEDGERWEB_BIND", "127.0.0.1:8000")
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        # A local run opens /metrics to loopback clients; a deployment sets a metrics token.
        os.environ.setdefault("LEDGERWEB_METRICS_ALLOW_LOOPBACK", "1")
        self.logs = self.data / "logs"
        self.children: list[subprocess.Popen] = []
        # A local run signs its checkpoints with a key made once in the data folder (mode
        # 0600), so /log/ and receipts work out of the box; a deployment configures its own.
        self.log_key = None
        if not os.environ.get("LEDGERWEB_TLOG_KEY_FILE") and not os.environ.get(
            "LEDGERWEB_TLOG_SIGN_COMMAND"
        ):
            self.log_key = self.data / "log_signing.key"
            os.environ["LEDGERWEB_TLOG_KEY_FILE"] = str(self.log_key)

    def say(self, text: str) -> None:
        print(f"run: {text}", flush=True)

    def ledgerweb(self, *args: str) -> None:
        """A step that must succeed before the next one."""
        command = [sys.executable, "-m", "ledgerweb", *args]
        try:
            done = subprocess.run(command, check=False, timeout=STEP_TIMEOUT)  # noqa: S603
        except subprocess.TimeoutExpired:
            raise SystemExit(
                f"run: `ledgerweb {' '.join(args)}` did not finish within "
                f"{STEP_TIMEOUT // 60} minutes: stopped"
            ) from None
        if done.returncode != 0:
            raise SystemExit(f"run: `ledgerweb {' '.join(args)}` failed ({done.returncode})")

    def start(self, log: str, *args: str) -> subprocess.Popen:
        with open(self.logs / log, "ab") as out:
            child = subprocess.Popen(
                [sys.executable, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads yet: safe)
                start_new_session=True,  # its own process group: stopped with its children
            )
        self.children.append(child)
        return child

    def run(self) -> int:
        for name in (signal.SIGINT, signal.SIGTERM):
            signal.signal(name, self._on_signal)
        try:
            return self._run()
        except Stop as stop:
            return 128 + stop.signum
        finally:
            self.stop_all()

    def _on_signal(self, signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Stop(signum)

    def _run(self) -> int:
        (self.data / "demo").mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.say(f"data in {self.data}")
        self.ledgerweb("migrate", "--no-input", "-v", "0")
        if self.log_key is not None:
            self.ledgerweb("ledger_log", "genkey", "--out", str(self.log_key), "--if-missing")
        provider_url = self.start_provider() if self.demo else ""
        if provider_url:
            self.ledgerweb("seed_demo", "--provider-url", provider_url)
        self.ledgerweb("collectstatic", "--no-input", "-v", "0")
        web = self.start("gunicorn.log", "-m", "ledgerweb", "serve", "--skip-collectstatic")
        base = f"http://{self.bind}"
        if not self.wait_for_http(f"{base}/login/", 60, web):
            self.say("the dashboard did not start (logs/gunicorn.log)")
            return 1
        if provider_url:
            tasks = str(read("LEDGERWEB_DEMO_TASKS"))
            self.ledgerweb(
                *("demo_agents", "--api", base, "--provider", provider_url, "--if-queues-empty"),
                *("--tasks", tasks, "--crash-rate", "0.15", "--timeout-rate", "0.15"),
                *("--seed", "11"),
            )
        worker = self.start_worker()
        self.say("reconcile worker started, restarted if it dies (logs/reconcile.log)")
        self.say(f"dashboard on {base}/  (health {base}/healthz, metrics {base}/metrics)")
        if not self.demo:
            self.say("no demo users; create a login with: ledgerweb createsuperuser")
        self.say(f"logs in {self.logs}; Ctrl-C stops everything")
        restarts, pause, started = 0, RESTART_PAUSE, time.monotonic()
        while web.poll() is None:  # the dashboard dying ends the run; the worker is restarted
            time.sleep(1)
            code = worker.poll()
            if code is None:
                continue
            ended = f"signal {-code}" if code < 0 else f"status {code}"
            last_exit = f"{'killed by' if code < 0 else 'exited with'} {ended} at {_utc_now()}"
            pause = RESTART_PAUSE if time.monotonic() - started > 60 else min(30.0, pause * 2)
            self.say(f"the reconcile worker {last_exit}; restarting it in {pause:.0f}s")
            time.sleep(pause)
            restarts += 1
            worker, started = self.start_worker(restarts, last_exit), time.monotonic()
        self.say("the dashboard stopped (logs/gunicorn.log)")
        return 1

    def start_worker(self, restarts: int = 0, last_exit: str = "") -> subprocess.Popen:
        args = ["-m", "ledgerweb", "worker"]
        if restarts:
            args += ["--restarts", str(restarts), "--last-exit", last_exit]
        return self.start("reconcile.log", *args)

    def start_provider(self) -> str:
        port = str(read("LEDGERWEB_DEMO_PROVIDER_PORT"))
        if port != "0" and not _port_free(int(port)):
            port = "0"
        port_file = self.data / "demo" / "provider.port"
        port_file.unlink(missing_ok=True)
        provider = self.start(
            "provider.log",
            *("-m", "reconciliation.demo_provider"),
            *("--db", str(self.data / "demo" / "provider.sqlite3")),
            *("--port", port, "--port-file", str(port_file), "--seed", "7"),
        )
        listening = wait_for_port_file(port_file, provider, seconds=10, poll=0.1)
        if listening is None:
            raise SystemExit("run: the demo provider did not start (logs/provider.log)")
        url = f"http://127.0.0.1:{listening}"
        self.say(f"demo provider on {url}")
        return url

    @staticmethod
    def wait_for_http(url: str, seconds: int, child: subprocess.Popen) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (our own 127.0.0.1)
                    return True
            except OSError:
                if child.poll() is not None:
                    return False
                time.sleep(0.2)
        return False

    def stop_all(self) -> None:
        alive = [child for child in self.children if child.poll() is None]
        if not alive:
            return
        print(f"\nrun: stopping ({' '.join(str(child.pid) for child in alive)})", flush=True)
        for child in alive:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for child in alive:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of each group (a slow child, or a grandchild such as a gunicorn
        # worker whose master already exited) is killed.
        for child in self.children:
            _signal_group(child, signal.SIGKILL)
        for child in alive:
            child.wait()


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_demo(argv: list[str]) -> int:
    """Entry point of ``ledgerweb demo``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="ledgerweb demo",
        description=__doc__.split("\n\n")[0],
        epilog="Environment: LEDGERWEB_BIND (127.0.0.1:8000), LEDGERWEB_DATA_DIR, "
        "LEDGERWEB_DEMO_PROVIDER_PORT (8765; a free one if taken), LEDGERWEB_DEMO_TASKS (60), "
        "LEDGERWEB_DEMO_PASSWORD (generated once).",
    )
    parser.add_argument(
        "--no-demo", action="store_true", help="no demo provider, no demo data, no demo agents"
    )
    options = parser.parse_args(argv)
    return DemoRun(demo=not options.no_demo).run()
