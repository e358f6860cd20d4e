"""Benchmark: reconciling UNKNOWN attempts against a provider whose lookups take 20 ms.

Builds a fresh SQLite ledger under var/bench/, starts the demo provider (a real process on
127.0.0.1) with every effect already recorded and ``lookup_latency_ms=20``, then measures in the
same run:

1. the baseline: a serial one-by-one loop (the same reconciler with one thread and a batch of
   one: claim one attempt, look it up, settle it, commit, next) over ``--serial`` attempts;
2. one worker process with ``--concurrency`` lookups in flight over 1,000 attempts;
3. the same over 5,000 attempts.

It prints wall times, throughput, the speed-up over serial (per attempt, and directly at equal
size when the serial baseline covered that size), the process's CPU per attempt (and its main
thread's, the only database writer, which settles the answers of the lookup threads), the lookup
bulkhead's calls in flight and adaptive limit, and the 5,000 / 1,000 cost ratio (linear cost
means about 5). Target: at least 15x faster than serial, linear cost.

``--mode degrade`` runs the worker's loop over ``--degrade-size`` attempts while the provider
changes part-way: healthy (``--latency-ms``), then slow (``--slow-ms``), healthy, answering 429
(``Retry-After: 1``), healthy again, ``--phase-seconds`` each; it prints, every quarter second,
the calls in flight (the worker's and the provider's own count), the bulkhead's limit and the
attempts settled, so the calls in flight are seen to fall and rise again. The breaker's open
window is 2 s there (``LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS``, 30 by default), so a run
takes seconds, not minutes.

Usage: .venv/bin/python bench/reconcile.py [--concurrency 16] [--serial 1000] [--sizes 1000 5000]
       .venv/bin/python bench/reconcile.py --mode degrade [--degrade-size 7000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _setup_django(db_path: Path) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ["LEDGERWEB_SQLITE_PATH"] = str(db_path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    os.environ.setdefault("LEDGERWEB_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _start_provider(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = workdir / "provider.port"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "reconciliation.demo_provider", "--db", str(workdir / "provider.db")]
        + ["--port", "0", "--port-file", str(port_file)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the demo provider did not start")
        time.sleep(0.05)
    return process, int(port_file.read_text().strip())


def _post(port: int, path: str, body: dict) -> None:
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        answer = connection.getresponse()
        answer.read()
        if answer.status not in (200, 201):
            raise SystemExit(f"provider answered {answer.status} to {path}")
    finally:
        connection.close()


def _unknown_attempt(tool: str, task: str, key: str, args: dict, *, next_check_at) -> Any:
    """An attempt a crashed agent left UNKNOWN (recorded, sent once, then lost), written
    through the state machine in the caller's write transaction; looked at from
    ``next_check_at`` on."""
    from attempts import states
    from attempts.canonical import normalize_args
    from attempts.models import State

    agent = states.Actor.agent("bench-agent")
    normalized = normalize_args(args)
    attempt = states.create(
        state=State.INTENT_RECORDED,
        actor=agent,
        tenant_id="bench",
        task_id=task,
        tool_name=tool,
        idempotency_key=key,
        args=normalized.value,
        args_hash=normalized.args_hash,
        policy_version="v1",
        credential_scope=["bench:write"],
    )
    states.move(attempt, State.DISPATCHED, actor=agent, increments={"send_count": 1})
    states.move(
        attempt, State.UNKNOWN, actor=agent, reason="agent killed", next_check_at=next_check_at
    )
    return attempt


def _create_unknown_attempts(group: str, count: int, port: int) -> list[int]:
    """``count`` attempts left UNKNOWN by a crashed agent, whose effects the provider holds.
    Written through the state machine, in one transaction; not due until the group runs."""
    import datetime as dt

    from django.utils import timezone

    from attempts.locking import write_transaction

    later = timezone.now() + dt.timedelta(days=1)
    ids = []
    keys_and_args = []
    with write_transaction():
        for i in range(count):
            key = f"bench:{group}:{i}"
            attempt = _unknown_attempt(
                "bench_lookup",
                f"bench-{group}",
                key,
                {"group": group, "i": i, "note": "benchmark effect"},
                next_check_at=later,
            )
            ids.append(attempt.pk)
            keys_and_args.append((key, attempt.args))
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda ka: _post(
                    port,
                    "/_control/effects",
                    {"tool": "bench_lookup", "idempotency_key": ka[0], "args": ka[1]},
                ),
                keys_and_args,
            )
        )
    return ids


class _Sampler:
    """Samples the lookup bulkhead's calls in flight and limit every ``every`` seconds, in a
    thread of its own, while a pass runs."""

    def __init__(self, reconciler: Any, every: float = 0.05) -> None:
        self.reconciler = reconciler
        self.every = every
        self.samples: list[tuple[float, int, int]] = []  # (seconds, in flight, limit)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            bulkheads = [
                b
                for b in list(self.reconciler.bulkheads.providers.values())
                if b.operation == "lookup"
            ]
            if bulkheads:
                b = bulkheads[0]
                self.samples.append((time.perf_counter() - self._started, b.in_flight, b.cap))

    def describe(self) -> str:
        if not self.samples:
            return "no samples"
        peak = max(s[1] for s in self.samples)
        busy = [s[1] for s in self.samples]
        mean = sum(busy) / len(busy)
        return (
            f"calls in flight: peak {peak}, mean {mean:.1f} over {len(busy)} samples; "
            f"limit at the end {self.samples[-1][2]}"
        )


def _run_group(ids: list[int], *, concurrency: int, batch_size: int) -> tuple[float, dict]:
    from django.utils import timezone

    from attempts.models import Attempt, State
    from reconciliation.reconciler import Reconciler

    Attempt.objects.filter(pk__in=ids).update(
        next_check_at=timezone.now() - timezone.timedelta(seconds=1)
    )
    reconciler = Reconciler(
        worker_id=f"bench-c{concurrency}", concurrency=concurrency, batch_size=batch_size
    )
    sampler = _Sampler(reconciler)
    started, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
    with sampler:
        summary = reconciler.run_pass()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    main = time.thread_time() - main
    print(
        f"    this process's CPU {cpu / len(ids) * 1000:.2f} ms/attempt "
        f"({cpu / elapsed:.0%} of the wall time), its main thread's (the one writer) "
        f"{main / len(ids) * 1000:.2f} ms/attempt"
    )
    if concurrency > 1:
        print(f"    {sampler.describe()}")
    confirmed = Attempt.objects.filter(pk__in=ids, state=State.OUTCOME_CONFIRMED).count()
    if confirmed != len(ids) or summary.claimed != len(ids):
        raise SystemExit(f"only {confirmed} of {len(ids)} confirmed: {summary}")
    return elapsed, summary.as_dict()


def _provider_in_flight(port: int) -> int:
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/_stats")
        return int(json.loads(connection.getresponse().read())["in_flight"])
    finally:
        connection.close()


def _degrade(args: argparse.Namespace, port: int) -> None:
    """The worker's loop while the provider slows down, recovers, answers 429 and recovers."""
    from reconciliation.reconciler import Reconciler

    print(f"setting up {args.degrade_size} UNKNOWN attempts ...", flush=True)
    ids = _create_unknown_attempts("degrade", args.degrade_size, port)
    from django.utils import timezone

    from attempts.models import Attempt

    Attempt.objects.filter(pk__in=ids).update(
        next_check_at=timezone.now() - timezone.timedelta(seconds=1)
    )
    phases = [
        ("healthy", {"lookup_latency_ms": args.latency_ms, "lookup_mode": "ok"}),
        ("slow", {"lookup_latency_ms": args.slow_ms}),
        ("healthy", {"lookup_latency_ms": args.latency_ms}),
        ("429", {"lookup_mode": "rate_limited", "retry_after_seconds": 1}),
        ("healthy", {"lookup_mode": "ok"}),
    ]
    reconciler = Reconciler(worker_id="bench-degrade", concurrency=args.concurrency)
    settled = [0]
    stop = threading.Event()

    def watch() -> None:
        started = time.perf_counter()
        phase = -1
        while not stop.is_set():
            elapsed = time.perf_counter() - started
            now = min(int(elapsed // args.phase_seconds), len(phases) - 1)
            if now != phase:
                phase = now
                _post(port, "/_control", phases[phase][1])
            bulkhead = next(
                (
                    b
                    for b in list(reconciler.bulkheads.providers.values())
                    if b.operation == "lookup"
                ),
                None,
            )
            flight, limit = (bulkhead.in_flight, bulkhead.cap) if bulkhead else (0, 0)
            print(
                f"t={elapsed:6.2f}s  {phases[phase][0]:<8} calls in flight {flight:>3} "
                f"(provider {_provider_in_flight(port):>3})  limit {limit:>3}  "
                f"{'#' * flight:<{args.concurrency}}  settled {settled[0]}",
                flush=True,
            )
            stop.wait(0.25)

    print(
        f"provider: {args.latency_ms:.0f} ms, then {args.slow_ms:.0f} ms, {args.latency_ms:.0f} "
        f"ms, 429, {args.latency_ms:.0f} ms; {args.phase_seconds:.0f} s each; "
        f"--concurrency {args.concurrency}"
    )
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    began = time.monotonic()
    phases_end = began + args.phase_seconds * len(phases)
    deadline = phases_end + 60
    try:
        # Every phase is shown, even when the attempts are settled before its end.
        while (settled[0] < len(ids) or time.monotonic() < phases_end) and (
            time.monotonic() < deadline
        ):
            settled[0] += reconciler.run_pass(stop=stop, carry=True).settled
            reconciler.wait_for_work(stop, 0.05)
    finally:
        stop.set()
        watcher.join(timeout=5)
        reconciler.close()
    left = Attempt.objects.filter(pk__in=ids, state="UNKNOWN").count()
    print(f"settled {len(ids) - left} of {len(ids)} (the rest wait for their next check)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("throughput", "degrade"), default="throughput")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--serial", type=int, default=1000, help="attempts in the serial baseline")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--slow-ms", type=float, default=300.0, help="degrade: the slow phase")
    parser.add_argument("--phase-seconds", type=float, default=3.0, help="degrade: each phase")
    parser.add_argument("--degrade-size", type=int, default=7000, help="degrade: attempts")
    args = parser.parse_args()

    workdir = REPO / "var" / "bench" / f"reconcile-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.mode == "degrade":
        os.environ["LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS"] = "2"
    _setup_django(workdir / "ledger.sqlite3")
    from attempts.models import EffectClass, Grant, Tenant, Tool
    from reconciliation.reconciler import tune_worker_process

    tune_worker_process()  # as `manage.py reconcile` does

    provider, port = _start_provider(workdir)
    try:
        base = f"http://127.0.0.1:{port}/tools/bench_lookup"
        tenant = Tenant.objects.create(slug="bench", name="Benchmark")
        tool = Tool.objects.create(
            name="bench_lookup",
            effect_class=EffectClass.RECONCILABLE,
            dispatch_url=f"{base}/send",
            lookup_url=f"{base}/lookup",
            timeout_seconds=10,
        )
        Grant.objects.create(
            tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=["bench:write"]
        )
        if args.mode == "degrade":
            _degrade(args, port)
            return
        print(f"setting up {args.serial + sum(args.sizes)} UNKNOWN attempts ...", flush=True)
        serial_ids = _create_unknown_attempts("serial", args.serial, port)
        groups = {size: _create_unknown_attempts(f"n{size}", size, port) for size in args.sizes}
        _post(port, "/_control", {"lookup_latency_ms": args.latency_ms})

        print(f"provider lookup latency: {args.latency_ms:.0f} ms; database: SQLite (WAL, FULL)")
        serial_s, _ = _run_group(serial_ids, concurrency=1, batch_size=1)
        serial_per = serial_s / args.serial
        print(
            f"serial one-by-one   n={args.serial:>5}  wall {serial_s:7.2f}s  "
            f"{args.serial / serial_s:7.1f}/s  {serial_per * 1000:6.2f} ms/attempt"
        )
        walls = {}
        for size, ids in groups.items():
            wall, summary = _run_group(ids, concurrency=args.concurrency, batch_size=200)
            walls[size] = wall
            line = (
                f"concurrency={args.concurrency:<3}  n={size:>5}  wall {wall:7.2f}s  "
                f"{size / wall:7.1f}/s  {wall / size * 1000:6.2f} ms/attempt  "
                f"speed-up vs serial {serial_per * size / wall:5.1f}x"
            )
            if size == args.serial:
                line += f" (direct, same n: {serial_s / wall:.1f}x)"
            print(line + f"  lookups={summary['lookups']}")
            floor = size * args.latency_ms / 1000
            print(
                f"    vs the ideal serial floor (n x latency = {floor:.1f}s, zero overhead): "
                f"{floor / wall:.1f}x"
            )
        sizes = sorted(walls)
        if len(sizes) >= 2:
            small, large = sizes[0], sizes[-1]
            print(
                f"cost ratio n={large}/n={small}: {walls[large] / walls[small]:.2f} "
                f"(linear: {large / small:.2f})"
            )
    finally:
        provider.terminate()
        provider.wait(timeout=10)


if __name__ == "__main__":
    main()
