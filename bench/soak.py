"""Soak test: agents through gunicorn at a steady rate while things are killed at random.

For ``--minutes`` (default 10; ``--seconds`` for a short run), agent threads call the ledger's
HTTP API through gunicorn with ``ledgerweb_client`` (record, claim, send to the demo provider
with the idempotency key, attach the id, confirm) at ``--rate`` tool calls per second, some with
keys in other scripts. Meanwhile a chaos thread SIGKILLs, at random, a gunicorn worker (gunicorn
starts another), the reconcile worker and the demo provider (both started again by the soak), and
on PostgreSQL restarts the database server once. The soak runs its own throwaway PostgreSQL
cluster on a free port (``--database postgres``), never the system one.

At the end everything is brought back, recovery is given ``--drain`` seconds to settle what is
left, and the soak prints what it did (requests, kills, restarts, errors seen by agents) and the
invariants, each of which must be 0 (or true):

- acknowledged intents lost: keys the API answered for, missing from the ledger;
- duplicate non-idempotent effects: keys of tools whose provider does not honour keys, performed
  more than once;
- unsettled outside MANUAL_REVIEW: attempts still INTENT_RECORDED, DISPATCHED, UNKNOWN or
  FAILED_RETRYABLE;
- chain verified: ``manage.py verify_audit`` passes.

Exit status 0 when every invariant holds. ``tests/test_soak.py`` runs a short version.

Usage: .venv/bin/python bench/soak.py [--minutes 10] [--rate 10] [--database sqlite|postgres]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BIN = Path(sys.executable).parent

from bench.private_postgres import Server, free_port  # noqa: E402
from ledgerweb_client import (  # noqa: E402
    LedgerClient,
    LedgerError,
    LedgerUnavailable,
    ProviderLostResponse,
    ProviderRefused,
    ProviderTimeout,
    SendResult,
)

TENANTS = ("acme", "globex")
# Tool -> whether the provider honours its keys. Tools that do not are where a second send
# would be a second effect: the duplicate invariant counts them.
TOOLS = {"update_crm": True, "open_ticket": False, "charge_card": False}
KEY_SCRIPTS = ("", "請求書", "фактура", "\U0001f680", "e\u0301")
CHAOS = ("gunicorn_worker", "reconcile_worker", "demo_provider")
UNSETTLED = ("INTENT_RECORDED", "DISPATCHED", "UNKNOWN", "FAILED_RETRYABLE")


def stop_processes(processes: list[subprocess.Popen], timeout: float = 15) -> None:
    """Terminate every one of ``processes``, then wait for each; one that outlives ``timeout``
    is killed."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()


def say(message: str) -> None:
    print(f"soak: {message}", flush=True)


@dataclass
class Tally:
    """What happened, counted from several threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    acknowledged: set[str] = field(default_factory=set)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def error(self, name: str) -> None:
        with self.lock:
            self.errors[name] += 1


class Soak:
    def __init__(self, options: argparse.Namespace, workdir: Path) -> None:
        self.options = options
        self.workdir = workdir
        self.rng = random.Random(options.seed)
        self.tally = Tally()
        self.stop_chaos = threading.Event()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: Counter[str] = Counter()
        self.kills: Counter[str] = Counter()
        self.postgres: Server | None = None
        self.chaos_failed = False
        self.provider_port = free_port()
        self.web_port = free_port()
        self.env = dict(os.environ)
        for name in list(self.env):
            if name.startswith("LEDGERWEB_") or name == "DATABASE_URL":
                del self.env[name]
        self.env.update(
            DJANGO_SETTINGS_MODULE="ledgerweb.settings",
            PYTHONPATH=str(REPO),
            LEDGERWEB_DATA_DIR=str(workdir),
            LEDGERWEB_BIND=f"127.0.0.1:{self.web_port}",
            LEDGERWEB_WORKERS=str(options.web_workers),
            LEDGERWEB_THREADS="4",
            LEDGERWEB_ACCESS_LOG=str(workdir / "access.log"),
            LEDGERWEB_LOG_LEVEL="WARNING",
            # Recovery within the soak's minutes, not the production defaults' hours.
            LEDGERWEB_STALE_AFTER="6",
            LEDGERWEB_BACKOFF_BASE="1",
            LEDGERWEB_BACKOFF_CAP="3",
            LEDGERWEB_DEFAULT_OWNER="admin",
        )
        if options.database == "postgres":
            self.postgres = Server(workdir, "pgdata")
            self.postgres.create("soak")
            self.env["DATABASE_URL"] = self.postgres.url

    # -- processes ----------------------------------------------------------------------------

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=600,
        )

    def spawn(self, name: str) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (kept by the child)
        if name == "demo_provider":
            command = [sys.executable, "-m", "reconciliation.demo_provider"]
            command += ["--db", str(self.workdir / "provider.db"), "--port"]
            command += [str(self.provider_port), "--port-file", str(self.workdir / "provider.port")]
            (self.workdir / "provider.port").unlink(missing_ok=True)
        elif name == "gunicorn":
            command = [str(BIN / "gunicorn"), "-c", "ledgerweb/gunicorn.conf.py", "ledgerweb.wsgi"]
        else:
            # A killed worker's claims wait out their lease: a short one keeps the drain short.
            command = [sys.executable, "manage.py", "reconcile", "--interval", "0.5"]
            command += ["--lease-seconds", "10"]
            command += ["--restarts", str(self.restarts[name])]
        self.processes[name] = subprocess.Popen(
            command, cwd=REPO, env=self.env, stdout=log, stderr=log, start_new_session=True
        )
        if name == "demo_provider":
            self._provider_ready()

    def _provider_ready(self) -> None:
        deadline = time.monotonic() + 30
        while not (self.workdir / "provider.port").exists():
            if time.monotonic() > deadline:
                raise SystemExit("soak: the demo provider did not start")
            time.sleep(0.02)
        patch = {"tools": {tool: {"honour_keys": honour} for tool, honour in TOOLS.items()}}
        request = urllib.request.Request(  # noqa: S310 (127.0.0.1)
            f"http://127.0.0.1:{self.provider_port}/_control",
            data=json.dumps(patch).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).read()  # noqa: S310

    def wait_for_web(self) -> None:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(  # noqa: S310
                    f"http://127.0.0.1:{self.web_port}/api/v1/openapi.json", timeout=2
                ).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("soak: gunicorn did not start") from None
                time.sleep(0.2)

    def supervise(self) -> None:
        """Start again whatever died (gunicorn restarts its own workers)."""
        while not self.stop_chaos.wait(0.3):
            self.revive()

    def revive(self) -> None:
        for name in ("demo_provider", "reconcile_worker", "gunicorn"):
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                self.restarts[name] += 1
                self.spawn(name)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    # -- chaos --------------------------------------------------------------------------------

    def chaos(self, seconds: float) -> None:
        """Kill something every ``--kill-every`` seconds (+-50%); restart PostgreSQL once."""
        try:
            self._chaos(seconds)
        except Exception as exc:  # a soak that silently stops killing would prove nothing
            say(f"chaos failed: {exc!r}")
            self.chaos_failed = True

    def _chaos(self, seconds: float) -> None:
        started = time.monotonic()
        postgres_restarted = self.postgres is None
        targets: list[str] = []
        while True:
            pause = self.options.kill_every * self.rng.uniform(0.5, 1.5)
            if self.stop_chaos.wait(pause):
                return
            if not postgres_restarted and time.monotonic() - started > seconds / 2:
                say("restarting PostgreSQL")
                self.postgres.restart()
                self.restarts["postgres"] += 1
                postgres_restarted = True
                continue
            if not targets:
                # Each target in turn, in a shuffled order: a short run hits all of them.
                targets = self.rng.sample(CHAOS, len(CHAOS))
            target = targets.pop()
            if target == "gunicorn_worker":
                pid = self._gunicorn_worker()
                if pid is None:
                    continue
            else:
                process = self.processes[target]
                if process.poll() is not None:
                    continue
                pid = process.pid
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills[target] += 1
            except ProcessLookupError:
                pass

    def _gunicorn_worker(self) -> int | None:
        master = self.processes["gunicorn"].pid
        try:
            children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        except OSError:
            return None
        return int(self.rng.choice(children)) if children else None

    # -- agents -------------------------------------------------------------------------------

    def agents(self, seconds: float, token: str) -> None:
        local = threading.local()
        base = f"http://127.0.0.1:{self.web_port}"

        def client() -> LedgerClient:
            if not hasattr(local, "client"):
                local.client = LedgerClient(base, token, timeout=15)
            return local.client

        def one_call(n: int) -> None:
            tool = self.rng.choice(list(TOOLS))
            script = self.rng.choice(KEY_SCRIPTS)
            key = f"soak:{tool}:{n}:{script}send" if script else f"soak:{tool}:{n}:send"
            call = {
                "tenant": self.rng.choice(TENANTS),
                "task_id": f"soak-task-{n}",
                "tool_name": tool,
                "idempotency_key": key,
                "args": {"n": n, "note": script or "plain"},
            }
            self.tally.add("tool_calls")
            for attempt_number in range(4):
                try:
                    # Recorded first on its own, so the soak knows the API acknowledged it;
                    # call() records it again (the same attempt comes back) and goes on.
                    client().record_intent(**call)
                    with self.tally.lock:
                        self.tally.acknowledged.add(key)
                    result = client().call(**call, send=self._sender(tool))
                    if result.provider_error is not None:
                        self.tally.error(f"provider:{type(result.provider_error).__name__}")
                    self.tally.add("completed")
                    break
                except LedgerUnavailable:
                    # Every ledger call is idempotent: an agent repeats it after a pause.
                    self.tally.error("LedgerUnavailable")
                    local.__dict__.pop("client", None)
                    time.sleep(0.3 * (attempt_number + 1))
                except LedgerError as exc:
                    self.tally.error(f"{type(exc).__name__}:{exc.code}")
                    break
            else:
                self.tally.add("gave_up")

        with ThreadPoolExecutor(self.options.agents, thread_name_prefix="agent") as pool:
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < seconds:
                due = started + n / self.options.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(one_call, n)
                n += 1

    def _sender(self, tool: str):
        from attempts.canonical import canonical_bytes
        from reconciliation.providers.http import KEY_ENCODING_HEADER, wire_key

        def send(attempt) -> SendResult:
            wire, encoded = wire_key(attempt.idempotency_key)
            headers = {"Content-Type": "application/json", "Idempotency-Key": wire}
            if encoded:
                headers[KEY_ENCODING_HEADER] = "percent"
            connection = http.client.HTTPConnection("127.0.0.1", self.provider_port, timeout=5)
            try:
                try:
                    connection.connect()
                except OSError as exc:
                    raise ProviderRefused(f"not sent: {exc}", retryable=True) from exc
                try:
                    connection.request(
                        "POST",
                        f"/tools/{tool}/send",
                        body=canonical_bytes(attempt.args),
                        headers=headers,
                    )
                    answer = connection.getresponse()
                    body = json.loads(answer.read() or b"null")
                except TimeoutError as exc:
                    raise ProviderTimeout(str(exc)) from exc
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    raise ProviderLostResponse(repr(exc)) from exc
            finally:
                connection.close()
            if answer.status >= 500:
                raise ProviderLostResponse(f"HTTP {answer.status}")
            if answer.status >= 400:
                raise ProviderRefused(f"HTTP {answer.status}", retryable=answer.status == 429)
            return SendResult(provider_request_id=body["id"], result_ref=None)

        return send

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        seconds = self.options.seconds or self.options.minutes * 60
        say(f"{self.options.database}, {seconds:.0f}s at {self.options.rate}/s, in {self.workdir}")
        self.manage("migrate", "--no-input", "-v", "0")
        self.spawn("demo_provider")
        self.manage("seed_demo", "--provider-url", f"http://127.0.0.1:{self.provider_port}")
        token = self.manage(
            "create_agent_token",
            "soak-agents",
            "--tenant",
            "acme",
            "--tenant",
            "globex",
            "--quiet",
        ).stdout.strip()
        self.spawn("gunicorn")
        self.spawn("reconcile_worker")
        self.wait_for_web()
        supervisor = threading.Thread(target=self.supervise, daemon=True)
        chaos = threading.Thread(target=self.chaos, args=(seconds,), daemon=True)
        supervisor.start()
        chaos.start()
        try:
            self.agents(seconds, token)
        finally:
            self.stop_chaos.set()
            chaos.join()
            supervisor.join()
        self.revive()
        self.wait_for_web()
        say("agents stopped; letting recovery settle")
        unsettled = self.drain(self.options.drain)
        return self.report(unsettled)

    def drain(self, seconds: float) -> dict[str, int]:
        deadline = time.monotonic() + seconds
        while True:
            counts = self.ledger_counts()
            unsettled = {state: counts.get(state, 0) for state in UNSETTLED if counts.get(state)}
            if not unsettled or time.monotonic() > deadline:
                return unsettled
            time.sleep(1)

    def ledger_counts(self) -> dict[str, int]:
        from django.db import close_old_connections

        from attempts.models import Attempt

        close_old_connections()
        rows = Attempt.objects.values_list("state").order_by()
        return Counter(state for (state,) in rows)

    def provider_effects(self) -> list[dict]:
        deadline = time.monotonic() + 30
        while True:
            self.revive()
            try:
                url = f"http://127.0.0.1:{self.provider_port}/effects"
                return json.loads(urllib.request.urlopen(url, timeout=30).read())  # noqa: S310
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def report(self, unsettled: dict[str, int]) -> int:
        from django.db.models import Count

        from attempts.models import Attempt

        stored = set(Attempt.objects.values_list("idempotency_key", flat=True))
        acknowledged = self.tally.acknowledged
        lost = sorted(acknowledged - stored)
        effects = self.provider_effects()
        per_key = Counter(
            (e["tool"], e["idempotency_key"]) for e in effects if not TOOLS.get(e["tool"], True)
        )
        duplicates = sorted(key for key, n in per_key.items() if n > 1)
        without_attempt = sorted({e["idempotency_key"] for e in effects} - stored)
        # Confirmed attempts must name their effect (Attempt.identifies_effect: the provider
        # request id, or a receipt carrying it).
        effect_ids = {e["idempotency_key"]: str(e.get("id", "")) for e in effects}
        unnamed = sorted(
            a.attempt_id
            for a in Attempt.objects.filter(
                state="OUTCOME_CONFIRMED", idempotency_key__in=list(effect_ids)
            )
            if not a.identifies_effect(effect_ids[a.idempotency_key])
        )
        verify = self.manage("verify_audit", check=False)
        states = dict(Attempt.objects.values_list("state").annotate(n=Count("id")).order_by())
        requests = sum(1 for _ in open(self.workdir / "access.log", "rb"))
        self.stop_all()

        print()
        print(f"database                         {self.options.database}")
        print(
            f"duration                         {self.options.seconds or self.options.minutes * 60:.0f} s"
        )
        print(
            f"tool calls started / completed   {self.tally.counts['tool_calls']} / {self.tally.counts['completed']}"
        )
        print(f"API requests (gunicorn log)      {requests}")
        print(f"kills                            {dict(self.kills) or '{}'}")
        print(f"restarts                         {dict(self.restarts) or '{}'}")
        print(f"errors seen by agents            {dict(self.tally.errors) or '{}'}")
        print(f"agents that gave up              {self.tally.counts['gave_up']}")
        print(f"attempts by state                {states}")
        print(
            f"provider effects                 {len(effects)} (without an attempt: {len(without_attempt)})"
        )
        print()
        print(f"acknowledged intents lost        {len(lost)}   (of {len(acknowledged)})")
        print(f"duplicate non-idempotent effects {len(duplicates)}")
        print(f"confirmed without naming effect  {len(unnamed)}")
        print(f"unsettled outside MANUAL_REVIEW  {sum(unsettled.values())}   {unsettled or ''}")
        print(f"chain verified                   {'yes' if verify.returncode == 0 else 'NO'}")
        if lost:
            print(f"  lost: {lost[:10]}")
        if duplicates:
            print(f"  duplicated: {duplicates[:10]}")
        if verify.returncode != 0:
            print("  verify_audit: " + (verify.stdout + verify.stderr)[-2000:])
        if unnamed:
            print(f"  confirmed without naming their effect: {unnamed[:10]}")
        ok = (
            not lost and not duplicates and not unnamed and not unsettled and verify.returncode == 0
        )
        if self.chaos_failed:
            print("  the chaos thread failed: this run proves less than it should")
            ok = False
        print(f"\nsoak: {'all invariants hold' if ok else 'INVARIANT VIOLATED'}")
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long agents run (10)")
    parser.add_argument("--seconds", type=float, default=0.0, help="instead of --minutes")
    parser.add_argument("--rate", type=float, default=10.0, help="tool calls per second (10)")
    parser.add_argument("--agents", type=int, default=8, help="agent threads (8)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers (2)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills")
    parser.add_argument("--drain", type=float, default=90.0, help="seconds recovery may take")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--seed", type=int, default=None, help="random seed for the chaos")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args(argv)
    if options.rate <= 0 or options.agents < 1 or options.kill_every <= 0:
        parser.error("--rate, --agents and --kill-every must be positive")
    workdir = Path(tempfile.mkdtemp(prefix="ledgerweb-soak-"))
    soak = None
    try:
        soak = Soak(options, workdir)
        # The soak reads the ledger itself at the end, with the same settings as its children.
        for name, value in soak.env.items():
            if name.startswith(("LEDGERWEB_", "DATABASE_URL", "DJANGO_")):
                os.environ[name] = value
        import django

        django.setup()
        return soak.run()
    finally:
        if soak is not None:
            soak.stop_all()
            if soak.postgres is not None:
                soak.postgres.stop()
        if options.keep:
            say(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
