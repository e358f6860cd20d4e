"""How a ledger write transaction is opened, and what a person sees when a lock is not had.

SQLite has one writer at a time by nature: a write transaction is ``BEGIN IMMEDIATE`` (the
``transaction_mode`` setting), so it takes the database's write lock at its start and a
read-then-write can never fail half-way; a writer that cannot get it within the busy timeout
gets ``LedgerBusy``. The ledger's own one-write transactions (``sqlite_transaction``, every
intent and every move made alone) wait for that lock in short pauses rather than SQLite's long
ones. PostgreSQL takes no lock for the whole ledger: a move locks its own attempt
row (the compare-and-set ``UPDATE``) and nothing else, and every lock wait is bounded by the
connection's ``lock_timeout`` (settings). The only named locks are for the few writers that keep
one sequence for everyone (the sealer's checkpoints, the config chain), and they are taken by
those writers alone.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper

from attempts import dbadapter


class LedgerBusy(Exception):
    """A lock was not had in time. Nothing was written; the caller may try again."""

    code = "ledger_busy"


class StatementTimeout(LedgerBusy):
    """PostgreSQL cancelled a statement that ran longer than ``statement_timeout``. Its
    transaction was rolled back; the caller may try again."""

    code = "statement_timeout"


def is_statement_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL cancelling a statement for ``statement_timeout``."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) == "57014" and "statement timeout" in str(exc)


def statement_timeout_message() -> str:
    """What a person is told when a statement ran out of time."""
    from ledgerweb.settings_reference import read

    limit_ms = read("LEDGERWEB_PG_STATEMENT_TIMEOUT_MS")
    return (
        f"the database cancelled a statement that ran longer than {limit_ms} ms "
        "(LEDGERWEB_PG_STATEMENT_TIMEOUT_MS); "
        "what it was part of was not written: try again, and if it keeps happening, the query "
        "or the database's load needs a look"
    )


# SQLSTATE read_only_sql_transaction: the server a kept connection reaches no longer takes
# writes (a primary demoted after a failover, or one a tool set read-only).
_READ_ONLY = "25006"


def is_database_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the ledger's database cannot take its writes now, rather than that
    one call was bad: the connection was lost or refused, or the server it reaches is read-only
    (after a failover the primary is elsewhere). The caller answers 503 or waits and tries again,
    after ``forget_connections()``."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    cause = exc.__cause__ or exc
    return isinstance(exc, DatabaseError) and getattr(cause, "sqlstate", None) == _READ_ONLY


def forget_connections() -> None:
    """Close this thread's database connections that are broken or reach a read-only server,
    so the next use connects again (to whichever host of ``DATABASE_URL`` takes writes now).
    A connection inside a transaction is left to its caller."""
    for conn in connections.all(initialized_only=True):
        if not dbadapter.is_connected(conn) or dbadapter.in_atomic_block(conn):
            continue
        try:
            usable = conn.is_usable() and not _read_only(conn)
        except Exception:  # the driver's own error: this connection is no use either way
            usable = False
        if not usable:
            conn.close()


def _read_only(conn: BaseDatabaseWrapper) -> bool:
    if conn.vendor != "postgresql":
        return False
    with dbadapter.driver_connection(
        conn
    ).cursor() as cursor:  # the driver's cursor: no Django bookkeeping
        cursor.execute(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool"
        )
        return bool(cursor.fetchone()[0])


def _is_lock_timeout(exc: BaseException) -> bool:
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate in ("55P03", "40P01"):  # lock_not_available, deadlock_detected
        return True
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


@contextlib.contextmanager
def lock_errors() -> Iterator[None]:
    """Turn a lock wait that ran out into ``LedgerBusy``, with a message a person can act on."""
    try:
        yield
    except OperationalError as exc:
        if is_statement_timeout(exc):
            raise StatementTimeout(statement_timeout_message()) from exc
        if not _is_lock_timeout(exc):
            raise
        raise LedgerBusy(
            f"the ledger database is busy: a lock was not granted in time ({exc}); nothing was "
            "written, try again (a writer holding a transaction open too long is the usual cause)"
        ) from exc


@contextlib.contextmanager
def write_transaction() -> Iterator[None]:
    """A transaction for ledger writes that must commit together (nested ones become
    savepoints). A lock wait that runs out raises ``LedgerBusy`` after the transaction rolled
    back. A single ``states.create`` or ``states.move`` needs none: each is atomic on its own."""
    with lock_errors(), transaction.atomic():
        yield


# The ledger's own SQLite write transactions of this process, one at a time per database: the
# other threads of a worker wait here, asleep, instead of each polling SQLite's write lock.
_OWN_WRITERS: dict[str, threading.RLock] = {}


@contextlib.contextmanager
def sqlite_transaction(db: BaseDatabaseWrapper) -> Iterator[None]:
    """One ledger write's own transaction on SQLite, outside any other: ``BEGIN IMMEDIATE`` and
    ``COMMIT`` on the ``sqlite3`` connection, as ``write_transaction()`` would send them, without
    Django's bookkeeping for nested blocks (docs/scaling.md says what that saves).
    Whatever fails, the transaction is rolled back before the error goes on.

    SQLite has one writer at a time, so the process's own ledger writers first take turns on a
    lock of their own (``_OWN_WRITERS``): a thread waiting for another thread of its process
    costs no CPU, and only one thread per process polls SQLite's lock (``_begin_immediate``).
    Both waits together last at most the configured busy timeout."""
    timeout = db.settings_dict["OPTIONS"].get("timeout", 5.0)
    deadline = time.monotonic() + timeout
    writers = _OWN_WRITERS.get(db.alias) or _OWN_WRITERS.setdefault(db.alias, threading.RLock())
    if not writers.acquire(timeout=timeout):
        raise LedgerBusy(
            f"the ledger database is busy: this process's other writers held it for {timeout} s; "
            "nothing was written, try again (a writer holding a transaction open too long is "
            "the usual cause)"
        )
    try:
        begin = functools.partial(_begin_immediate, deadline=deadline)
        with dbadapter.sqlite_own_transaction(db, begin, lock_errors):
            yield
    finally:
        writers.release()


# How long a ledger writer pauses between tries for SQLite's write lock: from the first pause,
# doubling, to the longest.
FIRST_PAUSE, LONGEST_PAUSE = 0.0001, 0.002


def _begin_immediate(raw: sqlite3.Connection, deadline: float = float("inf")) -> None:
    """``BEGIN IMMEDIATE``, waiting for the write lock as long as the connection's busy timeout
    (and never past ``deadline``, on ``time.monotonic()``'s clock).

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20 ms... between tries, while a ledger
    write holds the lock for well under a millisecond: under load writers slept far longer than
    the lock was held, and the CPU stood idle (docs/scaling.md). The ledger's own writes try again
    after FIRST_PAUSE instead, doubling to LONGEST_PAUSE; every other transaction keeps SQLite's
    handler. Raises "database is locked" once the busy timeout has passed."""
    (timeout_ms,) = raw.execute("PRAGMA busy_timeout").fetchone()
    deadline = min(deadline, time.monotonic() + timeout_ms / 1000)
    pause = FIRST_PAUSE
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_lock_timeout(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")


def named_lock(name: str) -> None:
    """Serialize the writers of one shared sequence (``name``) until the transaction ends.

    PostgreSQL: a transaction-scoped advisory lock on the name's CRC-32, bounded by
    ``lock_timeout``. SQLite: nothing to do, the write transaction already holds the database."""
    if not dbadapter.in_atomic_block(connection):
        raise RuntimeError("named_lock() must be taken inside write_transaction()")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])
