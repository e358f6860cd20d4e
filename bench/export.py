#!/usr/bin/env python3
"""Benchmark: export 1,000,000 audit events as CSV and as JSON Lines, against the ``sqlite3``
command-line shell doing the same export of the same data in the same run.

    .venv/bin/python bench/export.py [--events 1000000] [--regenerate]

Generates (once, cached under var/bench/) a SQLite ledger with a valid hash chain: attempts of
four events each (created, dispatched, provider request attached, confirmed) over two tenants.
Each export runs in its own process so its peak memory (max RSS) is its own. Prints rows per
second, peak memory and the ratio to the shell. Targets: peak memory under 150 MB, and at least
half the shell's throughput.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from attempts.verify_export import GENESIS, event_hash  # noqa: E402

DATA = REPO / "var" / "bench" / "export.sqlite3"
OUT = REPO / "var" / "bench" / "out"

# The same columns as the product's CSV (verify_export.CSV_COLUMNS), read by the shell.
SHELL_SQL = """
SELECT e.id AS event_id, a.attempt_id, e.action, e.actor_kind, e.actor, e.from_state, e.to_state,
       e.reason, e.details, e.created_at, e.prev_hash, e.hash, a.tenant_id AS tenant, a.tool_name,
       a.idempotency_key, a.state AS attempt_state, a.provider_request_id
FROM attempts_attemptevent e JOIN attempts_attempt a ON a.id = e.attempt_id
ORDER BY e.id;
"""


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="ledgerweb.settings",
        LEDGERWEB_SQLITE_PATH=str(data),
        PYTHONPATH=str(REPO),
        LEDGERWEB_DATA_DIR=str(REPO / "var"),
    )
    return env


def generate(data: Path, events: int) -> None:
    """A ledger of ``events`` chained events (valid hashes), written straight with sqlite3."""
    data.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(data) + suffix).unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=REPO,
        env=_env(data),
        check=True,
    )
    conn = sqlite3.connect(data)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute(
        "INSERT INTO attempts_tenant (slug, name, created_at) VALUES "
        "('acme', 'Acme', '2026-01-01 00:00:00.000000'), "
        "('globex', 'Globex', '2026-01-01 00:00:00.000000')"
    )
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    prev = GENESIS
    attempts_n = events // 4
    batch_a: list[tuple] = []
    batch_e: list[tuple] = []
    event_id = 0
    began = time.perf_counter()
    for n in range(1, attempts_n + 1):
        tenant = "acme" if n % 2 else "globex"
        public = f"att_{n:026d}"
        key = f"invoice:{tenant}:{n}:send"
        args = {"customer": f"cus_{n}", "amount": n % 10000, "note": "monthly invoice"}
        args_text = json.dumps(args, separators=(",", ":"), sort_keys=True)
        args_hash = hashlib.sha256(args_text.encode()).hexdigest()
        moment = start + dt.timedelta(milliseconds=n * 10)
        stamp = moment.strftime("%Y-%m-%d %H:%M:%S.%f")
        batch_a.append(
            (
                n,
                public,
                f"task-{n // 10}",
                "send_invoice_email",
                args_text,
                args_hash,
                key,
                "OUTCOME_CONFIRMED",
                4,
                f"req_{n}",
                f"receipt_{n}",
                "v1",
                "[]",
                "",
                0,
                1,
                0,
                None,
                "",
                None,
                stamp,
                stamp,
                None,
                None,
                tenant,
            )
        )
        created = {
            "tenant": tenant,
            "task_id": f"task-{n // 10}",
            "tool_name": "send_invoice_email",
            "idempotency_key": key,
            "args_hash": args_hash,
            "policy_version": "v1",
            "credential_scope": [],
            "parent_attempt_id": None,
        }
        steps = (
            ("attempt.created", "", "INTENT_RECORDED", created),
            ("attempt.dispatched", "INTENT_RECORDED", "DISPATCHED", {}),
            (
                "attempt.provider_request_attached",
                "DISPATCHED",
                "DISPATCHED",
                {"provider_request_id": f"req_{n}"},
            ),
            (
                "attempt.outcome_confirmed",
                "DISPATCHED",
                "OUTCOME_CONFIRMED",
                {"result_ref": f"receipt_{n}", "review_reason": ""},
            ),
        )
        for action, from_state, to_state, details in steps:
            event_id += 1
            row = {
                "attempt_id": public,
                "action": action,
                "actor_kind": "agent",
                "actor": "billing-agent",
                "from_state": from_state,
                "to_state": to_state,
                "reason": "",
                "details": details,
                "created_at": stamp,
                "prev_hash": prev,
            }
            digest = event_hash(row)
            batch_e.append(
                (
                    event_id,
                    n,
                    action,
                    "agent",
                    "billing-agent",
                    from_state,
                    to_state,
                    "",
                    json.dumps(details),
                    stamp,
                    prev,
                    digest,
                )
            )
            prev = digest
        if len(batch_e) >= 40000 or n == attempts_n:
            conn.executemany(
                "INSERT INTO attempts_attempt (id, attempt_id, task_id, tool_name, args, "
                "args_hash, idempotency_key, state, version, provider_request_id, result_ref, "
                "policy_version, credential_scope, review_reason, awaiting_approval, send_count, "
                "lookup_count, next_check_at, lease_owner, lease_until, created_at, updated_at, "
                "owner_id, parent_id, tenant_id) VALUES "
                "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                batch_a,
            )
            conn.executemany(
                "INSERT INTO attempts_attemptevent (id, attempt_id, action, actor_kind, actor, "
                "from_state, to_state, reason, details, created_at, prev_hash, hash) VALUES "
                "(?,?,?,?,?,?,?,?,?,?,?,?)",
                batch_e,
            )
            conn.commit()
            batch_a, batch_e = [], []
            print(f"  generated {event_id} events ({time.perf_counter() - began:.0f}s)", end="\r")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"  generated {event_id} events in {time.perf_counter() - began:.0f}s")


def child(fmt: str, out: Path) -> None:
    """Runs inside the measured process: the product's export, as the command runs it."""
    import django

    django.setup()
    from attempts import audit_export

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    plan = audit_export.plan_export(user=None, filters=audit_export.ExportFilters())
    result = audit_export.CsvResult()
    stream = (
        audit_export.stream_csv(plan, result) if fmt == "csv" else audit_export.stream_jsonl(plan)
    )
    with out.open("wb") as handle:
        for chunk in stream:
            handle.write(chunk)
    seconds = time.perf_counter() - began
    print(
        json.dumps(
            {
                "seconds": seconds,
                "baseline_kb": baseline_kb,
                "rows": plan.upto,
            }
        )
    )


def run_measured(
    command: list[str], *, env: dict | None = None, stdout=None
) -> tuple[float, int, str]:
    """Run a process; return (wall seconds, its peak RSS in KB, its stdout when captured)."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout or subprocess.PIPE)
    output = b""
    if stdout is None:
        output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command[:3]} failed")
    return seconds, usage.ru_maxrss, output.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--formats", nargs="+", choices=("csv", "jsonl"), default=["csv", "jsonl"])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each export (best is used)")
    parser.add_argument(
        "--verify", action="store_true", help="also time verify_export.py on the JSON Lines file"
    )
    parser.add_argument("--child", nargs=2, metavar=("FORMAT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    data = DATA.with_name(f"export-{args.events}.sqlite3")
    if args.regenerate or not data.exists():
        print(f"generating {args.events} events into {data} ...")
        generate(data, args.events)
    conn = sqlite3.connect(data)
    events = conn.execute("SELECT COUNT(*) FROM attempts_attemptevent").fetchone()[0]
    conn.close()
    OUT.mkdir(parents=True, exist_ok=True)
    env = _env(data)
    print(f"data: {data} ({data.stat().st_size / 1e6:.0f} MB, {events} events)")
    # The machine is shared: each measurement runs --repeat times, alternating the shell and
    # ledgerweb, and the best (fastest) run of each is compared; medians are printed too.
    samples: dict[str, dict[str, list[float]]] = {
        fmt: {
            "shell_s": [],
            "ours_s": [],
            "wall_s": [],
            "shell_kb": [],
            "ours_kb": [],
            "base_kb": [],
        }
        for fmt in args.formats
    }
    for _ in range(args.repeat):
        for fmt, mode in (("csv", "-csv"), ("jsonl", "-json")):
            if fmt not in args.formats:
                continue
            shell_out = OUT / f"shell.{fmt}"
            with shell_out.open("wb") as handle:
                shell_s, shell_kb, _ = run_measured(
                    [
                        "sqlite3",
                        "-readonly",
                        mode,
                        "-header" if fmt == "csv" else "-bail",
                        str(data),
                        SHELL_SQL,
                    ],
                    stdout=handle,
                )
            ours_out = OUT / f"ledgerweb.{fmt}"
            wall_s, ours_kb, printed = run_measured(
                [sys.executable, str(Path(__file__).resolve()), "--child", fmt, str(ours_out)],
                env=env,
            )
            inner = json.loads(printed.strip().splitlines()[-1])
            got = samples[fmt]
            got["shell_s"].append(shell_s)
            got["shell_kb"].append(shell_kb)
            got["ours_s"].append(inner["seconds"])
            got["wall_s"].append(wall_s)
            got["ours_kb"].append(ours_kb)
            got["base_kb"].append(inner["baseline_kb"])
    results = {}
    for fmt, got in samples.items():
        results[fmt] = {
            "shell_rps": events / min(got["shell_s"]),
            "shell_median_rps": events / statistics.median(got["shell_s"]),
            "shell_mb": max(got["shell_kb"]) / 1024,
            "shell_size": (OUT / f"shell.{fmt}").stat().st_size / 1e6,
            "ours_rps": events / min(got["ours_s"]),
            "ours_median_rps": events / statistics.median(got["ours_s"]),
            "ours_wall_rps": events / min(got["wall_s"]),
            "ours_mb": max(got["ours_kb"]) / 1024,
            "ours_base_mb": max(got["base_kb"]) / 1024,
            "ours_size": (OUT / f"ledgerweb.{fmt}").stat().st_size / 1e6,
        }
    if args.verify and "jsonl" in args.formats:
        began = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "attempts" / "verify_export.py"),
                str(OUT / "ledgerweb.jsonl"),
            ],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - began
        print(
            f"offline verification of the JSON Lines export: {done.stdout.strip()[:100]} "
            f"({events / seconds:,.0f} events/s)"
        )
    print()
    print(
        f"{'export':8} {'rows/s':>10} {'(incl. startup)':>16} {'peak RSS':>9} {'file':>8}"
        f" | {'sqlite3 rows/s':>14} {'peak RSS':>9} {'file':>8} | {'ratio':>6}"
    )
    for fmt, r in results.items():
        ratio = r["ours_rps"] / r["shell_rps"]
        print(
            f"{fmt:8} {r['ours_rps']:>10,.0f} {r['ours_wall_rps']:>16,.0f} {r['ours_mb']:>7.0f}MB"
            f" {r['ours_size']:>6.0f}MB | {r['shell_rps']:>14,.0f} {r['shell_mb']:>7.0f}MB"
            f" {r['shell_size']:>6.0f}MB | {ratio:>5.2f}x"
        )
    print()
    for fmt, r in results.items():
        print(
            f"{fmt}: medians over {args.repeat} runs: ledgerweb {r['ours_median_rps']:,.0f} rows/s,"
            f" sqlite3 {r['shell_median_rps']:,.0f} rows/s"
            f" ({r['ours_median_rps'] / r['shell_median_rps']:.2f}x)"
        )
    for fmt, r in results.items():
        ratio = r["ours_rps"] / r["shell_rps"]
        print(
            f"{fmt}: peak memory {r['ours_mb']:.0f} MB (Django loaded: {r['ours_base_mb']:.0f} MB) "
            f"{'<' if r['ours_mb'] < 150 else '>='} 150 MB target; throughput {ratio:.2f}x the shell "
            f"({'meets' if ratio >= 0.5 else 'misses'} the 0.5x target)"
        )


if __name__ == "__main__":
    main()
