"""How a ledger write transaction is opened, and what a person sees when a lock is not had.

SQLite has one writer at a time by nature: a write transaction is ``BEGIN IMMEDIATE`` (the
``transaction_mode`` setting), so it takes the database's write lock at its start and a
read-then-write can never fail half-way; a writer that cannot get it within the busy timeout
gets ``LedgerBusy``. PostgreSQL takes no lock for the whole ledger: a move locks its own attempt
row (the compare-and-set ``UPDATE``) and nothing else, and every lock wait is bounded by the
connection's ``lock_timeout`` (settings). The only named locks are for the few writers that keep
one sequence for everyone (the sealer's checkpoints, the config chain), and they are taken by
those writers alone.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator

from django.db import OperationalError, connection, transaction


class LedgerBusy(Exception):
    """A lock was not had in time. Nothing was written; the caller may try again."""

    code = "ledger_busy"


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


def named_lock(name: str) -> None:
    """Serialize the writers of one shared sequence (``name``) until the transaction ends.

    PostgreSQL: a transaction-scoped advisory lock on the name's CRC-32, bounded by
    ``lock_timeout``. SQLite: nothing to do, the write transaction already holds the database."""
    if not connection.in_atomic_block:
        raise RuntimeError("named_lock() must be taken inside write_transaction()")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])
