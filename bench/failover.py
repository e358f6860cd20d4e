"""Failover under load: a private PostgreSQL primary and streaming standby, agents through gunicorn
and two reconcile workers on a multi-host ``DATABASE_URL``, the primary SIGKILLed mid-run and the
standby promoted; then every acknowledged write is counted.

Two rounds on one ledger, one replication mode each:

1. synchronous: the primary names the standby in ``synchronous_standby_names`` (the ledger's
   sessions commit with ``synchronous_commit=on``), so a commit is acknowledged only once the
   standby has it on disk. Kill the primary, promote the standby.
2. asynchronous: a new standby of the new primary, not named (the default). ``check --deploy``
   must warn (attempts.W045). Kill the primary, promote that standby.

After each failover the agents go on (the multi-host URL finds the new primary), recovery settles
what is left, and the round reports: acknowledged intents lost (keys the API answered 200/201 for,
missing after the failover), acknowledged moves lost (a dispatch claim or a confirmation the API
answered for, without its event), keys that took effect more than once at the provider (tools
that do not honour keys), ``verify_audit``, and whether the transparency log went on from the
checkpoint it had reached (a checkpoint past it, sealed on the new primary).

The demo provider is a real process with its own record of effects (reconciliation/demo_provider.py).
Everything started here is stopped at the end, also on failure. ``tests/test_failover.py`` runs it.

Usage: .venv/bin/python bench/failover.py [--seconds 5] [--agents 6] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.private_postgres import Server, free_port  # noqa: E402
from bench.soak import TOOLS, Soak  # noqa: E402

STANDBY_NAME = "ledger_standby"
ORIGIN = "failover.test/ledger"
WITNESS_NAME = "witness.test/failover"
UNSETTLED = ("INTENT_RECORDED", "DISPATCHED", "UNKNOWN", "FAILED_RETRYABLE")


STARTED = time.monotonic()


def say(message: str) -> None:
    print(f"failover: {time.monotonic() - STARTED:6.1f}s {message}", flush=True)


class Pair:
    """A primary and its streaming standbys, made with initdb and pg_basebackup."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[Server] = []
        self.primary = self._server("a")
        self.primary.options = ["-c wal_level=replica", "-c max_wal_senders=5"]
        self.primary.create("ledger")
        # Ports of the standbys to come are in the URL from the start: libpq skips a host that
        # does not answer, and keeps the one that takes writes.
        self.spare = [self._server(name) for name in ("b", "c")]

    def _server(self, name: str) -> Server:
        server = Server(self.root, name)
        server.database = "ledger"
        self.servers.append(server)
        return server

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"postgres://postgres@{hosts}/ledger"

    def add_standby(self, *, synchronous: bool) -> Server:
        """A streaming standby of the current primary; named in its synchronous_standby_names
        when ``synchronous`` (set on the command line, so the standby does not inherit it)."""
        standby = self.spare.pop(0)
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        )
        standby.pg(
            "pg_basebackup",
            "-d",
            conninfo,
            "-D",
            str(standby.dir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        standby.options = []
        standby.start()
        names = f"'{STANDBY_NAME}'" if synchronous else "''"
        self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.primary.sql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        want = "sync" if synchronous else "async"
        while self.primary.sql("SELECT sync_state FROM pg_stat_replication") != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not become {want}")
            time.sleep(0.1)
        return standby

    def hold_back(self, seconds: float) -> None:
        """Stop the primary's WAL sender (SIGSTOP) for ``seconds``: what a slow link or a busy
        standby does, the standby falls behind. Stopping the standby's receiver instead would
        not do: what the sender already wrote waits in the socket and is read after all."""
        if seconds <= 0:
            return
        for pid in self.primary.sql("SELECT pid FROM pg_stat_replication").split():
            os.kill(int(pid), signal.SIGSTOP)
        time.sleep(seconds)

    def fail_over(self, standby: Server) -> float:
        """SIGKILL the primary, promote ``standby``; seconds without a primary."""
        started = time.monotonic()
        self.primary.kill()
        standby.pg("pg_ctl", "promote", "-D", str(standby.dir), "-w", "-t", "60")
        # The old primary's auto.conf named a synchronous standby; the new one names none yet.
        standby.sql("ALTER SYSTEM RESET synchronous_standby_names")
        standby.sql("SELECT pg_reload_conf()")
        self.primary = standby
        return time.monotonic() - started

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@dataclass
class Acks:
    """What the API acknowledged, by key: the intent, the dispatch claim, the confirmation."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    moves: dict[str, set[str]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, key: str, move: str) -> None:
        with self.lock:
            self.moves.setdefault(key, set()).add(move)

    def confirmed(self) -> int:
        with self.lock:
            return sum(1 for moves in self.moves.values() if "OUTCOME_CONFIRMED" in moves)


@dataclass
class Round:
    mode: str
    acknowledged_intents: int = 0
    acknowledged_moves: int = 0
    lost_intents: list[str] = field(default_factory=list)
    lost_moves: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    verify_ok: bool = False
    verify_output: str = ""
    checkpoint_before: int = 0
    checkpoint_after: int = 0
    witnessed_before: int = 0
    witnessed_after: int = 0
    witness_status: str = ""
    witness_message: str = ""
    signer_refusals: int = 0
    confirmed_after_promotion: int = 0
    unsettled: dict[str, int] = field(default_factory=dict)
    warned: bool | None = None
    without_primary_seconds: float = 0.0
    lag: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return len(self.lost_intents) + len(self.lost_moves)

    def lines(self) -> list[str]:
        return [
            f"round                            {self.mode}",
            f"acknowledged intents / moves     {self.acknowledged_intents} / "
            f"{self.acknowledged_moves}",
            f"standby held back before kill    {self.lag:.1f} s",
            f"seconds without a primary        {self.without_primary_seconds:.1f}",
            f"calls confirmed after promotion  {self.confirmed_after_promotion}",
            f"errors seen by agents            {self.errors or '{}'}",
            f"check --deploy warned (W045)     {self.warned}",
            f"LOST acknowledged writes         {self.lost}  (intents {len(self.lost_intents)}, "
            f"moves {len(self.lost_moves)})",
            f"keys in effect twice             {len(self.duplicates)}",
            f"log: checkpoint before -> after  {self.checkpoint_before} -> {self.checkpoint_after}",
            f"witness cosigned before -> after {self.witnessed_before} -> {self.witnessed_after} "
            f"leaves, {self.witness_status} {self.witness_message[:160]}",
            f"signer refused to sign (fork)    {self.signer_refusals} time(s)",
            f"unsettled outside MANUAL_REVIEW  {sum(self.unsettled.values())} {self.unsettled or ''}",
            f"verify_audit                     {'passes' if self.verify_ok else 'FAILS'}",
        ] + ([] if self.verify_ok else [f"  {self.verify_output[-600:]}"])


class Failover(Soak):
    """The soak's processes (gunicorn, two reconcile workers, the demo provider) on the pair."""

    def __init__(self, options: argparse.Namespace, workdir: Path) -> None:
        soak_options = argparse.Namespace(
            database="sqlite", web_workers=2, seed=1, agents=options.agents
        )
        super().__init__(soak_options, workdir)
        self.failover_options = options
        root = Path(tempfile.mkdtemp(prefix="ledgerweb-failover-pg-"))
        try:
            self.pair = Pair(root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        self.env["DATABASE_URL"] = self.pair.url
        self.env["LEDGERWEB_SEAL_EVERY"] = "1"
        self.env["LEDGERWEB_PG_CONNECT_TIMEOUT"] = "2"
        self.env["LEDGERWEB_TLOG_ORIGIN"] = ORIGIN
        self.env["LEDGERWEB_TLOG_KEY_FILE"] = str(workdir / "log.key")
        self.token = ""
        self._refusals_before = 0

    def close(self) -> None:
        self.stop_all()
        self.pair.stop()
        shutil.rmtree(self.pair.root, ignore_errors=True)

    def start(self) -> None:
        verifier = self.manage(
            "ledger_log", "genkey", "--out", self.env["LEDGERWEB_TLOG_KEY_FILE"]
        ).stdout.split()[-1]
        self.start_witness(verifier)
        say("migrating")
        self.manage("migrate", "--no-input", "-v", "0")
        say("starting the provider, gunicorn and two workers")
        self.spawn("demo_provider")
        self.manage("seed_demo", "--provider-url", f"http://127.0.0.1:{self.provider_port}")
        self.token = self.manage(
            "create_agent_token", "failover", "--tenant", "acme", "--quiet"
        ).stdout.strip()
        self.spawn("gunicorn")
        self.spawn("reconcile_worker")
        self.spawn("reconcile_worker_2")
        self.wait_for_web()

    def start_witness(self, log_key: str) -> None:
        """A C2SP witness of the log in its own process (reconciliation.simulate.witness), keeping the
        newest checkpoint it cosigned on its own disk: it refuses a log that forks."""
        port = free_port()
        self.processes["witness"] = witness = subprocess.Popen(
            [sys.executable, "-m", "reconciliation.simulate.witness", "--state",
             str(self.workdir / "witness"), "--port", str(port), "--name", WITNESS_NAME,
             "--origin", ORIGIN, "--log-key", log_key],
            stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO,
        )  # fmt: skip
        line = witness.stdout.readline()
        if not line.startswith("witness-key "):
            raise RuntimeError(f"the witness did not start: {line!r}")
        self.env["LEDGERWEB_TLOG_WITNESSES"] = f"{line.split()[1]} http://127.0.0.1:{port}"

    def witness_state(self) -> tuple[int, str, str]:
        """The size the witness last cosigned, as the ledger recorded it, and its status."""
        row = self.pair.primary.sql(
            f"SELECT size, status, message FROM attempts_witnessstate WHERE name = '{WITNESS_NAME}'"  # noqa: S608 (a constant)
        )
        if not row:
            return 0, "none", ""
        size, status, message = row.split("|", 2)
        return int(size), status, message

    # -- agents -------------------------------------------------------------------------------

    def run_agents(self, prefix: str, stop: threading.Event, acks: Acks) -> None:
        """Agent threads calling the API until ``stop`` is set; each call runs to its end."""
        from ledgerweb_client import LedgerClient, LedgerError, LedgerUnavailable

        base = f"http://127.0.0.1:{self.web_port}"

        def repeat(call):
            """A ledger call, repeated while the ledger is unavailable (every call is
            idempotent); None when it never answered."""
            for pause in (0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0):
                try:
                    return call()
                except LedgerUnavailable:
                    acks.errors["unavailable"] += 1
                    time.sleep(pause)
            acks.errors["gave_up"] += 1
            return None

        def agent(n: int) -> None:
            client = LedgerClient(base, self.token, timeout=10)
            i = 0
            while not stop.is_set():
                i += 1
                tool = ("update_crm", "open_ticket", "charge_card")[i % 3]
                key = f"{prefix}:{n}:{i}"
                intent = {
                    "tenant": "acme",
                    "task_id": f"{prefix}-{n}",
                    "tool_name": tool,
                    "idempotency_key": key,
                    "args": {"n": n, "i": i},
                }
                try:
                    attempt = repeat(lambda intent=intent: client.record_intent(**intent))
                    if attempt is None:
                        continue
                    acks.add(key, "INTENT")
                    if not repeat(lambda a=attempt: client.dispatch(a.attempt_id)):
                        continue  # someone else holds the send (or the ledger never answered)
                    acks.add(key, "DISPATCHED")
                    try:
                        sent = self._sender(tool)(attempt)
                    except Exception as exc:  # the provider's trouble: recovery settles it
                        acks.errors[type(exc).__name__] += 1
                        continue
                    pid = sent.provider_request_id
                    if repeat(lambda a=attempt, p=pid: client.confirm(a.attempt_id, p, p)):
                        acks.add(key, "OUTCOME_CONFIRMED")
                except LedgerError as exc:
                    acks.errors[f"{type(exc).__name__}:{exc.code}"] += 1

        threads = [
            threading.Thread(target=agent, args=(n,), daemon=True)
            for n in range(self.failover_options.agents)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)

    # -- one round ----------------------------------------------------------------------------

    def round(self, mode: str) -> Round:
        synchronous = mode == "synchronous"
        result = Round(mode, lag=self.failover_options.lag)
        standby = self.pair.add_standby(synchronous=synchronous)
        say(f"{mode}: primary :{self.pair.primary.port}, standby :{standby.port}")
        if not synchronous:
            check = self.manage("check", "--deploy", check=False)
            result.warned = "attempts.W045" in check.stdout + check.stderr
        acks = Acks()
        stop = threading.Event()
        agents = threading.Thread(target=self.run_agents, args=(mode, stop, acks))
        agents.start()
        try:
            self._fail_over_under_load(result, standby, stop, acks)
        finally:
            stop.set()  # the agents stop whatever happened
            agents.join(timeout=150)
        result.confirmed_after_promotion = acks.confirmed() - result.confirmed_after_promotion
        result.errors = dict(acks.errors)
        say(f"{mode}: agents done; recovery settles the rest")
        result.unsettled = self.settle(self.failover_options.drain)
        say(f"{mode}: counting")
        self.count(result, acks, self._refusals_before)
        say(f"{mode}: counted")
        return result

    def _fail_over_under_load(
        self, result: Round, standby: Server, stop: threading.Event, acks: Acks
    ) -> None:
        mode, seconds = result.mode, self.failover_options.seconds
        time.sleep(seconds)
        result.checkpoint_before = int(
            self.pair.primary.sql("SELECT coalesce(max(seq), 0) FROM attempts_checkpoint")
        )
        result.witnessed_before = self.witness_state()[0]
        self._refusals_before = self.signer_refusals()
        say(f"{mode}: the standby falls {self.failover_options.lag}s behind")
        self.pair.hold_back(self.failover_options.lag)
        say(f"{mode}: SIGKILL the primary mid-run, promote the standby")
        result.without_primary_seconds = self.pair.fail_over(standby)
        result.confirmed_after_promotion = acks.confirmed()  # the count at the promotion
        time.sleep(seconds)  # the agents go on against the new primary

    def settle(self, seconds: float) -> dict[str, int]:
        deadline = time.monotonic() + seconds
        states = ", ".join(f"'{s}'" for s in UNSETTLED)
        while True:
            rows = self.pair.primary.sql(
                f"SELECT state, count(*) FROM attempts_attempt WHERE state IN ({states}) "  # noqa: S608 (constants)
                "GROUP BY state"
            )
            unsettled = {
                line.split("|")[0]: int(line.split("|")[1]) for line in rows.splitlines() if line
            }
            if not unsettled or time.monotonic() > deadline:
                return unsettled
            time.sleep(0.5)

    def signer_refusals(self) -> int:
        """How often the workers' signer refused a checkpoint that does not extend the tree it
        signed before (attempts/log.py): a log that forked at the failover."""
        return sum(
            path.read_bytes().count(b"refusing to sign")
            for path in self.workdir.glob("reconcile_worker*.log")
        )

    def count(self, result: Round, acks: Acks, refusals_before: int) -> None:
        rows = self.pair.primary.sql(
            "SELECT a.idempotency_key, a.state, string_agg(DISTINCT e.to_state, ',') "  # noqa: S608
            "FROM attempts_attempt a LEFT JOIN attempts_attemptevent e ON e.attempt_id = a.id "
            f"WHERE a.idempotency_key LIKE '{result.mode}:%' "
            "GROUP BY a.idempotency_key, a.state"
        )
        stored: dict[str, tuple[str, set[str]]] = {}
        for line in rows.splitlines():
            key, state, moves = line.split("|")
            stored[key] = (state, set(moves.split(",")) if moves else set())
        for key, moves in acks.moves.items():
            result.acknowledged_intents += 1
            result.acknowledged_moves += len(moves - {"INTENT"})
            if key not in stored:
                result.lost_intents.append(key)
                continue
            state, events = stored[key]
            for move in sorted(moves - {"INTENT"}):
                if move not in events or (move == "OUTCOME_CONFIRMED" and state != move):
                    result.lost_moves.append(f"{key}:{move}")
        effects = [
            e for e in self.provider_effects() if e["idempotency_key"].startswith(result.mode)
        ]
        per_key = Counter(
            (e["tool"], e["idempotency_key"]) for e in effects if not TOOLS.get(e["tool"], True)
        )
        result.duplicates = sorted(f"{tool}:{key}" for (tool, key), n in per_key.items() if n > 1)
        deadline = time.monotonic() + 30
        while True:
            result.checkpoint_after = int(
                self.pair.primary.sql("SELECT coalesce(max(seq), 0) FROM attempts_checkpoint")
            )
            if result.checkpoint_after > result.checkpoint_before or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        # The witness cosigns a checkpoint sealed on the new primary past the one it held.
        while True:
            size, result.witness_status, result.witness_message = self.witness_state()
            result.witnessed_after = size
            if size > result.witnessed_before and result.witness_status == "ok":
                break
            if result.witness_status == "refused" or time.monotonic() > deadline + 15:
                break
            if self.signer_refusals() > refusals_before:
                break  # a forked log: nothing new is signed, so nothing reaches the witness
            time.sleep(0.5)
        result.signer_refusals = self.signer_refusals() - refusals_before
        say(f"{result.mode}: verify_audit")
        verify = self.manage("verify_audit", check=False)
        result.verify_ok = verify.returncode == 0
        result.verify_output = (verify.stdout + verify.stderr)[-2000:]


def run(options: argparse.Namespace) -> list[Round]:
    """Both rounds, synchronous then asynchronous; everything started is stopped."""
    workdir = Path(tempfile.mkdtemp(prefix="ledgerweb-failover-"))
    failover = None
    try:
        failover = Failover(options, workdir)
        failover.start()
        rounds = [failover.round("synchronous"), failover.round("asynchronous")]
        for result in rounds:
            print()
            print("\n".join(result.lines()), flush=True)
        return rounds
    finally:
        if failover is not None:
            failover.close()
        if options.keep:
            say(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="load before the kill (5)")
    parser.add_argument("--agents", type=int, default=6, help="agent threads (6)")
    parser.add_argument(
        "--lag",
        type=float,
        default=1.0,
        help="seconds the standby falls behind just before the kill (the primary's WAL sender "
        "stopped); 0: a healthy loopback standby (1.0)",
    )
    parser.add_argument("--drain", type=float, default=40.0, help="seconds recovery may take")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    import django

    django.setup()  # the provider sender encodes keys with the server's own functions
    rounds = run(options)
    sync = rounds[0]
    ok = sync.lost == 0 and not sync.duplicates and sync.verify_ok
    ok = ok and sync.checkpoint_after > sync.checkpoint_before and bool(rounds[1].warned)
    ok = ok and sync.witness_status == "ok" and sync.witnessed_after > sync.witnessed_before
    ok = ok and sync.signer_refusals == 0 and sync.confirmed_after_promotion > 0
    print(json.dumps({r.mode: {"lost": r.lost, "duplicates": len(r.duplicates)} for r in rounds}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
