#!/usr/bin/env python3
"""Benchmark: a big ledger (N attempts of chained events, four for most) and what an operator and
the agents feel at that size: queue pages, prefix searches, the overview, the approvals inbox
and count, the export and ``verify_audit`` rates, bytes per attempt, and the write path at N
against an empty ledger.

    .venv/bin/python bench/scale.py --database postgres [--attempts 10000000]
    .venv/bin/python bench/scale.py --database sqlite   [--attempts 1000000]
    .venv/bin/python bench/scale.py --database postgres --drop     # remove the bench data

How the ledger is built: five template attempts (confirmed, failed, UNKNOWN, MANUAL_REVIEW, and
AWAITING_APPROVAL under an approval policy, 1 in 1,000) are written through the product's own
write path (``attempts.ledger``, ``attempts.states``); every
other attempt is a copy of one of them with its own ids, key, task, arguments, provider request
and times, its events re-hashed with the product's hash function (``verify_export.event_hash``
with ``attempts.jcs``) and linked into its own chain. The loader first re-hashes the templates'
own events and stops if it does not get the hashes the write path wrote, so the rows are the
write path's rows. Rows go in batches (PostgreSQL ``COPY``, SQLite ``executemany``), each batch
one transaction, so a build that is stopped resumes where it stopped. The sealer (``chain.seal``)
seals everything, as the reconcile worker would: on PostgreSQL a second process seals beside the
loader while it builds (as the worker seals beside the agents), and what is left is sealed after.

The write path's cost: ``--calls`` tool calls (record, claim, attach a provider request, confirm)
in this process against an empty ledger and against the big one, alternating ``--rounds`` times
(the database the connection points at is switched in place); the ratio of the medians is
printed (target at most 1.2x). Page timings are the median server time over ``--repeat`` requests
through Django's test client (middleware, queries, template), after two warm-up requests.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.world import TENANTS, TOOLS, seed_world  # noqa: E402

# Template shape and its share of the attempts (1 in 100 MANUAL_REVIEW, 5 UNKNOWN, 4 FAILED,
# 1 in 1,000 held by an approval policy, AWAITING_APPROVAL, for the approvals inbox).
SHAPES = ("OUTCOME_CONFIRMED", "FAILED", "UNKNOWN", "MANUAL_REVIEW", "AWAITING_APPROVAL")
# The held template's tool: a policy holds every call of it (the write-path calls use update_crm).
HELD_TOOL = "open_ticket"
SPAN_DAYS = 60
BATCH = 5000
TARGET_MS = 50.0
TARGET_WRITE_RATIO = 1.2
KEY_PREFIX = "scale"


def shape_of(n: int) -> str:
    spread = n * 2654435761
    if spread % 1000 == 999:
        return "AWAITING_APPROVAL"
    r = spread % 100
    if r == 0:
        return "MANUAL_REVIEW"
    if r <= 5:
        return "UNKNOWN"
    if r <= 9:
        return "FAILED"
    return "OUTCOME_CONFIRMED"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="sqlite")
    parser.add_argument("--attempts", type=int, help="default 10,000,000 (PostgreSQL), 1,000,000")
    parser.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server to create the bench databases on (PostgreSQL only)",
    )
    parser.add_argument(
        "--name",
        default="scale_bench",
        help="the bench database (PostgreSQL) or file stem under --dir (SQLite); its empty "
        "twin is <name>_empty",
    )
    parser.add_argument("--dir", default=str(REPO / "var" / "bench"), help="SQLite files")
    parser.add_argument("--repeat", type=int, default=9, help="timed requests per page")
    parser.add_argument("--calls", type=int, default=100, help="write-path calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="write-path rounds per database")
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated parts to skip: pages,export,verify,write, and seal (measure a "
        "ledger whose attempts are not sealed yet: sealing 10M takes over an hour; "
        "the figures then say so, and verify is skipped with it)",
    )
    parser.add_argument("--drop", action="store_true", help="remove the bench data and stop")
    # The sealer the build starts beside itself on PostgreSQL (this file, in another process).
    parser.add_argument("--sealer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attempts is None:
        args.attempts = 10_000_000 if args.database == "postgres" else 1_000_000
    if args.attempts < 10:
        parser.error("--attempts must be at least 10")
    return args


ARGS = parse_args()


def pg_url(name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(ARGS.database_url)
    return urlunsplit(parts._replace(path="/" + name))


def sqlite_path(name: str) -> str:
    return str(Path(ARGS.dir) / f"{name}.sqlite3")


def drop() -> None:
    if ARGS.database == "postgres":
        import psycopg

        with psycopg.connect(ARGS.database_url, autocommit=True) as conn:
            for name in (ARGS.name, ARGS.name + "_empty"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                print(f"dropped database {name}")
    else:
        for name in (ARGS.name, ARGS.name + "_empty"):
            for suffix in ("", "-wal", "-shm"):
                Path(sqlite_path(name) + suffix).unlink(missing_ok=True)
            print(f"removed {sqlite_path(name)}")


def create_databases() -> None:
    if ARGS.database == "postgres":
        import psycopg

        with psycopg.connect(ARGS.database_url, autocommit=True) as conn:
            for name in (ARGS.name, ARGS.name + "_empty"):
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if exists.fetchone() is None:
                    conn.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = pg_url(ARGS.name)
    else:
        Path(ARGS.dir).mkdir(parents=True, exist_ok=True)
        os.environ.pop("DATABASE_URL", None)
        os.environ["LEDGERWEB_SQLITE_PATH"] = sqlite_path(ARGS.name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    os.environ.setdefault("LEDGERWEB_DATA_DIR", str(REPO / "var"))


if ARGS.drop:
    drop()
    raise SystemExit(0)
create_databases()

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from attempts import chain, counts, jcs, ledger, log, states  # noqa: E402
from attempts.actors import Actor  # noqa: E402
from attempts.canonical import normalize_args  # noqa: E402
from attempts.models import (  # noqa: E402
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    CheckpointLeaf,
    ProviderEffect,
    RecordedKey,
    State,
    key_digest,
)
from attempts.verify_export import (  # noqa: E402
    GENESIS,
    SALTED_FORMAT,
    args_commitment,
    event_hash,
    text_digest,
)

ATTEMPT_TABLE = Attempt._meta.db_table
EVENT_TABLE = AttemptEvent._meta.db_table
LEAF_TABLE = CheckpointLeaf._meta.db_table
# The permanent indexes every intent (key) and every claimed provider effect writes a row to.
KEY_TABLE = RecordedKey._meta.db_table
EFFECT_TABLE = ProviderEffect._meta.db_table
KEY_COLUMNS = ["key_digest", "tenant_id", "tool_name", "args_hash", "attempt_id"]
EFFECT_COLUMNS = ["tool_name", "provider_request_id", "attempt_id"]
# Attempt fields a copy takes from its own n (the rest are the template's).
VARYING = ("tenant", "task_id", "tool_name", "idempotency_key", "args_hash")


def use_database(name: str) -> None:
    """Point the default connection at another database (same server or folder)."""
    connection.close()
    connection.settings_dict["NAME"] = name if ARGS.database == "postgres" else sqlite_path(name)
    cache.clear()


def setup_world() -> User:
    call_command("migrate", verbosity=0)
    return seed_world()


# ---------------------------------------------------------------------------------------------
# Templates and the loader


AGENT = Actor.agent("scale-agent")


def template_key(shape: str) -> str:
    return f"{KEY_PREFIX}-template:{shape}"


def write_templates() -> dict[str, int]:
    """One attempt per shape through the product's write path (once); their primary keys."""
    found = dict(
        Attempt.objects.filter(idempotency_key__startswith=f"{KEY_PREFIX}-template:")
        .values_list("idempotency_key", "pk")
        .order_by()
    )
    out = {}
    for shape in SHAPES:
        key = template_key(shape)
        if key in found:
            out[shape] = found[key]
            continue
        if shape == "AWAITING_APPROVAL":
            ApprovalPolicy.objects.get_or_create(
                name="scale-hold",
                defaults={"tool_id": HELD_TOOL, "max_wait": dt.timedelta(days=90)},
            )
            attempt, _ = ledger.record_intent(
                tenant="north",
                task_id="template-task",
                tool_name=HELD_TOOL,
                idempotency_key=key,
                args={"to": "customer@example.test", "amount": 1, "ref": "inv-template"},
                actor=AGENT,
            )
            if attempt.state != State.AWAITING_APPROVAL:
                raise SystemExit(f"the held template is {attempt.state}, not AWAITING_APPROVAL")
            out[shape] = attempt.pk
            continue
        attempt, _ = ledger.record_intent(
            tenant="north",
            task_id="template-task",
            tool_name="update_crm",
            idempotency_key=key,
            args={"to": "customer@example.test", "amount": 1, "ref": "inv-template"},
            actor=AGENT,
        )
        attempt, _ = ledger.claim_dispatch(attempt, actor=AGENT)
        if shape == "MANUAL_REVIEW":
            attempt = ledger.mark_unknown(attempt, reason="timeout", actor=AGENT)
            states.move(
                attempt,
                State.MANUAL_REVIEW,
                actor=Actor.worker("scale-reconciler"),
                reason="the provider's record differs from the intent",
                fields={"review_reason": "payload_mismatch"},
                next_check_at=None,
            )
        else:
            # One provider effect confirms one attempt: each template has its own request id.
            attempt = ledger.attach_provider_request(attempt, f"req_template_{shape}", actor=AGENT)
            if shape == "OUTCOME_CONFIRMED":
                ledger.confirm(attempt, result_ref="rcpt_template", actor=AGENT)
            elif shape == "FAILED":
                ledger.fail(
                    attempt, reason="declined by the provider", retryable=False, actor=AGENT
                )
            else:
                ledger.mark_unknown(attempt, reason="timeout", actor=AGENT)
        out[shape] = attempt.pk
    return out


def _columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, table)
    return [c.name for c in description]


def _read(table: str, where: str, params: list[Any]) -> list[dict[str, Any]]:
    columns = _columns(table)
    sql = f"SELECT {', '.join(columns)} FROM {table} WHERE {where} ORDER BY id"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def _moment(value: Any) -> dt.datetime | None:
    """A timestamp as Django reads it back (SQLite gives text in raw SQL)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _row_hash(attempt_id: str, event: dict[str, Any], prev: str, when: dt.datetime) -> str:
    return event_hash(
        {
            "v": event["chain_format"],
            "attempt_id": attempt_id,
            "action": event["action"],
            "actor_kind": event["actor_kind"],
            "actor": event["actor"],
            "from_state": event["from_state"],
            "to_state": event["to_state"],
            "reason": event["reason"],
            "details": event["details"],
            "created_at": when,
            "prev_hash": prev,
            "text_digest": event.get("text_digest", ""),
        },
        dumps=jcs.dumps,
    )


class Template:
    """One shape's rows as the write path wrote them, and how to copy them for attempt n."""

    def __init__(self, pk: int) -> None:
        [self.attempt] = _read(ATTEMPT_TABLE, "id = %s", [pk])
        self.events = _read(EVENT_TABLE, "attempt_id = %s", [pk])
        base = _moment(self.attempt["created_at"])
        for name in ("created_at", "updated_at", "next_check_at", "lease_until"):
            moment = _moment(self.attempt[name])
            self.attempt[name] = None if moment is None else moment - base
        for name in ("args", "credential_scope"):
            self.attempt[name] = _json(self.attempt[name])
        prev = GENESIS
        for event in self.events:
            event["details"] = _json(event["details"])
            event["created_at"] = _moment(event["created_at"])
            again = _row_hash(self.attempt["attempt_id"], event, prev, event["created_at"])
            if again != event["hash"] or event["prev_hash"] != prev:
                raise SystemExit(f"the loader does not hash as the write path: event {event['id']}")
            prev = event["hash"]
            event["created_at"] -= base

    def copy(self, n: int, attempt_pk: int, first_event_pk: int, created: dt.datetime):
        tenant = TENANTS[n % len(TENANTS)]
        tool = TOOLS[(n // 7) % len(TOOLS)]
        if self.attempt["state"] == State.AWAITING_APPROVAL:
            tool = self.attempt["tool_name"]  # its policy's tool
        args = normalize_args(
            {"to": f"customer-{n}@example.test", "amount": n % 9973, "ref": f"inv-{n}"}
        )
        attempt_id = "att_S" + f"{n:025d}"
        own = {
            "tenant": tenant,
            "tenant_id": tenant,
            "task_id": f"task-{n // 3}",
            "tool_name": tool,
            "idempotency_key": f"{tenant}:{tool}:{n}",
            "args_hash": args.args_hash,
        }
        if self.attempt["provider_request_id"]:
            own["provider_request_id"] = f"req_{n:012d}"
        if self.attempt["result_ref"]:
            own["result_ref"] = f"rcpt_{n}"
        row = dict(self.attempt)
        row.update({k: v for k, v in own.items() if k in row})
        row.update(id=attempt_pk, attempt_id=attempt_id, args=args.value)
        # Chain format 3: each copy has its own salt, and its digests are its own.
        salt = row["args_salt"] = secrets.token_hex(32) if row.get("args_salt") else ""
        for name in ("created_at", "updated_at", "next_check_at", "lease_until"):
            if row[name] is not None:
                row[name] = created + row[name]
        events = []
        prev = GENESIS
        for i, template in enumerate(self.events):
            event = dict(template)
            details = dict(template["details"])
            for key in list(details):
                if key in own and key != "tenant_id":
                    details[key] = own[key]
            if "args_digest" in details:
                details["args_digest"] = args_commitment(salt, args.value, dumps=jcs.dumps)
            if event["chain_format"] >= SALTED_FORMAT:
                event["text_digest"] = text_digest(salt, event["reason"], details, dumps=jcs.dumps)
            when = created + template["created_at"]
            event.update(
                id=first_event_pk + i, attempt_id=attempt_pk, details=details, created_at=when
            )
            event["prev_hash"] = prev
            event["hash"] = prev = _row_hash(attempt_id, event, prev, when)
            events.append(event)
        row["chain_head"], row["chain_length"], row["sealed"] = prev, len(events), False
        return row, events


def _adapt(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, dt.datetime) and ARGS.database == "sqlite":
        return connection.ops.adapt_datetimefield_value(value)
    return value


def _write(table: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    values = [[_adapt(row[c]) for c in columns] for row in rows]
    with connection.cursor() as cursor:
        if ARGS.database == "postgres":
            with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for value in values:
                    copy.write_row(value)
        else:
            marks = ", ".join(["%s"] * len(columns))
            cursor.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",  # noqa: S608
                values,
            )


def _max_id(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")  # noqa: S608
        return cursor.fetchone()[0]


def _bump_sequences() -> None:
    if ARGS.database != "postgres":
        return  # SQLite's AUTOINCREMENT follows the largest id written
    with connection.cursor() as cursor:
        for table in (ATTEMPT_TABLE, EVENT_TABLE, EFFECT_TABLE):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "  # noqa: S608
                f"(SELECT MAX(id) FROM {table}))"
            )


def loaded_count() -> int:
    return Attempt.objects.filter(attempt_id__startswith="att_S").count()


def run_sealer() -> None:
    """Seal what the loader commits, until the build stops this process (a seal cut short rolls
    back: a checkpoint is one transaction) or the build is gone (stopped by a signal that left
    it no time to stop this one)."""
    build = os.getppid()
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
    while os.getppid() == build:
        if chain.seal() is None:
            time.sleep(0.5)


def start_sealer() -> subprocess.Popen | None:
    if ARGS.database != "postgres":
        return None  # SQLite has one writer at a time: the sealer runs after the build
    argv = [sys.executable, __file__, "--sealer", "--database", ARGS.database]
    argv += ["--database-url", ARGS.database_url, "--name", ARGS.name]
    return subprocess.Popen(argv)


def build(target: int, templates: dict[str, Template], *, seal: bool = True) -> None:
    """Grow the ledger to ``target`` copies (resumes: copy n is the (n+1)th written), with the
    sealer beside it unless ``seal`` is off."""
    have = loaded_count()
    if have >= target:
        print(f"  {have:,} attempts already built")
        return
    sealer = start_sealer() if seal else None
    if sealer is not None:
        print(f"  the sealer seals beside the build (process {sealer.pid})", flush=True)
    try:
        _grow(have, target, templates)
    finally:
        if sealer is not None:
            sealer.terminate()
            sealer.wait()


def _grow(have: int, target: int, templates: dict[str, Template]) -> None:
    anchor = timezone.now() - dt.timedelta(days=SPAN_DAYS)
    step = dt.timedelta(days=SPAN_DAYS) / target
    attempt_columns, event_columns = _columns(ATTEMPT_TABLE), _columns(EVENT_TABLE)
    rng = random.Random(have)
    began = time.perf_counter()
    n = have
    while n < target:
        attempt_pk, event_pk = _max_id(ATTEMPT_TABLE) + 1, _max_id(EVENT_TABLE) + 1
        attempt_rows, event_rows, key_rows, effect_rows = [], [], [], []
        end = min(n + BATCH, target)
        for i in range(n, end):
            created = anchor + step * i + dt.timedelta(microseconds=rng.randrange(1000))
            row, events = templates[shape_of(i)].copy(i, attempt_pk, event_pk, created)
            attempt_rows.append(row)
            event_rows.extend(events)
            # As the write path: the key's row in the permanent index, and the claimed effect's.
            key_rows.append({**row, "key_digest": key_digest(row["idempotency_key"])})
            if row["provider_request_id"]:
                effect_rows.append(row)
            attempt_pk, event_pk = attempt_pk + 1, event_pk + len(events)
        n = end
        with transaction.atomic():
            _write(ATTEMPT_TABLE, attempt_columns, attempt_rows)
            _write(EVENT_TABLE, event_columns, event_rows)
            _write(KEY_TABLE, KEY_COLUMNS, key_rows)
            _write(EFFECT_TABLE, EFFECT_COLUMNS, effect_rows)
            _bump_sequences()
        seconds = time.perf_counter() - began
        print(f"  built {n:,} of {target:,} ({(n - have) / seconds:,.0f} attempts/s)", flush=True)


def settle_build(*, seal: bool = True) -> None:
    """The sealer, statistics (and on PostgreSQL the vacuum autovacuum would run after the
    sealer's updates) and a full count pass, as after a restore (each resumes too). Without
    ``seal``, the attempts not sealed yet stay so."""
    began = time.perf_counter()
    if ARGS.database == "postgres":
        # The vacuum and a full count pass of 10M attempts take minutes: no statement timeout
        # for this connection (the measurements reconnect with the product's settings).
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
    if seal:
        while chain.seal() is not None:
            pass
        seconds = time.perf_counter() - began
        print(f"  sealed in {seconds:.1f} s (the log holds {log.log_size():,} heads)")
    else:
        unsealed = Attempt.objects.filter(sealed=False).count()
        print(f"  NOT SEALED (--skip seal): {unsealed:,} attempts are not sealed yet")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if ARGS.database == "postgres" else "ANALYZE")
    # Rows loaded with old times, behind the write path's back: count every day once.
    full = counts.refresh(full=True)
    print(f"  terminal counts: full pass over {full.days_counted} days in {full.seconds:.2f} s")


# ---------------------------------------------------------------------------------------------
# Measurements


def sizes() -> list[tuple[str, str, int]]:
    """(table, relation, bytes) for the ledger's two tables, their indexes and TOAST."""
    out = []
    with connection.cursor() as cursor:
        for table in (ATTEMPT_TABLE, EVENT_TABLE, LEAF_TABLE, KEY_TABLE, EFFECT_TABLE):
            if ARGS.database == "postgres":
                cursor.execute(
                    "SELECT pg_relation_size(%s::regclass), "
                    "pg_table_size(%s::regclass) - pg_relation_size(%s::regclass)",
                    [table, table, table],
                )
                heap, toast = cursor.fetchone()
                out += [(table, "(heap)", heap), (table, "(toast, fsm, vm)", toast)]
                cursor.execute(
                    "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) "
                    "FROM pg_index WHERE indrelid = %s::regclass ORDER BY 2 DESC",
                    [table],
                )
                out += [(table, name, size) for name, size in cursor.fetchall()]
            else:
                cursor.execute(
                    "SELECT s.name, SUM(s.pgsize) FROM dbstat s JOIN sqlite_master m "
                    "ON m.name = s.name WHERE m.tbl_name = %s GROUP BY s.name ORDER BY 2 DESC",
                    [table],
                )
                out += [
                    (table, "(table)" if name == table else name, size)
                    for name, size in cursor.fetchall()
                ]
    return out


def print_sizes(attempts: int, events: int) -> dict[str, float]:
    rows = sizes()
    leaves = CheckpointLeaf.objects.count()
    effects = ProviderEffect.objects.count()
    total = sum(size for _, _, size in rows)
    print(
        f"\n== bytes: {total / 1e6:,.1f} MB for {attempts:,} attempts, {events:,} events, "
        f"{leaves:,} checkpoint leaves, {effects:,} claimed effects (B/row: per row of that "
        "table)"
    )
    for table, name, size in rows:
        per = {ATTEMPT_TABLE: attempts, EVENT_TABLE: events, KEY_TABLE: attempts}.get(
            table, max(effects if table == EFFECT_TABLE else leaves, 1)
        )
        print(f"  {table:<22} {name:<40} {size / 1e6:10.1f} MB {size / per:8.1f} B/row")
    per_attempt = total / attempts
    print(
        f"  total bytes per attempt (with its events, leaves, key and effect index rows): "
        f"{per_attempt:,.0f} B"
    )
    return {"bytes_per_attempt": per_attempt}


def median_ms(func, repeat: int, *, clear: bool = False) -> float:
    for _ in range(2):
        func()
    samples = []
    for _ in range(repeat):
        if clear:
            cache.clear()
        began = time.perf_counter()
        func()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def deep_cursor(state: str | None) -> str:
    """A cursor 80% of the way into a queue (one state, or every state), oldest first."""
    from attempts.views.queues import encode_cursor

    queryset = Attempt.objects.all() if state is None else Attempt.objects.filter(state=state)
    queryset = queryset.order_by("created_at", "id")
    total = queryset.count()
    row = queryset.values("created_at", "id")[int(total * 0.8)]
    return encode_cursor(row["created_at"], row["id"])


def page_urls() -> dict[str, str]:
    pages = {}
    for slug, state in (
        ("unknown", "UNKNOWN"),
        ("review", "MANUAL_REVIEW"),
        ("inflight", ""),
        ("stale", ""),
        ("all", None),
    ):
        pages[f"queue {slug} first"] = f"/queues/{slug}/"
        if state != "":  # in-flight work is the write path's few calls: no deep page
            pages[f"queue {slug} deep"] = f"/queues/{slug}/?after={deep_cursor(state)}"
    pages["queue all newest"] = "/queues/all/?sort=newest"
    pages["prefix key narrow"] = "/queues/all/?q=north:open_ticket:12"
    pages["prefix key broad"] = "/queues/all/?q=north:send"
    pages["prefix request narrow"] = "/queues/all/?q=req_0000001"
    pages["prefix task narrow"] = "/queues/all/?q=task-123"
    pages["prefix broad in unknown"] = "/queues/unknown/?q=south:"
    # No south attempt is in review: the whole range matches nothing in this queue.
    pages["prefix broad, none in review"] = "/queues/review/?q=south:"
    pages["approvals inbox (mine)"] = "/approvals/"
    pages["approvals inbox (all)"] = "/approvals/?tab=all"
    pages["overview warm"] = "/"
    pages["overview cold (cache cleared)"] = "/"
    return pages


def _timings(user: User, pages: dict[str, str]) -> dict[str, float]:
    from attempts.views import overview

    client = Client()
    client.force_login(user)

    def get(url: str):
        def run():
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        return run

    results = {
        name: median_ms(get(url), ARGS.repeat, clear=name.startswith("overview cold"))
        for name, url in pages.items()
    }
    results["terminal counts per request (before)"] = median_ms(
        lambda: overview._terminal_counts(TENANTS, timezone.now()), ARGS.repeat, clear=True
    )
    results["terminal counts kept (summary read)"] = median_ms(
        lambda: counts.terminal_counts(TENANTS), ARGS.repeat
    )
    passes = [counts.refresh() for _ in range(3)]
    results["count pass, incremental (worker)"] = statistics.median(
        p.seconds * 1000 for p in passes
    )
    results["approvals awaiting count"] = median_ms(
        lambda: Attempt.objects.awaiting_approval_of(user).count(), ARGS.repeat
    )
    return results


def measure_pages() -> dict[str, float]:
    """Each page on the big ledger and on the empty one, alternating twice (the machine's
    load falls on both alike); the ratio shows what the ledger's size costs."""
    pages = page_urls()
    got: dict[str, dict[str, list[float]]] = {"full": {}, "empty": {}}
    for _ in range(2):
        for which in ("full", "empty"):
            use_database(ARGS.name + ("_empty" if which == "empty" else ""))
            user = User.objects.get(username="bench")
            for name, ms in _timings(user, pages).items():
                got[which].setdefault(name, []).append(ms)
    use_database(ARGS.name)
    full = {name: min(values) for name, values in got["full"].items()}
    empty = {name: min(values) for name, values in got["empty"].items()}
    print(
        f"\n== pages: median of {ARGS.repeat} requests, the better of 2 rounds; at N, on an "
        f"empty ledger in the same run, and the ratio (target < {TARGET_MS:.0f} ms where marked)"
    )
    for name, ms in full.items():
        timed_only = name.startswith(("approvals awaiting", "terminal", "count pass"))
        target = "" if timed_only else "MET" if ms < TARGET_MS else "NOT MET"
        ratio = ms / empty[name] if empty[name] else float("nan")
        print(f"  {name:<38} {ms:8.1f} ms  empty {empty[name]:7.1f} ms  x{ratio:5.2f}  {target}")
    return full


def measure_export(events: int) -> float:
    from attempts import audit_export

    plan = audit_export.plan_export(user=None, filters=audit_export.ExportFilters())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    began = time.perf_counter()
    size = 0
    for chunk in audit_export.stream_jsonl(plan):
        size += len(chunk)
    seconds = time.perf_counter() - began
    rate = plan.upto and events / seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\n== export (JSON Lines, whole ledger): {rate:,.0f} events/s ({size / 1e6:,.0f} MB, "
        f"{seconds:.0f} s); this process's peak RSS {before:,.0f} MB before, {peak:,.0f} MB after"
    )
    return rate


def measure_verify(events: int) -> float:
    from attempts.audit_verify import verify_django_database

    began = time.perf_counter()
    report = verify_django_database()
    seconds = time.perf_counter() - began
    ok = "ok" if report.ok else f"PROBLEMS: {report.problems[:3]}"
    print(f"\n== verify_audit: {events / seconds:,.0f} events/s ({seconds:.1f} s) {ok}")
    return events / seconds


def one_call(i: int, tag: str) -> None:
    key = f"{KEY_PREFIX}-write:{tag}:{i}"
    attempt, _ = ledger.record_intent(
        tenant=TENANTS[i % len(TENANTS)],
        task_id=f"write-{tag}",
        tool_name="update_crm",
        idempotency_key=key,
        args={"to": f"w{i}@example.test", "amount": i},
        actor=AGENT,
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=AGENT)
    attempt = ledger.attach_provider_request(attempt, f"req_w_{tag}_{i}", actor=AGENT)
    ledger.confirm(attempt, result_ref=f"rcpt_w_{i}", actor=AGENT)


def measure_write_path() -> float:
    """Median ms per call at N and empty, in this process, alternating the two databases."""
    per_db: dict[str, list[float]] = {"empty": [], "full": []}
    run = f"{int(time.time())}"
    for round_no in range(ARGS.rounds):
        for which in ("empty", "full"):
            use_database(ARGS.name + ("_empty" if which == "empty" else ""))
            one_call(-1, f"{run}-{round_no}-{which}-warm")
            samples = []
            for i in range(ARGS.calls):
                began = time.perf_counter()
                one_call(i, f"{run}-{round_no}-{which}")
                samples.append((time.perf_counter() - began) * 1000)
            per_db[which].append(statistics.median(samples))
    use_database(ARGS.name)
    empty, full = statistics.median(per_db["empty"]), statistics.median(per_db["full"])
    ratio = full / empty
    verdict = "MET" if ratio <= TARGET_WRITE_RATIO else "NOT MET"
    print(
        f"\n== write path (record, claim, attach, confirm; median ms per call over "
        f"{ARGS.rounds} rounds of {ARGS.calls}): empty {empty:.2f} ms, at N {full:.2f} ms; "
        f"ratio {ratio:.2f}x (target <= {TARGET_WRITE_RATIO}x: {verdict})"
    )
    return ratio


def main() -> None:
    skip = set(filter(None, ARGS.skip.split(",")))
    vendor = connection.vendor
    print(f"database: {vendor} {connection.settings_dict['NAME']}; target {ARGS.attempts:,}")
    use_database(ARGS.name + "_empty")
    setup_world()
    use_database(ARGS.name)
    setup_world()
    templates = {shape: Template(pk) for shape, pk in write_templates().items()}
    build(ARGS.attempts, templates, seal="seal" not in skip)
    if "seal" in skip:
        skip.add("verify")  # verify_audit would report every unsealed attempt
    settle_build(seal="seal" not in skip)
    attempts = Attempt.objects.count()
    events = AttemptEvent.objects.count()
    plain_static = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    with override_settings(
        ALLOWED_HOSTS=["testserver"],
        STORAGES={**django.conf.settings.STORAGES, "staticfiles": plain_static},
        DEBUG=False,
    ):
        print_sizes(attempts, events)
        if "pages" not in skip:
            measure_pages()
        if "export" not in skip:
            measure_export(events)
        if "verify" not in skip:
            measure_verify(events)
        if "write" not in skip:
            measure_write_path()
    load = os.getloadavg()
    print(f"\nmachine load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    if ARGS.sealer:
        run_sealer()
    else:
        main()
