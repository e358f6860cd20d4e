#!/usr/bin/env python
"""Benchmark: one full tool call through the write-ahead API against raw sqlite3 writes.

A tool call is four durable commits: record the intent, claim the dispatch, attach the provider
request id, confirm. The API runs them through attempts.ledger on SQLite (WAL, synchronous=FULL);
the baseline writes the same rows (attempt + chained events, same hashes, same fields and event
details, recovery's next check kept as the ledger keeps it) into the same schema with the
standard library's sqlite3 module, one transaction per step, in the same run. After the run the
bench checks that both wrote the same rows and stops if they did not.

    .venv/bin/python bench/write_path.py [--calls 2000] [--rounds 3]

Target (issues 2 and 12): the API costs at most 2x the raw writes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def setup_django(db_path: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
    os.environ["LEDGERWEB_SQLITE_PATH"] = str(db_path)
    os.environ["LEDGERWEB_DATA_DIR"] = str(db_path.parent)
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from attempts.models import EffectClass, Grant, Tenant, Tool

    tenant = Tenant.objects.create(slug="acme", name="Acme")
    tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
    Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=["crm"])


def api_calls(n: int, prefix: str) -> float:
    from attempts import ledger
    from attempts.states import Actor

    actor = Actor.agent("bench")
    start = time.perf_counter()
    for i in range(n):
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id=f"task-{i}",
            tool_name="update_crm",
            idempotency_key=f"{prefix}-{i}",
            args={"contact": i, "stage": "won", "note": "closed by agent"},
            actor=actor,
        )
        attempt, claimed = ledger.claim_dispatch(attempt, actor=actor)
        assert claimed
        ledger.attach_provider_request(attempt, f"req-{prefix}-{i}", actor=actor)
        ledger.confirm(attempt, result_ref=f"rcpt-{i}", actor=actor)
    return time.perf_counter() - start


def raw_calls(db_path: Path, n: int, prefix: str) -> float:
    """The same rows with sqlite3: what the write path costs at the least (the attempt, its
    chained events with the same hashes, its chain head; each move reads the row's id and
    version first, as this baseline always has)."""
    import datetime as dt

    from django.conf import settings

    from attempts import jcs
    from attempts.models import new_attempt_id
    from attempts.verify_export import GENESIS, SALTED_FORMAT, args_commitment, chain_time
    from bench.raw_rows import format3_event

    stale_after = dt.timedelta(seconds=settings.LEDGER["STALE_AFTER"])

    def due(moment: dt.datetime) -> str:
        return (moment + stale_after).replace(tzinfo=None).isoformat(" ")

    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    heads: dict[str, str] = {}
    salts: dict[str, str] = {}

    def link(attempt_id, action, frm, to, details, now) -> tuple[str, str, str]:
        prev = heads.get(attempt_id, GENESIS)
        salt = salts[attempt_id]
        row, digest = format3_event(
            attempt_id, action, frm, to, details, now, prev, salt, dumps=jcs.dumps
        )
        return prev, row["text_digest"], digest

    def event(pk, attempt_id, action, frm, to, details, now, linked=None) -> str:
        prev, text, digest = linked or link(attempt_id, action, frm, to, details, now)
        conn.execute(
            "INSERT INTO attempts_attemptevent (attempt_id, action, actor_kind, actor, from_state,"
            " to_state, reason, details, created_at, prev_hash, hash, chain_format, text_digest)"
            " VALUES (?, ?, 'agent', 'bench', ?, ?, '', ?, ?, ?, ?, ?, ?)",
            (pk, action, frm, to, json.dumps(details), now, prev, digest, SALTED_FORMAT, text),
        )
        heads[attempt_id] = digest
        return digest

    def move(attempt_id, action, frm, to, sets, details):
        now = chain_time(dt.datetime.now(dt.UTC))
        conn.execute("BEGIN IMMEDIATE")
        pk, version = conn.execute(
            "SELECT id, version FROM attempts_attempt WHERE attempt_id = ?", (attempt_id,)
        ).fetchone()
        digest = event(pk, attempt_id, action, frm, to, details, now)
        assignments = ", ".join(f"{k} = ?" for k in sets)
        cur = conn.execute(
            f"UPDATE attempts_attempt SET state = ?, version = version + 1, updated_at = ?, "  # noqa: S608
            "chain_head = ?, chain_length = chain_length + 1, sealed = 0"
            f"{', ' + assignments if assignments else ''} WHERE id = ? AND version = ?",
            (to, now, digest, *sets.values(), pk, version),
        )
        assert cur.rowcount == 1
        conn.execute("COMMIT")

    start = time.perf_counter()
    for i in range(n):
        args = {"contact": i, "stage": "won", "note": "closed by agent"}
        canonical = jcs.dumps(args)  # the ledger's own canonical encoder
        args_hash = hashlib.sha256(canonical).hexdigest()
        attempt_id = new_attempt_id()
        salts[attempt_id] = salt = secrets.token_hex(32)
        created = dt.datetime.now(dt.UTC)
        now = chain_time(created)
        # What the ledger records with an intent, due for recovery after the stale interval.
        details = {
            "tenant": "acme",
            "task_id": f"task-{i}",
            "tool_name": "update_crm",
            "idempotency_key": f"{prefix}-{i}",
            "args_hash": args_hash,
            "policy_version": "v1",
            "credential_scope": ["crm"],
            "parent_attempt_id": None,
            "args_digest": args_commitment(salt, args, dumps=jcs.dumps),
        }
        first = ("attempt.created", "", "INTENT_RECORDED", details, now)
        linked = link(attempt_id, *first)
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "INSERT INTO attempts_attempt (attempt_id, tenant_id, task_id, tool_name, args,"
            " args_hash, args_salt, idempotency_key, state, version, provider_request_id, result_ref,"
            " policy_version, credential_scope, review_reason, awaiting_approval, send_count,"
            " lookup_count, next_check_at, lease_owner, chain_head, chain_length, sealed,"
            " created_at, updated_at)"
            " VALUES (?, 'acme', ?, 'update_crm', ?, ?, ?, ?, 'INTENT_RECORDED', 1, '', '', 'v1',"
            " '[\"crm\"]', '', 0, 0, 0, ?, '', ?, 1, 0, ?, ?)",
            (
                attempt_id,
                f"task-{i}",
                canonical.decode(),
                args_hash,
                salt,
                f"{prefix}-{i}",
                due(created),
                linked[2],
                now,
                now,
            ),
        )
        event(cur.lastrowid, attempt_id, *first, linked=linked)
        conn.execute("COMMIT")
        # The same moves, fields and event details as the ledger's claim, attach and confirm.
        move(
            attempt_id,
            "attempt.dispatched",
            "INTENT_RECORDED",
            "DISPATCHED",
            {"send_count": 1, "next_check_at": due(dt.datetime.now(dt.UTC))},
            {},
        )
        request = f"req-{prefix}-{i}"
        move(
            attempt_id,
            "attempt.provider_request_attached",
            "DISPATCHED",
            "DISPATCHED",
            {"provider_request_id": request},
            {"provider_request_id": request},
        )
        move(
            attempt_id,
            "attempt.outcome_confirmed",
            "DISPATCHED",
            "OUTCOME_CONFIRMED",
            {"result_ref": f"rcpt-{i}", "review_reason": "", "next_check_at": None},
            {"result_ref": f"rcpt-{i}", "review_reason": ""},
        )
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def row_shape(db_path: Path, key: str) -> tuple:
    """What must match between the ledger's rows and the baseline's for one tool call: the
    attempt's state and counters, which fields are set, and each event's move and detail keys."""
    conn = sqlite3.connect(db_path)
    try:
        pk, *attempt = conn.execute(
            "SELECT id, state, version, chain_length, send_count, lookup_count, review_reason,"
            " policy_version, credential_scope, sealed, next_check_at IS NULL,"
            " provider_request_id != '', result_ref != '' FROM attempts_attempt"
            " WHERE idempotency_key = ?",
            (key,),
        ).fetchone()
        events = [
            (action, kind, frm, to, sorted(json.loads(details)))
            for action, kind, frm, to, details in conn.execute(
                "SELECT action, actor_kind, from_state, to_state, details"
                " FROM attempts_attemptevent WHERE attempt_id = ? ORDER BY id",
                (pk,),
            )
        ]
        return tuple(attempt), events
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="tool calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each")
    args = parser.parse_args()
    workdir = Path(
        tempfile.mkdtemp(prefix="lw-bench-", dir=REPO / "var" if (REPO / "var").exists() else None)
    )
    try:
        db_path = workdir / "bench.sqlite3"
        setup_django(db_path)
        api_times, raw_times = [], []
        api_calls(50, "warm-api")
        raw_calls(db_path, 50, "warm-raw")
        for r in range(args.rounds):
            raw_times.append(raw_calls(db_path, args.calls, f"raw{r}"))
            api_times.append(api_calls(args.calls, f"api{r}"))
        ledger_rows, raw_rows = row_shape(db_path, "api0-0"), row_shape(db_path, "raw0-0")
        if ledger_rows != raw_rows:
            raise SystemExit(
                f"the baseline does not write the ledger's rows:\n  ledger {ledger_rows}\n"
                f"  raw    {raw_rows}"
            )
        api, raw = statistics.median(api_times), statistics.median(raw_times)
        print(f"write path: {args.calls} tool calls x {args.rounds} rounds, 4 durable commits each")
        print(
            f"  raw sqlite3 : {raw:7.3f} s  {args.calls / raw:8.1f} calls/s  "
            f"{raw / args.calls * 1e3:6.2f} ms/call"
        )
        print(
            f"  ledger API  : {api:7.3f} s  {args.calls / api:8.1f} calls/s  "
            f"{api / args.calls * 1e3:6.2f} ms/call"
        )
        print(f"  ratio API/raw: {api / raw:.2f}x (target <= 2.0x)")
        print("  (both wrote the same rows: attempt fields, events and their details)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
