#!/usr/bin/env python
"""Benchmark: the ledger's write path on PostgreSQL beside raw psycopg 3 and DBOS Transact.

One tool call is three durable commits: record the intent, claim the dispatch, confirm. Each
system writes its own rows into its own database on one PostgreSQL server:

- ledger: ``attempts.ledger`` in process (record_intent, claim_dispatch, confirm), the product;
- raw: psycopg 3 writing the same rows into the same schema (attempt + chained events with the
  same hashes), three transactions per call, no framework;
- raw1: the same rows, each commit one statement in autocommit (the event ``INSERT`` in a
  data-modifying ``WITH`` beside the attempt's, as ``attempts/rows.py`` sends them): the round
  trip floor;
- dbos: DBOS Transact running one workflow with one step per call (its own system database).

For each round and each process count (1 and 8 by default) the three systems run one after the
other; the processes of one system start together at a shared moment and run for ``--seconds``.
It prints calls/s for each and the ratios the scale-out targets are stated in, and, before the
run and after each round, one connection's durable commit round trip: on a shared machine the
disk's sync latency moves the 1-process figures (and so the 8/1 ratio) far more than any code.

    .venv/bin/pip install -e '.[bench]'          # DBOS Transact, bench only
    .venv/bin/python bench/pg_peers.py [--seconds 8] [--rounds 2] [--procs 1,8]
        [--database-url postgres://postgres@127.0.0.1:5432/postgres]

Targets (issue 12): at 1 process the ledger costs at most 2.5x raw; at 8 processes the ledger is
at least 2x DBOS and at least 0.4x raw, and its 8-process figure is at least 1.5x its 1-process one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PYTHON = sys.executable
SYSTEMS = ("ledger", "raw", "raw1", "dbos")
# One database per system, named <prefix>_<system> (--database-prefix).
DATABASES = {system: f"bench_peers_{system}" for system in SYSTEMS}


def database_url(base: str, name: str) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def admin(base: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(database_url(base, "postgres"), autocommit=True) as conn:
        conn.execute(statement)


def prepare(base: str, systems: list[str]) -> None:
    """Fresh databases for ``systems``: the ledger's and raw's migrated to the product's schema
    and seeded."""
    for system in systems:
        admin(base, f'DROP DATABASE IF EXISTS "{DATABASES[system]}" WITH (FORCE)')
        admin(base, f'CREATE DATABASE "{DATABASES[system]}"')
    for system in ("ledger", "raw", "raw1"):
        if system not in systems:
            continue
        env = {**os.environ, "DATABASE_URL": database_url(base, DATABASES[system])}
        subprocess.run(
            [PYTHON, str(REPO / "manage.py"), "migrate", "-v0"], env=env, check=True, cwd=REPO
        )
        subprocess.run(
            [PYTHON, __file__, "--seed"], env=env, check=True, cwd=REPO, stdout=subprocess.DEVNULL
        )
    if "dbos" not in systems:
        return
    # DBOS creates its system tables on first launch: do it once, not in eight racing processes.
    subprocess.run(
        [
            PYTHON,
            __file__,
            "--worker",
            "dbos",
            "--seconds",
            "0",
            "--start-at",
            "0",
            "--prefix",
            "w",
        ],
        env={**os.environ, "DATABASE_URL": database_url(base, DATABASES["dbos"])},
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )


def seed() -> None:
    django_setup()
    from attempts.models import EffectClass, Grant, Tenant, Tool

    tenant = Tenant.objects.create(slug="acme", name="Acme")
    tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
    Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=["crm"])


def django_setup() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    os.environ.setdefault("LEDGERWEB_DATA_DIR", str(REPO / "var" / "bench"))
    import django

    django.setup()


# ---------------------------------------------------------------------------------------------
# One process of one system: wait for the shared start, make calls until the deadline.


def run_ledger(prefix: str, start_at: float, seconds: float) -> int:
    django_setup()
    from attempts import ledger
    from attempts.states import Actor

    actor = Actor.agent("bench")

    def call(i: int) -> None:
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id=f"task-{i}",
            tool_name="update_crm",
            idempotency_key=f"{prefix}:{i}",
            args={"customer": i, "note": "benchmark"},
            actor=actor,
        )
        ledger.claim_dispatch(attempt, actor=actor)
        ledger.confirm(attempt, result_ref=f"receipt-{i}", actor=actor)

    return _timed(call, prefix, start_at, seconds)


RAW_ATTEMPT = """
INSERT INTO attempts_attempt (attempt_id, tenant_id, task_id, tool_name, args, args_hash,
  args_salt, idempotency_key, state, version, provider_request_id, result_ref, policy_version,
  credential_scope, review_reason, awaiting_approval, send_count, lookup_count, next_check_at,
  lease_owner, chain_head, chain_length, sealed, created_at, updated_at)
VALUES (%s, 'acme', %s, 'update_crm', %s, %s, %s, %s, 'INTENT_RECORDED', 1, '', '', 'v1', %s, '',
  false, 0, 0, %s, '', %s, 1, false, %s, %s) RETURNING id
"""
RAW_EVENT = """
INSERT INTO attempts_attemptevent (attempt_id, action, actor_kind, actor, from_state, to_state,
  reason, details, created_at, prev_hash, hash, chain_format, text_digest)
VALUES (%s, %s, 'agent', 'bench', %s, %s, '', %s, %s, %s, %s, 3, %s)
"""
RAW_MOVE = """
UPDATE attempts_attempt SET state = %s, version = version + 1, chain_head = %s,
  chain_length = chain_length + 1, sealed = false, next_check_at = %s, result_ref = %s,
  send_count = send_count + %s, updated_at = %s
WHERE id = %s AND state = %s AND version = %s
"""

# raw1: each commit one statement, the event written from the attempt's CTE.
_RAW1_EVENT = """INSERT INTO attempts_attemptevent (attempt_id, action, actor_kind, actor, from_state,
  to_state, reason, details, created_at, prev_hash, hash, chain_format, text_digest)
SELECT {cte}.id, %s, 'agent', 'bench', %s, %s, '', %s, %s, %s, %s, 3, %s FROM {cte}"""
RAW1_INTENT = (
    f"WITH new AS ({RAW_ATTEMPT}) " + _RAW1_EVENT.format(cte="new") + " RETURNING attempt_id"
)
RAW1_MOVE = f"WITH moved AS ({RAW_MOVE} RETURNING id) " + _RAW1_EVENT.format(cte="moved")


def run_raw1(prefix: str, start_at: float, seconds: float) -> int:
    return run_raw(prefix, start_at, seconds, one_statement=True)


def run_raw(prefix: str, start_at: float, seconds: float, *, one_statement: bool = False) -> int:
    import hashlib

    import psycopg
    from psycopg.types.json import Jsonb

    from attempts import jcs  # the encoder the ledger hashes with: the floor pays what it pays
    from attempts.verify_export import GENESIS, args_commitment
    from bench.raw_rows import format3_event

    conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=one_statement)
    salts: dict[str, str] = {}

    def event_row(attempt_id: str, prev: str, frm: str, to: str, details: dict, now):
        action = f"attempt.{to.lower()}" if frm else "attempt.created"
        return format3_event(
            attempt_id, action, frm, to, details, now, prev, salts[attempt_id], dumps=jcs.dumps
        )

    def event(pk: int, attempt_id: str, prev: str, frm: str, to: str, details: dict, now):
        row, digest = event_row(attempt_id, prev, frm, to, details, now)
        conn.execute(
            RAW_EVENT,
            (pk, row["action"], frm, to, Jsonb(details), now, prev, digest, row["text_digest"]),
        )
        return digest

    def call(i: int) -> None:
        args = {"customer": i, "note": "benchmark"}
        args_hash = hashlib.sha256(jcs.dumps(args)).hexdigest()
        attempt_id = "att_" + uuid.uuid4().hex[:26].upper()
        salts[attempt_id] = salt = uuid.uuid4().hex + uuid.uuid4().hex
        key = f"{prefix}:{i}"
        now = dt.datetime.now(dt.UTC)
        # What the ledger records with an intent.
        details = {
            "tenant": "acme",
            "task_id": f"task-{i}",
            "tool_name": "update_crm",
            "idempotency_key": key,
            "args_hash": args_hash,
            "policy_version": "v1",
            "credential_scope": ["crm"],
            "parent_attempt_id": None,
            "args_digest": args_commitment(salt, args, dumps=jcs.dumps),
        }
        first, head = event_row(attempt_id, GENESIS, "", "INTENT_RECORDED", details, now)
        later = now + dt.timedelta(seconds=120)
        attempt_values = (
            attempt_id, f"task-{i}", Jsonb(args), args_hash, salt, key, Jsonb(["crm"])
        )  # fmt: skip
        attempt_values += (later, head, now, now)
        created = ("attempt.created", "", "INTENT_RECORDED", Jsonb(details), now, GENESIS, head)
        created += (first["text_digest"],)
        if one_statement:
            pk = conn.execute(RAW1_INTENT, attempt_values + created).fetchone()[0]
        else:
            with conn.transaction():
                pk = conn.execute(RAW_ATTEMPT, attempt_values).fetchone()[0]
                conn.execute(RAW_EVENT, (pk, *created))
        version = 1
        for frm, to, result, sends in (
            ("INTENT_RECORDED", "DISPATCHED", "", 1),
            ("DISPATCHED", "OUTCOME_CONFIRMED", f"receipt-{i}", 0),
        ):
            now = dt.datetime.now(dt.UTC)
            extra = {"result_ref": result, "review_reason": ""} if result else {}
            if one_statement:
                row, digest = event_row(attempt_id, head, frm, to, extra, now)
                moved = (to, digest, later if not result else None, result, sends, now)
                changed = conn.execute(
                    RAW1_MOVE,
                    (*moved, pk, frm, version, row["action"], frm, to, Jsonb(extra), now, head)
                    + (digest, row["text_digest"]),
                ).rowcount
            else:
                with conn.transaction():
                    digest = event(pk, attempt_id, head, frm, to, extra, now)
                    moved = (to, digest, later if not result else None, result, sends, now)
                    changed = conn.execute(RAW_MOVE, (*moved, pk, frm, version)).rowcount
            if changed != 1:
                raise RuntimeError("raw compare-and-set lost")
            head, version = digest, version + 1

    try:
        return _timed(call, prefix, start_at, seconds)
    finally:
        conn.close()


def run_dbos(prefix: str, start_at: float, seconds: float) -> int:
    from dbos import DBOS

    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    DBOS(config={"name": "ledgerbench", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def effect(i: int) -> str:
        return f"receipt-{i}"

    @DBOS.workflow()
    def tool_call(i: int) -> str:
        return effect(i)

    DBOS.launch()
    try:
        return _timed(tool_call, prefix, start_at, seconds)
    finally:
        DBOS.destroy()


def _timed(call, prefix: str, start_at: float, seconds: float) -> int:
    call(-1)  # warm: connections, caches, imports
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        call(done)
        done += 1
    return done


WORKERS = {"ledger": run_ledger, "raw": run_raw, "raw1": run_raw1, "dbos": run_dbos}


# ---------------------------------------------------------------------------------------------
# The driver


def measure(base: str, system: str, procs: int, seconds: float, tag: str) -> float:
    """Calls/s of ``procs`` processes of ``system`` started together."""
    start_at = time.time() + 3.0 + 0.4 * procs  # time for every process to import and warm up
    env = {**os.environ, "DATABASE_URL": database_url(base, DATABASES[system])}
    children = [
        subprocess.Popen(
            [
                PYTHON,
                __file__,
                "--worker",
                system,
                "--prefix",
                f"{tag}-{n}-{uuid.uuid4().hex[:6]}",
                "--start-at",
                repr(start_at),
                "--seconds",
                repr(seconds),
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(procs)
    ]
    total = 0
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise SystemExit(f"{system} worker failed (exit {child.returncode})")
        total += json.loads(out.strip().splitlines()[-1])["calls"]
    return total / seconds


def commit_round_trip(base: str, table: str, seconds: float = 2.0) -> float:
    """Microseconds one connection spends per durable one-row commit on this server now: the
    floor under a single process's figure (three commits per call), which swings with the
    disk's sync latency and the host's scheduling far more than CPU work does."""
    import psycopg
    from psycopg import sql

    name = sql.Identifier(table)
    insert = sql.SQL("INSERT INTO {} (body) VALUES (%s)").format(name)
    with psycopg.connect(database_url(base, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
        conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, body text)").format(name))
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.execute(insert, ("x" * 200,))
            n += 1
        elapsed = time.perf_counter() - start
        conn.execute(sql.SQL("DROP TABLE {}").format(name))
    return elapsed / n * 1e6


def row_shape(url: str) -> tuple:
    """What must match between the ledger's rows and raw's for one tool call (the newest
    confirmed one): the attempt's state and counters, which fields are set, and each event's
    move and detail keys."""
    import psycopg

    with psycopg.connect(url) as conn:
        pk, *attempt = conn.execute(
            "SELECT id, state, version, chain_length, send_count, lookup_count, review_reason,"
            " policy_version, credential_scope, sealed, next_check_at IS NULL,"
            " result_ref != '' FROM attempts_attempt WHERE state = 'OUTCOME_CONFIRMED'"
            " ORDER BY id DESC LIMIT 1"
        ).fetchone()
        events = [
            (action, kind, frm, to, sorted(details))
            for action, kind, frm, to, details in conn.execute(
                "SELECT action, actor_kind, from_state, to_state, details"
                " FROM attempts_attemptevent WHERE attempt_id = %s ORDER BY id",
                (pk,),
            )
        ]
    return tuple(attempt), events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--procs", default="1,8", help="process counts, comma-separated")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--database-prefix",
        default="bench_peers",
        help="the databases made afresh are <prefix>_ledger, <prefix>_raw, <prefix>_dbos",
    )
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed:
        seed()
        return
    if args.worker:
        calls = WORKERS[args.worker](args.prefix, args.start_at, args.seconds)
        print(json.dumps({"calls": calls}))
        return
    procs = [int(p) for p in args.procs.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    print(f"preparing databases on {urlsplit(args.database_url).netloc} ...", flush=True)
    DATABASES.update({system: f"{args.database_prefix}_{system}" for system in SYSTEMS})
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)} (choose from {', '.join(SYSTEMS)})")
    prepare(args.database_url, systems)
    commit_table = f"{args.database_prefix}_commit"
    print(
        f"durable commit round trip here now: {commit_round_trip(args.database_url, commit_table):.0f} us",
        flush=True,
    )
    results: dict[tuple[str, int], list[float]] = {}
    for round_number in range(1, args.rounds + 1):
        for count in procs:
            for system in systems:
                rate = measure(args.database_url, system, count, args.seconds, f"r{round_number}")
                results.setdefault((system, count), []).append(rate)
                print(f"round {round_number}: {system:6} x{count}: {rate:8.1f} calls/s", flush=True)
        print(
            f"round {round_number}: durable commit round trip "
            f"{commit_round_trip(args.database_url, commit_table, 1.0):.0f} us",
            flush=True,
        )
    for raw in ("raw", "raw1"):
        if "ledger" not in systems or raw not in systems:
            continue
        ledger_rows = row_shape(database_url(args.database_url, DATABASES["ledger"]))
        raw_rows = row_shape(database_url(args.database_url, DATABASES[raw]))
        if ledger_rows != raw_rows:
            raise SystemExit(
                f"{raw} does not write the ledger's rows:\n  ledger {ledger_rows}\n  {raw} {raw_rows}"
            )
        print(f"ledger and {raw} wrote the same rows (attempt fields, events and their details)")
    print("\ncalls/s (3 commits each), per round:")
    for count in procs:
        row = "  ".join(
            f"{system} {' / '.join(f'{r:.0f}' for r in results[(system, count)])}"
            for system in systems
        )
        print(f"  {count} process{'es' if count > 1 else ''}: {row}")

    def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
        if a not in results or b not in results:
            return "n/a"
        return " / ".join(f"{x / y:.2f}" for x, y in zip(results[a], results[b], strict=True) if y)

    low, high = min(procs), max(procs)
    print("\nratios, per round:")
    print(
        f"  ledger / raw   at {low}: {ratio(('ledger', low), ('raw', low))}  (target: >= 0.40, i.e. at most 2.5x)"
    )
    print(f"  ledger / dbos  at {high}: {ratio(('ledger', high), ('dbos', high))}  (target >= 2.0)")
    print(f"  ledger / raw   at {high}: {ratio(('ledger', high), ('raw', high))}  (target >= 0.4)")
    print(
        f"  ledger {high} / ledger {low}: {ratio(('ledger', high), ('ledger', low))}  (target >= 1.5)"
    )
    print(f"  dbos / raw     at {high}: {ratio(('dbos', high), ('raw', high))}")
    # Issue 46: the ledger against the one-statement floor, at least 0.6 with one process and
    # 0.5 with several.
    for count in sorted({low, high}):
        print(
            f"  ledger / raw1  at {count}: {ratio(('ledger', count), ('raw1', count))}"
            f"  (target >= {0.6 if count == 1 else 0.5})"
        )
    # The floor's own scaling on this machine: what more processes can give at all when the
    # clients and the database share its cores.
    print(
        f"  raw {high} / raw {low}: {ratio(('raw', high), ('raw', low))}  (the floor's own scaling)"
    )


if __name__ == "__main__":
    main()
