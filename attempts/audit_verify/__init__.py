"""Verify the tamper-evident history of a whole ledger database: every attempt's chain, every
checkpoint, the config chain, and each attempt row against its history.

Works on any DB-API connection that holds ledgerweb's tables (the live Django connection, or a
plain ``sqlite3`` connection to a backup copy), streaming rows so memory stays flat (one attempt's
events at a time). The hash formats are ``attempts.verify_export``'s, the code an auditor runs on
an export. Checks, each naming the first event, attempt or checkpoint where it fails:

1. ``[content]`` every event's stored hash equals the hash recomputed from its row;
2. ``[link]`` every event's ``prev_hash`` is its attempt's previous event's hash (GENESIS first);
   events written before per-attempt chains (format 1) link through the whole ledger in id
   order, as they always did;
3. ``[orphan]`` every event belongs to an existing attempt;
4. ``[attempt]`` every attempt row agrees with its history: creation event, key fields, args
   hash, state, provider request id, result reference, chain head and length;
5. ``[seal]`` each attempt's newest sealed head (its latest checkpoint leaf) is the hash at that
   place of its chain, and no sealed attempt is missing (``[missing]``);
6. ``[checkpoint]`` checkpoints run 1, 2, 3, ... each hashing the one before, each root is the
   Merkle root of its leaves; ``[config]`` the config chain links and matches every checkpoint;
7. ``[anchor]`` checkpoint hashes (or, for old ledgers, head hashes) kept elsewhere are still
   there; ``[window]`` optionally, nothing has stayed unsealed longer than allowed;
8. ``[approvals]`` every move out of AWAITING_APPROVAL (and each held claim, and each
   reviewer's approval out of MANUAL_REVIEW) had the approvals its policy version required in
   the attempt's own chain (``verify_export.approval_problems``), and every approvals-table row
   is one of those events.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attempts.audit_verify import chains
from attempts.audit_verify.archives import archive_checks
from attempts.audit_verify.chains import Cursors, Verifier
from attempts.audit_verify.checkpoints import (
    Trust,
    checkpoint_trust,
    checkpoints,
    configured_trust,
    log_checks,
)
from attempts.audit_verify.digests import load_json
from attempts.audit_verify.parallel import parallel
from attempts.verify_export import Problem, Report, authority_digest_of

__all__ = [
    "Cursors",
    "Trust",
    "check_config_drift",
    "configured_trust",
    "load_json",
    "verify_database",
    "verify_django_database",
    "verify_sqlite_file",
]


def verify_database(
    cursor_factory: Callable[[], Any] | Cursors,
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    now: dt.datetime | None = None,
    what: str = "database",
    jobs: int = 1,
    connect: Callable[[], Callable[[], Any] | Cursors] | None = None,
    before_fork: Callable[[], None] | None = None,
    since: tuple[int, str] | None = None,
    log_keys: Iterable[Any] = (),
    witness_keys: Iterable[Any] = (),
    vendor: str = "sqlite",
    archive_dir: Path | None = None,
    trust: Trust | None = None,
) -> Report:
    """Verify the history and every attempt row. ``cursor_factory`` returns a fresh DB-API
    cursor (``dbadapter.streaming_cursor`` streams on PostgreSQL), or is a
    ``Cursors`` pair that also says how to read one bounded batch.
    ``before_fork`` closes this process's connection before workers start: a connection must
    never be shared with a forked process. ``vendor`` ("sqlite", "postgresql") picks the form
    of the queries that reads best there (any form works on both).

    With ``jobs`` > 1 and ``connect`` (called in each worker process, returns that process's
    cursor factory), the attempts' chains, which are independent, are verified by that many
    processes, each over ranges of attempt ids; problems are reported in the same order as by
    one process. ``since`` (seq, hash) of a checkpoint an earlier run verified: only attempts
    that changed after it, and the checkpoints after it, are checked (the config chain and the
    orphan checks always run whole). ``trust``: what configuration says the newest checkpoint
    must carry (``checkpoint_trust``); None checks only the signatures stored."""
    verifier = Verifier(
        cursor_factory,
        anchors=anchors,
        max_problems=max_problems,
        max_unsealed_seconds=max_unsealed_seconds,
        now=now,
        since=since,
        vendor=vendor,
    )
    report = Report(what=what, problems=verifier.checker.problems)
    lo, hi = verifier.id_range()

    def rest() -> None:  # everything but the attempts' chains, in the order it is reported
        verifier.orphans_and_missing(lo, hi)
        verifier.approval_rows()
        checkpoints(verifier)
        log_checks(verifier, log_keys=log_keys, witness_keys=witness_keys)
        if trust is not None:
            checkpoint_trust(verifier, report, trust)

    if jobs > 1 and connect is not None and hi - lo > chains.BATCH:
        if before_fork is not None:
            before_fork()
        parallel(verifier, lo, hi, jobs=jobs, connect=connect, rest=rest)
    else:
        verifier.legacy()
        verifier.attempts_and_events(lo, hi)
        rest()
    if verifier.has_archives():
        archive_checks(verifier, report, archive_dir=archive_dir, log_keys=log_keys)
    verifier.finish(report)
    if since:
        report.notes.append(f"incremental: attempts changed after checkpoint {since[0]} only")
    if verifier.checkpoint:
        seq, digest = verifier.checkpoint
        report.notes.append(f"to resume from here: --since {seq}:{digest}")
    return report


def verify_django_database(
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    using: str = "default",
    jobs: int = 1,
    since: tuple[int, str] | None = None,
    log_keys: Iterable[Any] = (),
    witness_keys: Iterable[Any] = (),
    archive_dir: Path | None = None,
    trust: Trust | None = None,
) -> Report:
    """Verify the database Django is configured with (in ``jobs`` processes: see
    ``verify_database``; ``log_keys``/``witness_keys``: verifier keys the stored signatures and
    cosignatures are checked with; ``trust``: what the newest checkpoint must carry, from
    configuration, ``configured_trust()``)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    from attempts import dbadapter

    connection = connections[using]
    name = connection.settings_dict.get("NAME")
    notes = []
    in_memory = connection.vendor == "sqlite" and connection.is_in_memory_db()
    if jobs > 1 and (dbadapter.in_atomic_block(connection) or in_memory):
        # Other processes could not see this transaction's rows, or this in-memory database.
        notes.append(f"verified in one process, not {jobs}: the database is not shareable here")
        jobs = 1

    def cursors() -> Cursors:
        # Whole tables stream through a server-side cursor; a batch is read in one go.
        db = connections[using]
        return Cursors(functools.partial(dbadapter.streaming_cursor, db), db.cursor)

    serial = connection.vendor == "postgresql" and not dbadapter.in_atomic_block(connection)
    if serial:
        # One plan per batch: the verifier already runs a process per core (--jobs), and a
        # parallel plan for a keyset batch of a few thousand rows costs more (starting its
        # workers, gathering, sorting again) than it saves; and every server-side cursor is
        # read to its end (``_verifier_plans``). For this process's connection and those its
        # workers open.
        connection_created.connect(_verifier_plans)
        if dbadapter.is_connected(connection):
            _verifier_plans(connection=connection)
    try:
        report = verify_database(
            cursors(),
            anchors=anchors,
            max_problems=max_problems,
            max_unsealed_seconds=max_unsealed_seconds,
            what=f"{connection.vendor} database {name}",
            log_keys=log_keys,
            witness_keys=witness_keys,
            jobs=jobs,
            connect=cursors,
            # Each worker opens its own connection; one open here would be shared after the fork.
            before_fork=connection.close,
            since=since,
            vendor=connection.vendor,
            archive_dir=archive_dir,
            trust=trust,
        )
    finally:
        if serial:
            connection_created.disconnect(_verifier_plans)
            if dbadapter.is_connected(connection):
                with connection.cursor() as cursor:
                    cursor.execute("RESET max_parallel_workers_per_gather")
                    cursor.execute("RESET cursor_tuple_fraction")
                    cursor.execute("RESET work_mem")
    report.notes.extend(notes)
    check_config_drift(report, max_problems=max_problems)
    return report


def _verifier_plans(connection: Any, **_: Any) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET max_parallel_workers_per_gather = 0")
            # The verifier reads every row of each server-side cursor it opens: planned for
            # the first tenth of them (the default), the log's entries were joined leaf by
            # leaf through three indexes rather than by one hash join.
            cursor.execute("SET cursor_tuple_fraction = 1")
            # The log's entries are read in order at once, sorted by the server: with the
            # default work_mem (4MB) that sort went to disk. Raised, never lowered.
            cursor.execute(
                "SELECT set_config('work_mem', GREATEST(pg_size_bytes("
                "current_setting('work_mem')), 64 * 1024 * 1024) / 1024 || 'kB', false)"
            )


def check_config_drift(report: Report, *, max_problems: int = 50) -> None:
    """``[config-drift]``: the live authority rows (tenants, people, roles, tokens, tools,
    grants, ...) are what the configuration history says they are. A row changed by SQL, or by
    a code path that bypassed the model's signals, shows here. Records a baseline first on a
    ledger from before its models were declared (``config_history.ensure_baseline``)."""
    from attempts import config_history

    baselined = config_history.ensure_baseline(force=True)
    if baselined:
        report.notes.append(
            "recorded a baseline of the authority rows the history did not hold yet: "
            + ", ".join(baselined)
        )
    live = config_history.live_authority()
    lines = config_history.drift(live, config_history.history_authority())
    for line in lines[:max_problems]:
        report.problems.append(
            Problem("config-drift", f"{line}: changed outside the recorded history")
        )
    if len(lines) > max_problems:
        report.truncated = True
    report.notes.append(
        f"authority rows match their history ({len(live)} rows, digest "
        f"{authority_digest_of(live)[:16]}…)"
        if not lines
        else f"{len(lines)} authority rows differ from their history"
    )


def verify_sqlite_file(
    path: str,
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    jobs: int = 1,
    since: tuple[int, str] | None = None,
    archive_dir: Path | None = None,
) -> Report:
    """Verify a SQLite ledger file (a backup or a restored copy), opened read-only."""
    import sqlite3
    from pathlib import Path

    uri = Path(path).resolve().as_uri() + "?mode=ro"

    def connect() -> Callable[[], Any]:
        return sqlite3.connect(uri, uri=True).cursor

    conn = sqlite3.connect(uri, uri=True)
    try:
        return verify_database(
            conn.cursor,
            anchors=anchors,
            max_problems=max_problems,
            max_unsealed_seconds=max_unsealed_seconds,
            what=f"SQLite file {path}",
            jobs=jobs,
            connect=connect,
            since=since,
            archive_dir=archive_dir,
        )
    finally:
        conn.close()
