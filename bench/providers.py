"""Benchmark: a healthy tool's reconcile latency while other providers misbehave.

Builds a fresh SQLite ledger under var/bench/, starts the demo provider for the healthy tool and
four misbehaving providers (tests/reconciliation/bad_provider.py, real processes on 127.0.0.1):
one trickling its answer a byte a second, one black hole, one answering 429 with
``Retry-After``, one answering 30 MB; or (``--modes framings``) four trickles, one per answer
framing: ``Content-Length`` with ``Connection: close``, HTTP/1.0, close-delimited, chunked. A real ``manage.py reconcile`` loop runs throughout. In the
same run it measures, for ``--healthy`` UNKNOWN attempts of the healthy tool made due one after
another (the provider holds each effect, so each is confirmed by its lookup), the time from due
to OUTCOME_CONFIRMED:

1. the baseline: the healthy tool alone;
2. the same with ``--bad`` due attempts on each misbehaving provider (their breakers opening,
   probing every second, and holding for Retry-After all along).

Each healthy attempt is made due after a pause with a random part (the same pauses in both
phases), so both sample the whole of the worker's polling cycle (``--interval``). It prints the
median and 95th percentile of both and their ratio. Target: at most 1.5x.

Usage: .venv/bin/python bench/providers.py [--healthy 30] [--bad 40] [--timeout 2] [--interval 0.1]
       [--modes trickle,blackhole,ratelimit,huge | --modes framings]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.reconcile import _post, _setup_django, _start_provider, _unknown_attempt  # noqa: E402
from bench.soak import stop_processes  # noqa: E402

BAD_MODES = ("trickle", "blackhole", "ratelimit", "huge")
# Trickles in every answer framing (each cut at the whole-call deadline by the transport):
# Content-Length with Connection: close, HTTP/1.0, close-delimited, chunked.
FRAMING_MODES = ("trickle_close", "trickle_http10", "trickle_closedelim", "trickle_chunked")
ALL_MODES = BAD_MODES + FRAMING_MODES


def _start_bad(workdir: Path, mode: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = workdir / f"bad-{mode}.port"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.reconciliation.bad_provider", mode]
        + ["--port-file", str(port_file)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the {mode} provider did not start")
        time.sleep(0.02)
    return process, int(port_file.read_text())


def _unknown(tool: str, key: str, args: dict, *, due: bool) -> int:
    import datetime as dt

    from django.utils import timezone

    from attempts.locking import write_transaction

    when = timezone.now() - dt.timedelta(seconds=1) if due else timezone.now() + dt.timedelta(1)
    with write_transaction():
        return _unknown_attempt(tool, "bench", key, args, next_check_at=when).pk


def _latencies(port: int, phase: str, count: int, gap: float, interval: float) -> list[float]:
    """Seconds from due to confirmed, for ``count`` healthy attempts made due one by one.

    Between two, a pause of ``gap`` plus a random part of the worker's ``interval``, the same
    pauses in every phase: a fixed pause locks onto the worker's polling cycle (each attempt
    made due at the same point of it) and measures one point of the cycle, not all of it.
    """
    from django.utils import timezone

    from attempts.models import Attempt, State

    pauses = random.Random(count)

    found = []
    for i in range(count):
        key, args = f"healthy:{phase}:{i}", {"phase": phase, "i": i}
        pk = _unknown("healthy", key, args, due=False)
        _post(port, "/_control/effects", {"tool": "healthy", "idempotency_key": key, "args": args})
        due_at = time.monotonic()
        Attempt.objects.filter(pk=pk).update(next_check_at=timezone.now())
        deadline = due_at + 60
        while Attempt.objects.filter(pk=pk).values_list("state", flat=True)[0] != (
            State.OUTCOME_CONFIRMED
        ):
            if time.monotonic() > deadline:
                raise SystemExit(f"healthy attempt {key} not confirmed within 60 s")
            time.sleep(0.005)
        found.append(time.monotonic() - due_at)
        time.sleep(gap + pauses.uniform(0.0, interval))
    return found


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=int, default=30, help="healthy attempts per phase")
    parser.add_argument("--bad", type=int, default=40, help="due attempts per bad provider")
    parser.add_argument("--timeout", type=float, default=2.0, help="tools' timeout_seconds")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between healthy ones")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.1,
        help="the worker's --interval: how often it looks for due work (default 0.1)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(BAD_MODES),
        help=f"misbehaving providers present, comma-separated, among {', '.join(ALL_MODES)}, "
        f"or 'framings' for the trickles in every framing (default {','.join(BAD_MODES)})",
    )
    options = parser.parse_args()
    modes = [m for m in options.modes.split(",") if m]
    if modes == ["framings"]:
        modes = list(FRAMING_MODES)
    if not modes or set(modes) - set(ALL_MODES):
        parser.error(f"--modes: choose among {', '.join(ALL_MODES)} (or 'framings')")
    if options.healthy < 1 or options.bad < 1 or min(options.timeout, options.interval) <= 0:
        parser.error("--healthy, --bad, --timeout and --interval must be positive")

    workdir = REPO / "var" / "bench" / f"providers-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    _setup_django(workdir / "ledger.sqlite3")
    from attempts.models import EffectClass, Tenant, Tool

    processes: list[subprocess.Popen] = []
    try:
        demo, demo_port = _start_provider(workdir)
        processes.append(demo)
        Tenant.objects.create(slug="bench", name="Benchmark")
        base = f"http://127.0.0.1:{demo_port}/tools/healthy"
        Tool.objects.create(
            name="healthy",
            effect_class=EffectClass.RECONCILABLE,
            dispatch_url=f"{base}/send",
            lookup_url=f"{base}/lookup",
            timeout_seconds=options.timeout,
        )
        for mode in modes:
            process, port = _start_bad(workdir, mode)
            processes.append(process)
            Tool.objects.create(
                name=f"bad_{mode}",
                effect_class=EffectClass.RECONCILABLE,
                dispatch_url=f"http://127.0.0.1:{port}/send",
                lookup_url=f"http://127.0.0.1:{port}/lookup",
                timeout_seconds=options.timeout,
            )
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(
            LEDGERWEB_SQLITE_PATH=str(workdir / "ledger.sqlite3"),
            LEDGERWEB_LOG_LEVEL="ERROR",
            # Probe the misbehaving providers every second, so they are called all along.
            LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS="1",
            LEDGERWEB_BACKOFF_BASE="1",
            LEDGERWEB_BACKOFF_CAP="2",
        )
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "reconcile", "--interval", str(options.interval)]
            + ["--worker-id", "b"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(worker)
        print(
            f"healthy tool: {options.healthy} attempts per phase; bad providers: "
            f"{', '.join(modes)} with {options.bad} due attempts each; timeout "
            f"{options.timeout:g}s; database: SQLite",
            flush=True,
        )
        _latencies(demo_port, "warmup", 3, options.gap, options.interval)
        alone = _latencies(demo_port, "alone", options.healthy, options.gap, options.interval)
        for mode in modes:
            for i in range(options.bad):
                _unknown(f"bad_{mode}", f"bad:{mode}:{i}", {"mode": mode, "i": i}, due=True)
        time.sleep(0.3)  # the bad providers' first calls are in flight
        with_bad = _latencies(demo_port, "with-bad", options.healthy, options.gap, options.interval)
        if worker.poll() is not None:
            raise SystemExit("the reconcile worker exited")
        for name, values in (("alone", alone), ("with bad providers", with_bad)):
            print(
                f"{name:<20} median {statistics.median(values) * 1000:7.1f} ms   "
                f"p95 {_p95(values) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms"
            )
        median_ratio = statistics.median(with_bad) / statistics.median(alone)
        p95_ratio = _p95(with_bad) / _p95(alone)
        print(
            f"ratio with/alone: median {median_ratio:.2f}x, p95 {p95_ratio:.2f}x (target <= 1.5x)"
        )
    finally:
        stop_processes(processes)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
