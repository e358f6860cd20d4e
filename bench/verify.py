#!/usr/bin/env python3
"""Benchmark: ``verify_audit`` over a ledger of 1,000,000 events, against the write path's event
rate and a bare SHA-256 loop over the same payloads, measured in the same run.

    .venv/bin/python bench/verify.py [--events 1000000] [--jobs N] [--regenerate]
        [--database-url postgres://postgres@127.0.0.1:5432/postgres]

The ledger (cached under var/bench/, or a PostgreSQL database ``bench_verify_<events>``) is
written by a loader that builds each row with the write path's own functions
(``chain.attempt_event`` links and hashes each event, the creation event carries what
``states.create`` records) and inserts attempts and events in bulk, then sealed by the real
sealer (``chain.seal``). Attempts have four events each (created, dispatched, provider request
attached, confirmed) over two tenants, in the chain format the write path writes (format 3:
salted digests of the arguments and of each event's free text).

Prints, each in its own process (so its peak memory is its own): ``verify_audit`` with one job
and with ``--jobs`` jobs (events/s, wall time, peak RSS), the write path's rate (events/s of
``ledger.record_intent`` + moves in one process on the same database kind), and SHA-256 over the
events' canonical payloads in a bare loop; then the ratios. Target: at least 100,000 events/s,
peak memory flat in the ledger's size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DATA = Path(os.environ.get("LEDGERWEB_BENCH_DATA") or REPO / "var" / "bench")


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="ledgerweb.settings", PYTHONPATH=str(REPO))
    env["LEDGERWEB_DATA_DIR"] = str(DATA)
    if args.database_url:
        env["DATABASE_URL"] = _pg_url(args)
    else:
        env["LEDGERWEB_SQLITE_PATH"] = str(_sqlite_path(args))
    return env


def _name(args: argparse.Namespace) -> str:
    # The write-rate run writes into a ledger of its own, so the verified one stays as loaded.
    return "rate" if args.rate else str(args.events)


def _sqlite_path(args: argparse.Namespace) -> Path:
    return DATA / f"verify-{_name(args)}.sqlite3"


def _pg_url(args: argparse.Namespace) -> str:
    from bench.pg_peers import database_url

    return database_url(args.database_url, f"{args.database_prefix}_{_name(args)}")


def _django() -> None:
    """Django on the database the parent chose (its environment, ``_env``)."""
    import django

    django.setup()


# ---------------------------------------------------------------------------------------------
# The loader (runs in a child process: ``bench/verify.py --load``)


def load(events: int) -> None:
    """Write ``events`` events (four per attempt) as the write path writes them, then seal."""
    from django.core.management import call_command
    from django.db import connection

    from attempts import chain
    from attempts.actors import Actor
    from attempts.canonical import canonical_bytes, hash_bytes
    from attempts.config_history import acting
    from attempts.models import Attempt, AttemptEvent, EffectClass, Grant, State, Tenant, Tool

    call_command("migrate", "--noinput", verbosity=0)
    with acting(Actor.system("bench"), "bench/verify.py"):
        for slug in ("acme", "globex"):
            Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
        tool, _ = Tool.objects.get_or_create(
            name="send_invoice_email", defaults={"effect_class": EffectClass.IDEMPOTENT}
        )
        for slug in ("acme", "globex"):
            Grant.objects.get_or_create(
                tenant_id=slug, tool=tool, defaults={"policy_version": "v1"}
            )
    agent = Actor.agent("billing-agent")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    began = time.perf_counter()
    batch_a: list[Attempt] = []
    batch_e: list[tuple[int, list]] = []
    written = 0
    next_id = (Attempt.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1

    def flush() -> None:
        nonlocal batch_a, batch_e
        Attempt.objects.bulk_create(batch_a, batch_size=2000)
        rows = []
        for pk, evs in batch_e:
            for ev in evs:
                rows.append(
                    AttemptEvent(
                        attempt_id=pk,
                        action=ev.action,
                        actor_kind=ev.actor_kind,
                        actor=ev.actor,
                        from_state=ev.from_state,
                        to_state=ev.to_state,
                        reason=ev.reason,
                        details=ev.details,
                        created_at=ev.created_at,
                        prev_hash=ev.prev_hash,
                        hash=ev.hash,
                        chain_format=ev.chain_format,
                        text_digest=ev.text_digest,
                    )
                )
        AttemptEvent.objects.bulk_create(rows, batch_size=4000)
        batch_a, batch_e = [], []

    for n in range(events // 4):
        tenant = "acme" if n % 2 else "globex"
        moment = start + dt.timedelta(milliseconds=n * 10)
        args = {"customer": f"cus_{n}", "amount": n % 10000, "note": "monthly invoice"}
        attempt = Attempt(
            id=next_id + n,
            attempt_id=f"att_{n:026d}",
            tenant_id=tenant,
            task_id=f"task-{n // 10}",
            tool_name="send_invoice_email",
            args=args,
            args_hash=hash_bytes(canonical_bytes(args)),
            idempotency_key=f"invoice:{tenant}:{n}:send",
            state=State.INTENT_RECORDED,
            policy_version="v1",
            credential_scope=[],
            created_at=moment,
            updated_at=moment,
            chain_length=0,
            # Chain format 3, as states.create writes today: a salt per attempt, free text and
            # arguments committed by salted digests.
            args_salt=chain.new_salt(),
        )
        created = {
            "tenant": tenant,
            "task_id": attempt.task_id,
            "tool_name": attempt.tool_name,
            "idempotency_key": attempt.idempotency_key,
            "args_hash": attempt.args_hash,
            "policy_version": "v1",
            "credential_scope": [],
            "parent_attempt_id": None,
            "args_digest": chain.args_digest(attempt.args_salt, args),
        }
        steps = (
            ("attempt.created", "", State.INTENT_RECORDED, created),
            ("attempt.dispatched", State.INTENT_RECORDED, State.DISPATCHED, {}),
            (
                "attempt.updated",
                State.DISPATCHED,
                State.DISPATCHED,
                {"provider_request_id": f"req_{n}"},
            ),
            (
                "attempt.outcome_confirmed",
                State.DISPATCHED,
                State.OUTCOME_CONFIRMED,
                {"result_ref": f"receipt_{n}"},
            ),
        )
        evs = []
        for action, from_state, to_state, details in steps:
            event = chain.attempt_event(
                attempt,
                action=action,
                actor=agent,
                from_state=from_state,
                to_state=to_state,
                details=details,
                now=moment,
            )
            attempt.chain_head, attempt.chain_length = event.hash, attempt.chain_length + 1
            evs.append(event)
        attempt.state = State.OUTCOME_CONFIRMED
        attempt.version = 4
        attempt.provider_request_id, attempt.result_ref = f"req_{n}", f"receipt_{n}"
        batch_a.append(attempt)
        batch_e.append((attempt.id, evs))
        written += 4
        if len(batch_a) >= 5000:
            flush()
            print(f"  loaded {written} events ({time.perf_counter() - began:.0f}s)", end="\r")
    if batch_a:
        flush()
    loaded = time.perf_counter() - began
    sealing = time.perf_counter()
    while chain.seal() is not None:
        pass
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    print(
        f"  loaded {written} events in {loaded:.0f}s, sealed in "
        f"{time.perf_counter() - sealing:.0f}s"
    )


def write_rate(seconds: float) -> None:
    """Events/s of the write path in one process: intent, claim, provider id, confirm."""
    from attempts import ledger
    from attempts.actors import Actor

    agent = Actor.agent("rate-agent")
    began = time.perf_counter()
    events = 0
    n = 0
    run = os.urandom(4).hex()
    while time.perf_counter() - began < seconds:
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id=f"rate-{run}",
            tool_name="send_invoice_email",
            idempotency_key=f"rate:{run}:{n}",
            args={"customer": f"cus_{n}", "amount": n},
            actor=agent,
        )
        ledger.claim_dispatch(attempt, actor=agent)
        ledger.attach_provider_request(attempt, provider_request_id=f"req_{n}", actor=agent)
        ledger.confirm(attempt, result_ref=f"receipt_{n}", actor=agent)
        events += 4
        n += 1
    elapsed = time.perf_counter() - began
    print(f"RATE {events / elapsed:.0f}")


def sha_loop(count: int) -> None:
    """SHA-256 of canonical event payloads of the bench's size, precomputed: ``count`` of them,
    again until a second has passed."""
    from attempts import jcs
    from attempts.verify_export import event_payload

    payloads = []
    for n in range(min(count, 20000)):
        row = {
            "attempt_id": f"att_{n:026d}",
            "action": "attempt.outcome_confirmed",
            "actor_kind": "agent",
            "actor": "billing-agent",
            "from_state": "DISPATCHED",
            "to_state": "OUTCOME_CONFIRMED",
            "reason": "",
            "details": {"result_ref": f"receipt_{n}"},
            "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            "prev_hash": "0" * 64,
        }
        payloads.append(jcs.dumps(event_payload(row)))
    # At least a second of hashing: 200,000 payloads take about 0.15 s, short enough for one
    # pause of the machine to move the rate by a third.
    sha = hashlib.sha256
    hashed = 0
    began = time.perf_counter()
    while True:
        for n in range(count):
            sha(payloads[n % len(payloads)]).hexdigest()
        hashed += count
        elapsed = time.perf_counter() - began
        if elapsed >= 1.0:
            break
    print(f"SHA {hashed / elapsed:.0f}")


# ---------------------------------------------------------------------------------------------
# The parent


CPU: dict[str, float] = {}


def _child(args: argparse.Namespace, *extra: str) -> tuple[str, float, float]:
    """Run this script (or manage.py) in a child; returns (stdout, seconds, peak RSS MB). The
    CPU seconds it and its workers used are left in ``CPU["last"]``."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = usage.ru_maxrss
    cpu_before = usage.ru_utime + usage.ru_stime
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *extra],
        cwd=REPO,
        env=_env(args),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(extra)} failed:\n{done.stdout}\n{done.stderr}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["last"] = usage.ru_utime + usage.ru_stime - cpu_before
    return done.stdout, seconds, max(usage.ru_maxrss, before) / 1024


def _fresh(args: argparse.Namespace) -> None:
    """An empty database for ``args`` (dropped and created again)."""
    if args.database_url:
        import psycopg

        name = f"{args.database_prefix}_{_name(args)}"
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        DATA.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(str(_sqlite_path(args)) + suffix).unlink(missing_ok=True)


def _prepare(args: argparse.Namespace) -> None:
    if args.database_url:
        import psycopg

        name = f"{args.database_prefix}_{_name(args)}"
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if exists and args.regenerate:
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                exists = None
            if exists:
                return
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        path = _sqlite_path(args)
        if path.exists() and not args.regenerate:
            return
        DATA.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    print(f"loading a ledger of {args.events} events ...")
    out, seconds, _ = _child(args, str(Path(__file__)), "--load", "--events", str(args.events))
    print(out.strip().splitlines()[-1] if out.strip() else f"  loaded in {seconds:.0f}s")


def _verify(args: argparse.Namespace, jobs: int) -> tuple[int, float, float]:
    out, seconds, peak = _child(args, "manage.py", "verify_audit", "--jobs", str(jobs))
    match = re.search(r"OK: .*?: (\d+) events verify", out)
    took = re.search(r"checked in ([0-9.]+)s", out)
    if not match or not took:
        sys.exit(f"verify_audit did not say OK:\n{out}")
    # The command's own measure: verification without the interpreter's start-up.
    return int(match.group(1)), float(took.group(1)), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--database-url", help="PostgreSQL server (default: SQLite)")
    parser.add_argument("--database-prefix", default="bench_verify")
    parser.add_argument("--rate-seconds", type=float, default=5.0)
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sha", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        _django()
        load(args.events)
        return
    if args.rate:
        _django()
        load(0)  # the tenants, tool and grants only
        write_rate(args.rate_seconds)
        return
    if args.sha:
        _django()
        sha_loop(args.events)
        return
    if args.events < 4:
        parser.error("--events must be at least 4")
    _prepare(args)
    kind = "PostgreSQL" if args.database_url else "SQLite"
    print(f"verify_audit on {kind}, {args.events} events (measured on this machine, in this run)")
    results = {}
    for jobs in sorted({1, args.jobs}):
        count, seconds, peak = _verify(args, jobs)
        results[jobs] = count / seconds
        # CPU time is what a busy machine cannot inflate (the child's start-up included).
        print(
            f"  --jobs {jobs}: {count} events in {seconds:.2f}s = {count / seconds:,.0f} events/s, "
            f"peak RSS {peak:.0f} MB; {CPU['last']:.2f} CPU s = "
            f"{count / CPU['last']:,.0f} events per CPU second"
        )
    rate_args = argparse.Namespace(**{**vars(args), "rate": True})
    _fresh(rate_args)
    out, _, _ = _child(
        rate_args, str(Path(__file__)), "--rate", "--rate-seconds", str(args.rate_seconds)
    )
    rate = float(out.split("RATE", 1)[1])
    out, _, _ = _child(
        args, str(Path(__file__)), "--sha", "--events", str(min(args.events, 2_000_000))
    )
    sha = float(out.split("SHA", 1)[1])
    best = results[args.jobs]
    print(f"  write path (one process, intent + 3 moves): {rate:,.0f} events/s")
    print(f"  bare SHA-256 over the events' canonical payloads: {sha:,.0f} hashes/s")
    print(
        f"ratio verify/write path: {best / rate:.1f}x; verify/bare SHA-256: {best / sha:.1%}; "
        f"--jobs {args.jobs} / --jobs 1: {best / results[1]:.2f}x"
    )
    print(json.dumps({"events_per_s": round(best), "write_rate": round(rate), "sha": round(sha)}))


if __name__ == "__main__":
    main()
