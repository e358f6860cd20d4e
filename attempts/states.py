"""The state machine: the table of legal moves, and the only code that writes ``Attempt.state``.

Every move is a compare-and-set on (attempt, expected state, version) and appends one chained
history event in the same transaction. Callers wrap their work in ``write_transaction()``, which
takes the ledger's write lock first (``BEGIN IMMEDIATE`` on SQLite, an advisory transaction lock
on PostgreSQL) so the history chain has a single head and row locks are always taken after it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models, transaction
from django.db.models import F
from django.db.models.expressions import CombinedExpression
from django.utils import timezone

from attempts import audit, jcs
from attempts.canonical import InvalidArguments, canonical_bytes
from attempts.models import ATTENTION_STATES, ActorKind, Attempt, AttemptEvent, State

log = logging.getLogger("ledgerweb.ledger")

S = State
LEGAL_MOVES: dict[str, frozenset[str]] = {
    S.INTENT_RECORDED: frozenset({S.DISPATCHED, S.FAILED, S.RECONCILED, S.MANUAL_REVIEW}),
    S.DISPATCHED: frozenset(
        {S.OUTCOME_CONFIRMED, S.FAILED_RETRYABLE, S.FAILED, S.UNKNOWN, S.MANUAL_REVIEW}
    ),
    S.FAILED_RETRYABLE: frozenset({S.DISPATCHED, S.FAILED, S.MANUAL_REVIEW}),
    S.UNKNOWN: frozenset(
        {S.OUTCOME_CONFIRMED, S.DISPATCHED, S.FAILED, S.MANUAL_REVIEW, S.RECONCILED}
    ),
    S.MANUAL_REVIEW: frozenset({S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED, S.INTENT_RECORDED}),
    S.OUTCOME_CONFIRMED: frozenset(),
    S.FAILED: frozenset(),
    S.RECONCILED: frozenset(),
}
# States a new attempt may be created in.
INITIAL_STATES = frozenset({S.INTENT_RECORDED, S.MANUAL_REVIEW})

# Advisory lock key for the ledger's write lock on PostgreSQL ("ledgerwb" as an int64).
_PG_LOCK_KEY = int.from_bytes(b"ledgerwb", "big") & 0x7FFF_FFFF_FFFF_FFFF


class TransitionError(Exception):
    """A move that cannot be made. Nothing was changed."""

    code = "illegal_move"


class IllegalMove(TransitionError):
    def __init__(self, attempt: Attempt, to_state: str) -> None:
        super().__init__(
            f"attempt {attempt.attempt_id} cannot move from {attempt.state} to {to_state}"
        )
        self.attempt = attempt
        self.to_state = to_state


class StaleAttempt(TransitionError):
    """Another process changed the attempt first (the compare-and-set found a newer version)."""

    code = "concurrent_change"

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(
            f"attempt {attempt.attempt_id} was changed by someone else "
            f"(expected {attempt.state} at version {attempt.version}); reload and retry"
        )
        self.attempt = attempt


@dataclass(frozen=True, slots=True)
class Actor:
    """Who or what acts: recorded on every event."""

    kind: str
    name: str
    user_id: int | None = None

    @classmethod
    def agent(cls, name: str) -> Actor:
        return cls(ActorKind.AGENT, name)

    @classmethod
    def worker(cls, name: str) -> Actor:
        return cls(ActorKind.WORKER, name)

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(ActorKind.USER, user.get_username(), user.pk)

    @classmethod
    def system(cls, name: str = "ledgerweb") -> Actor:
        return cls(ActorKind.SYSTEM, name)


def lock_ledger() -> None:
    """Take the ledger write lock for the current transaction (a no-op outside PostgreSQL,
    where SQLite's ``BEGIN IMMEDIATE`` already holds the database write lock). Inside
    ``write_transaction()`` the lock is already held and this asks the server nothing."""
    if connection.vendor == "postgresql" and not getattr(connection, "_ledger_lock_held", False):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PG_LOCK_KEY])


class _WriterQueue:
    """Queue SQLite's ledger writers in the kernel instead of in SQLite's busy handler.

    A writer that finds SQLite's write lock taken sleeps in the busy handler for 1, 2, 5, 10 ms
    and more before it looks again, while the lock is held for well under a millisecond: under
    load most of the time is spent asleep with the lock free. Here the outermost ledger write
    transaction of each thread first takes a thread lock (one writer per process) and then an
    exclusive ``flock`` on a file beside the database (one writer across processes); a waiter is
    woken the moment the holder lets go. The kernel drops the ``flock`` of a process that dies,
    so a killed writer never leaves it held. Writes outside ``write_transaction()`` (sessions,
    log-in throttling) still meet SQLite's own lock and busy timeout, as before.
    """

    def __init__(self) -> None:
        self._thread_lock = threading.Lock()
        self._files: dict[tuple[int, str], int] = {}

    def _descriptor(self, path: str) -> int:
        key = (os.getpid(), path)  # a forked worker opens its own description
        fd = self._files.get(key)
        if fd is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._files[key] = fd
        return fd

    @contextlib.contextmanager
    def hold(self, database: str) -> Iterator[None]:
        with self._thread_lock:
            fd = self._descriptor(database + "-writers.lock")
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


_writer_queue = _WriterQueue()


def writer_queue_held(database: str):
    """Hold the SQLite writer queue of ``database`` (a context manager) for a caller that runs
    its own transaction on the bare connection (the intent writer)."""
    return _writer_queue.hold(database)


def sqlite_file(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """The SQLite database file of connection ``using``, or None (PostgreSQL, in-memory)."""
    db = connections[using]
    if db.vendor != "sqlite":
        return None
    name = str(db.settings_dict["NAME"])
    if not name or name == ":memory:" or "mode=memory" in name:
        return None
    return name


@contextlib.contextmanager
def write_transaction() -> Iterator[None]:
    """A transaction for ledger writes, holding the write lock from its first statement."""
    database = None if connection.in_atomic_block else sqlite_file()
    if database is None:
        with _ledger_transaction():
            yield
    else:
        with _writer_queue.hold(database), _ledger_transaction():
            yield
        checkpoint_now_and_then()


# Ledger write transactions this process commits between two WAL checkpoints of its own.
CHECKPOINT_EVERY = 200
_commits_since_checkpoint = 0


def checkpoint_now_and_then() -> None:
    """Copy the WAL back into the database every CHECKPOINT_EVERY ledger commits, after the
    writer queue is released. SQLite's automatic checkpoint would run inside the commit that
    crosses its threshold, while the writer holds the queue; PASSIVE never waits for readers
    or writers. A failed checkpoint is only logged: the next one (or SQLite's automatic
    backstop, ``wal_autocheckpoint`` in settings) copies the same frames."""
    global _commits_since_checkpoint
    _commits_since_checkpoint += 1
    if _commits_since_checkpoint < CHECKPOINT_EVERY:
        return
    _commits_since_checkpoint = 0
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except DatabaseError as exc:
        log.warning("WAL checkpoint failed (the next one retries): %s", exc)


@contextlib.contextmanager
def _ledger_transaction() -> Iterator[None]:
    with transaction.atomic():
        outermost = not getattr(connection, "_ledger_lock_held", False)
        lock_ledger()
        if outermost:
            # The advisory lock lasts until the transaction ends; remember it so the moves and
            # events inside don't ask again (it is forgotten on leaving, whatever happens).
            connection._ledger_lock_held = True
        try:
            yield
        finally:
            if outermost:
                connection._ledger_lock_held = False


class _Pending:
    """One caller's work waiting for a group commit, and its outcome once the group is durable."""

    __slots__ = ("work", "done", "value", "error")

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class GroupCommit:
    """Group commit for the threads of one process: ledger writes that arrive while another
    group is committing share the next transaction and its one durable commit.

    Every write takes the single ledger write lock and ends in a synchronous commit, so under
    load each thread would otherwise wait for the lock, then for its own fsync. Here a thread
    queues its work and takes the leader's baton; whoever holds it runs everything queued, each
    piece in its own savepoint (a refused or failing piece rolls back alone and its exception
    goes to its caller), commits once, and only then does any caller get its answer. A caller
    whose work a previous leader already committed just collects the outcome. If the commit
    itself fails, every caller in the group gets that error and nothing of the group is kept.

    Work runs on the leader's thread and database connection: it must use ``connection`` and
    nothing thread-bound of its caller. Callers already inside a transaction run their work in
    it directly (their commit is their own).
    """

    MAX_GROUP = 64

    def __init__(self) -> None:
        self._baton = threading.Lock()
        self._mutex = threading.Lock()
        self._queue: list[_Pending] = []
        self.groups = 0  # committed groups and pieces, for tests and the bench
        self.pieces = 0

    def run(self, work: Callable[[], Any]) -> Any:
        if connection.in_atomic_block:
            with write_transaction():
                return work()
        pending = _Pending(work)
        with self._mutex:
            self._queue.append(pending)
        with self._baton:
            if not pending.done:
                with self._mutex:
                    group = self._queue[: self.MAX_GROUP]
                    del self._queue[: self.MAX_GROUP]
                self._commit(group)
        return pending.outcome()

    def _commit(self, group: list[_Pending]) -> None:
        """Run every piece of ``group`` in one write transaction, each in its own savepoint,
        and commit once; each piece's value or error is set on it, and it is marked done. A
        BaseException that is not an Exception (the process is going down) fails every piece
        and propagates."""
        try:
            with write_transaction():
                if len(group) == 1:
                    # Alone: no savepoint; a failure rolls back the whole (one-piece) group.
                    group[0].value = group[0].work()
                else:
                    for pending in group:
                        try:
                            with transaction.atomic():
                                pending.value = pending.work()
                        except Exception as exc:  # noqa: BLE001 (delivered to its caller)
                            pending.error = exc
                            pending.value = None
        except BaseException as exc:
            for pending in group:
                if pending.error is None:
                    pending.error = exc
                    pending.value = None
            if not isinstance(exc, Exception):
                raise
        else:
            self.groups += 1
            self.pieces += len(group)
        finally:
            for pending in group:
                pending.done = True


group_commit = GroupCommit()


def _require_write_transaction() -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("ledger writes must run inside states.write_transaction()")


def default_next_check(to_state: str, now: dt.datetime) -> dt.datetime | None:
    """When recovery should look at an attempt that has just entered ``to_state``."""
    ledger = settings.LEDGER
    if to_state in (S.INTENT_RECORDED, S.DISPATCHED, S.FAILED_RETRYABLE):
        return now + dt.timedelta(seconds=ledger["STALE_AFTER"])
    if to_state == S.UNKNOWN:
        return now + dt.timedelta(seconds=ledger["BACKOFF_BASE"])
    return None


def _chain_parts(payload: dict[str, Any]) -> tuple[bytes, bytes]:
    """The event's canonical bytes around its ``prev_hash`` (``audit.payload_parts``), made
    before the lock; refuses (InvalidArguments) details the chain could not hash reproducibly,
    before anything is written."""
    try:
        return audit.payload_parts(payload)
    except (jcs.CanonicalizationError, TypeError, ValueError):
        canonical_bytes(payload["details"])  # raises InvalidArguments in the usual words
        raise InvalidArguments("event details are not JSON") from None


class ChainedEvent:
    """An event made ready for the chain before the write lock is taken: its row values and hash
    payload are complete but for its place in the chain (the previous hash, its own hash and,
    for an attempt's first event, the attempt's new id). ``write()`` then does only what must
    happen under the lock: read the chain head, hash, insert. No model instance is built unless
    asked for (``event()``): the hot path only inserts."""

    __slots__ = ("row", "parts", "values", "pk")

    def __init__(
        self,
        attempt: Attempt,
        *,
        action: str,
        actor: Actor,
        from_state: str = "",
        to_state: str = "",
        reason: str = "",
        details: dict[str, Any] | None = None,
        now: dt.datetime | None = None,
    ) -> None:
        now = now or timezone.now()
        details = details or {}
        payload = audit.event_payload(
            attempt_id=attempt.attempt_id,
            action=action,
            actor_kind=actor.kind,
            actor=actor.name,
            from_state=from_state,
            to_state=to_state,
            reason=reason,
            details=details,
            created_at=now,
            prev_hash="",
        )
        self.row = {
            "attempt_id": attempt.pk,
            "action": action,
            "actor_kind": actor.kind,
            "actor": actor.name,
            "from_state": from_state,
            "to_state": to_state,
            "reason": reason,
            "details": details,
            "created_at": now,
            "prev_hash": "",
            "hash": "",
        }
        self.pk: int | None = None
        try:
            self.values = _values_of(AttemptEvent, self.row)
        except (TypeError, ValueError) as exc:
            raise InvalidArguments(f"event details are not JSON: {exc}") from None
        self.parts = _chain_parts(payload)

    def write(self, cursor, attempt_pk: int | None = None) -> None:
        """Link the event to the chain head and insert it (inside a write transaction)."""
        pk, prev_hash, digest = _chain_values(cursor, self.values, self.parts, attempt_pk)
        self.finish(pk, prev_hash, digest, attempt_pk)

    def finish(self, pk: int, prev_hash: str, digest: str, attempt_pk: int | None) -> None:
        """Keep what the insert decided."""
        if attempt_pk is not None:
            self.row["attempt_id"] = attempt_pk
        self.row["prev_hash"], self.row["hash"], self.pk = prev_hash, digest, pk

    def event(self) -> AttemptEvent:
        """The written event as a model instance."""
        event = AttemptEvent(id=self.pk, **self.row)
        event._state.adding = False
        event._state.db = "default"
        return event


def _chain_values(
    cursor, values: list[Any], parts: tuple[bytes, bytes], attempt_pk: int | None = None
) -> tuple[int, str, str]:
    """Insert an event row from its prepared values at the head of the chain (inside a write
    transaction). Returns (pk, prev, hash)."""
    prev_hash, digest = _link(cursor, parts)
    attempt_slot, prev_slot, hash_slot = _event_slots(connection.vendor)
    if attempt_pk is not None:
        values[attempt_slot] = attempt_pk
    values[prev_slot] = prev_hash
    values[hash_slot] = digest
    return _insert_values(cursor, AttemptEvent, values), prev_hash, digest


def _link(cursor, parts: tuple[bytes, bytes]) -> tuple[str, str]:
    """The chain step under the lock: read the head's hash and hash the event's prepared
    canonical bytes with it. Returns (prev, hash). bench/chain_cost.py measures the write path
    without exactly this and ``_chain_parts``."""
    cursor.execute(_head_sql())
    row = cursor.fetchone()
    prev_hash = row[0] if row else audit.GENESIS
    return prev_hash, audit.linked_hash(parts, prev_hash)


def write_new_attempt(
    cursor, attempt_values: list[Any], event_values: list[Any], parts: tuple[bytes, bytes]
) -> tuple[int, int, str, str]:
    """Insert a new attempt and its first, chained event from values prepared outside the lock
    (inside a write transaction). Returns (attempt pk, event pk, previous hash, event hash)."""
    _require_write_transaction()
    lock_ledger()
    return write_new_attempt_rows(cursor, attempt_values, event_values, parts)


def write_new_attempt_rows(
    cursor, attempt_values: list[Any], event_values: list[Any], parts: tuple[bytes, bytes]
) -> tuple[int, int, str, str]:
    """``write_new_attempt`` for a caller that holds the write lock in a transaction of its
    own making (the intent writer, on the bare sqlite3 connection through ``QmarkCursor``)."""
    attempt_pk = _insert_values(cursor, Attempt, attempt_values)
    event_pk, prev_hash, digest = _chain_values(cursor, event_values, parts, attempt_pk)
    return attempt_pk, event_pk, prev_hash, digest


class QmarkCursor:
    """A bare sqlite3 cursor that takes the ledger's ``%s``-style statements: the intent
    writer's hot loop runs the same statements without Django's cursor wrappers (it holds the
    writer queue and its own ``BEGIN IMMEDIATE``). The ledger's statements carry no literal
    ``%``: table and column names and placeholders only."""

    __slots__ = ("cursor",)

    def __init__(self, cursor) -> None:
        self.cursor = cursor

    def execute(self, sql: str, params=()) -> None:
        self.cursor.execute(_qmark(sql), params)

    def fetchone(self):
        return self.cursor.fetchone()

    @property
    def lastrowid(self) -> int | None:
        return self.cursor.lastrowid


@functools.lru_cache(maxsize=64)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")


@functools.cache
def _head_sql() -> str:
    table = connection.ops.quote_name(AttemptEvent._meta.db_table)
    return f"SELECT hash FROM {table} ORDER BY id DESC LIMIT 1"  # noqa: S608


@functools.cache
def _event_slots(vendor: str) -> tuple[int, int, int]:
    """Where the attempt id, previous hash and hash sit in an event's INSERT values."""
    _, plan, _ = _insert_plan(AttemptEvent, vendor)
    names = [attname for attname, _ in plan]
    return names.index("attempt_id"), names.index("prev_hash"), names.index("hash")


def append_event(attempt: Attempt, **event: Any) -> AttemptEvent:
    """Append one chained event to the attempt's history (inside a write transaction). Takes
    ``action``, ``actor`` and optionally ``from_state``, ``to_state``, ``reason``, ``details``
    and ``now``."""
    _require_write_transaction()
    lock_ledger()
    chained = ChainedEvent(attempt, **event)
    with connection.cursor() as cursor:
        chained.write(cursor)
    return chained.event()


# Fields whose Python value is not what the database driver takes as is.
_PREPARED_FIELDS = (models.DateTimeField, models.JSONField)


@functools.cache
def _insert_plan(model: type[models.Model], vendor: str) -> tuple[str, tuple, bool]:
    """The INSERT for every concrete field but the auto id, built once per model and database.

    Returns (sql, ((attname, field needing preparation or None), ...), returns_id)."""
    meta = model._meta
    quote = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    returning = connection.features.can_return_columns_from_insert
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(fields))})" + (" RETURNING id" if returning else "")
    )
    plan = tuple((f.attname, f if isinstance(f, _PREPARED_FIELDS) else None) for f in fields)
    return sql, plan, returning


def _prepared_values(model: type[models.Model], python_values) -> list[Any]:
    """INSERT values for ``model`` from its Python values in plan order (every concrete field
    but the auto id), prepared for the driver where the plan says so (timestamps, JSON)."""
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself, not the per-access proxy
    _, plan, _ = _insert_plan(model, db.vendor)
    shortcuts = _sqlite_shortcuts(db.vendor)
    return [
        _prepare(field, value, db, shortcuts) if field is not None else value
        for (_, field), value in zip(plan, python_values, strict=True)
    ]


def _values_of(model: type[models.Model], row: dict[str, Any]) -> list[Any]:
    """INSERT values from a mapping of every attname to its Python value."""
    _, plan, _ = _insert_plan(model, connection.vendor)
    return _prepared_values(model, [row[attname] for attname, _ in plan])


@functools.cache
def _sqlite_shortcuts(vendor: str) -> bool:
    """Whether ``_prepare`` may write SQLite's two hot conversions out itself: Django stores an
    aware datetime as naive UTC text there (when the connection's time zone is UTC) and JSON
    as ``json.dumps`` text."""
    return (
        vendor == "sqlite"
        and settings.USE_TZ
        and connections[DEFAULT_DB_ALIAS].timezone_name == "UTC"
    )


def _prepare(field: models.Field, value: Any, db, shortcuts: bool) -> Any:
    """``field.get_db_prep_save(value, db)``: the same value, with the SQLite cases every
    ledger write hits done without the field machinery (a fifth of an intent's Python before
    the lock). tests/attempts/test_states.py holds the shortcuts to the field's own result."""
    if shortcuts:
        kind = type(value)
        if kind is dt.datetime and value.tzinfo is dt.UTC:
            return str(value.replace(tzinfo=None))
        if (kind is dict or kind is list) and type(field) is models.JSONField and not field.encoder:
            return json.dumps(value)
    return field.get_db_prep_save(value, db)


@functools.cache
def _field_defaults(model: type[models.Model]) -> tuple[frozenset[str], tuple]:
    """Every concrete field's attname and Django's own default producer, in field order."""
    fields = model._meta.concrete_fields
    return (
        frozenset(f.attname for f in fields),
        tuple((f.attname, f._get_default) for f in fields),
    )


def _new_instance_and_row(
    model: type[models.Model], given: dict[str, Any]
) -> tuple[models.Model, list[Any] | None]:
    """``model(**given)`` through the model's positional fast path (half the time on a wide
    model), with the positional row (every concrete field, in order): each field from
    ``given`` or its default, exactly as the keyword path fills it. Keyword init, and no row,
    when ``given`` names a relation rather than a column (``parent=``)."""
    attnames, defaults = _field_defaults(model)
    if not attnames.issuperset(given):
        return model(**given), None
    row = [given[name] if name in given else default() for name, default in defaults]
    return model(*row), row


def _values_from_row(model: type[models.Model], row: list[Any]) -> list[Any]:
    """INSERT values from a positional row of every concrete field (the plan leaves out the
    primary key, which Django puts first)."""
    if not model._meta.concrete_fields[0].primary_key:
        raise RuntimeError(f"{model.__name__}: the primary key must be the first field")
    return _prepared_values(model, row[1:])


def _row_values(instance: models.Model) -> list[Any]:
    """``instance``'s INSERT values, from its attributes."""
    _, plan, _ = _insert_plan(type(instance), connection.vendor)
    return _prepared_values(type(instance), [getattr(instance, attname) for attname, _ in plan])


def _insert_values(cursor, model: type[models.Model], values: list[Any]) -> int:
    sql, _, returning = _insert_plan(model, connection.vendor)
    cursor.execute(sql, values)
    return cursor.fetchone()[0] if returning else cursor.lastrowid


@functools.cache
def _update_plan(names: tuple[str, ...], increments: frozenset[str], vendor: str):
    meta = Attempt._meta
    quote = connection.ops.quote_name
    assignments, prepare = [], []
    for name in names:
        field = meta.get_field(name)
        column = quote(field.column)
        if name in increments:
            assignments.append(f"{column} = {column} + %s")
            prepare.append(None)
        else:
            assignments.append(f"{column} = %s")
            prepare.append(field if isinstance(field, _PREPARED_FIELDS) else None)
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(assignments)} "  # noqa: S608
        "WHERE id = %s AND state = %s AND version = %s"
    )
    return sql, tuple(prepare)


def _owner_on_attention(attempt: Attempt, to_state: str, fields: dict[str, Any]) -> None:
    """An attempt entering UNKNOWN or MANUAL_REVIEW gets an owner at that moment."""
    if to_state in ATTENTION_STATES and attempt.owner_id is None and "owner_id" not in fields:
        from attempts.owners import owner_id_for

        owner_id = owner_id_for(attempt.tenant_id, attempt.tool_name)
        if owner_id is not None:
            fields["owner_id"] = owner_id


class PreparedAttempt:
    """A new attempt and its first event, built before the write lock is taken (row values,
    defaults, owner, the event's payload) so that ``write()`` under the lock only inserts and
    chains. ``write()`` runs once, inside a write transaction; it returns the saved attempt."""

    __slots__ = ("attempt", "values", "first_event")

    def __init__(
        self,
        *,
        state: str,
        actor: Actor,
        reason: str = "",
        details: dict[str, Any] | None = None,
        now: dt.datetime | None = None,
        **fields: Any,
    ) -> None:
        if state not in INITIAL_STATES:
            raise TransitionError(f"an attempt cannot be created in {state}")
        now = now or timezone.now()
        fields = {"state": state, "created_at": now, "updated_at": now, **fields}
        if "next_check_at" not in fields:
            fields["next_check_at"] = default_next_check(state, now)
        attempt, row = _new_instance_and_row(Attempt, fields)
        extra: dict[str, Any] = {}
        _owner_on_attention(attempt, state, extra)
        if "owner_id" in extra:
            attempt.owner_id = extra["owner_id"]
            row = None  # the row no longer says what the instance does
        record = {
            "tenant": attempt.tenant_id,
            "task_id": attempt.task_id,
            "tool_name": attempt.tool_name,
            "idempotency_key": attempt.idempotency_key,
            "args_hash": attempt.args_hash,
            "policy_version": attempt.policy_version,
            "credential_scope": attempt.credential_scope,
            "parent_attempt_id": attempt.parent.attempt_id if attempt.parent_id else None,
        }
        if attempt.owner_id:
            record["owner_id"] = attempt.owner_id
        self.attempt = attempt
        self.values = _row_values(attempt) if row is None else _values_from_row(Attempt, row)
        self.first_event = ChainedEvent(
            attempt,
            action="attempt.created",
            actor=actor,
            to_state=state,
            reason=reason,
            details={**record, **(details or {})},
            now=now,
        )

    def write(self) -> Attempt:
        with connection.cursor() as cursor:
            written = write_new_attempt(
                cursor, self.values, self.first_event.values, self.first_event.parts
            )
        return self.finish(*written)

    def finish(self, attempt_pk: int, event_pk: int, prev_hash: str, digest: str) -> Attempt:
        """Give the instances what the inserts decided (here, or in the intent writer)."""
        attempt = self.attempt
        attempt.pk = attempt_pk
        attempt._state.adding = False
        attempt._state.db = "default"
        self.first_event.finish(event_pk, prev_hash, digest, attempt_pk)
        return attempt


def create(**fields: Any) -> Attempt:
    """Create a new attempt in an initial state, with its first event (inside a write
    transaction). Takes ``state``, ``actor``, optionally ``reason``, ``details``, ``now``, and
    the attempt's fields."""
    return PreparedAttempt(**fields).write()


def _compare_and_set(cursor, attempt: Attempt, from_state: str, updates: dict[str, Any]) -> int:
    """UPDATE ... WHERE id AND state AND version: the compare-and-set every move is. Values are
    prepared by the model's fields; F(name) + n becomes ``column = column + n``."""
    db = connections[DEFAULT_DB_ALIAS]
    names = tuple(updates)
    increments = frozenset(n for n, v in updates.items() if isinstance(v, CombinedExpression))
    sql, prepare = _update_plan(names, increments, db.vendor)
    params = []
    for (name, value), field in zip(updates.items(), prepare, strict=True):
        if name in increments:
            params.append(value.rhs.value)
        elif field is not None:
            params.append(_prepare(field, value, db, _sqlite_shortcuts(db.vendor)))
        else:
            params.append(value)
    cursor.execute(sql, [*params, attempt.pk, from_state, attempt.version])
    return cursor.rowcount


def move(
    attempt: Attempt,
    to_state: str | None,
    *,
    actor: Actor,
    action: str | None = None,
    reason: str = "",
    details: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    increments: dict[str, int] | None = None,
    next_check_at: dt.datetime | None | type[Ellipsis] = ...,
    now: dt.datetime | None = None,
) -> Attempt:
    """Apply one change to ``attempt`` as a compare-and-set on its (state, version).

    ``to_state`` None (or equal to the current state) changes fields only (owner, provider id).
    Raises IllegalMove for a move not in LEGAL_MOVES and StaleAttempt when another process got
    there first; in both cases nothing is written. On success ``attempt`` is updated in place.
    """
    _require_write_transaction()
    lock_ledger()
    now = now or timezone.now()
    from_state = attempt.state
    changing_state = to_state is not None and to_state != from_state
    if changing_state and to_state not in LEGAL_MOVES[from_state]:
        raise IllegalMove(attempt, to_state)
    fields = dict(fields or {})
    if "state" in fields or "version" in fields:
        raise TransitionError("state and version are set by the state machine only")
    updates: dict[str, Any] = {**fields, "updated_at": now, "version": F("version") + 1}
    if changing_state:
        updates["state"] = to_state
        _owner_on_attention(attempt, to_state, fields)
        updates.update(fields)
        if next_check_at is ...:
            next_check_at = default_next_check(to_state, now)
    if next_check_at is not ...:
        updates["next_check_at"] = next_check_at
    for name, amount in (increments or {}).items():
        updates[name] = F(name) + amount
    event_details = dict(details or {})
    for name in ("owner_id", "provider_request_id", "result_ref", "review_reason"):
        if name in fields:
            event_details.setdefault(name, fields[name])
    chained = ChainedEvent(
        attempt,
        action=action or (f"attempt.{to_state.lower()}" if changing_state else "attempt.updated"),
        actor=actor,
        from_state=from_state,
        to_state=to_state if changing_state else from_state,
        reason=reason,
        details=event_details,
        now=now,
    )
    with connection.cursor() as cursor:
        if _compare_and_set(cursor, attempt, from_state, updates) != 1:
            raise StaleAttempt(attempt)
        chained.write(cursor)
    # Mirror the update in memory without another query (after everything that could fail).
    for name, value in updates.items():
        if name not in ("version", *(increments or {})):
            setattr(attempt, name, value)
    attempt.version += 1
    for name, amount in (increments or {}).items():
        setattr(attempt, name, getattr(attempt, name) + amount)
    return attempt
