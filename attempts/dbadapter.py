"""The one place the ledger touches Django's database internals (private, unversioned names):
the write path's, and the streaming reads of the exports and the verifier (``streaming_cursor``,
``is_connected``).

The write path's statements go straight to the driver's cursor (``sqlite3`` or psycopg), and an
intent or move made alone on SQLite opens its own ``BEGIN IMMEDIATE`` on the driver's connection:
Django's cursor wrapper and its nested-atomic bookkeeping were a large share of a tool call's
CPU (docs/scaling.md, "Why the write path is shaped so"). What Django's own cursor guards is kept
here, through these names of ``BaseDatabaseWrapper``, none of them documented:

- ``close_if_health_check_failed()``: ``CONN_HEALTH_CHECKS``, as Django's ``cursor()`` does;
- ``validate_no_broken_transaction()``: no statement inside a transaction that must roll back;
- ``wrap_database_errors``: driver errors raised as Django's (``IntegrityError`` and the rest);
- ``queries_logged``: whoever watches the queries (DEBUG, ``CaptureQueriesContext``) gets
  Django's own cursor, so they see these statements too;
- ``connection``: the driver's connection (None until connected);
- ``chunked_cursor()``: a cursor that streams a large result (server-side on PostgreSQL), which
  ``QuerySet.iterator()`` uses; the exports and the verifier read whole tables through it;
- ``in_atomic_block``: whether the connection is inside ``atomic()`` (the write path refuses to
  run outside its write transaction, and some work waits for the caller's commit);
- ``timezone``: the zone a datetime is stored in on SQLite (``datetime_param``'s short path).

And beyond the connection wrapper, the names the hand-written SQL needs:

- ``ops.quote_name()`` and ``ops.adapt_datetimefield_value()``: a table or column name, and a
  datetime parameter, as this database writes them;
- ``introspection.table_names()`` and ``introspection.get_table_description()``: which tables
  and columns exist (the history guards install on what the schema has);
- ``Query.sql_with_params()``: a queryset's SQL and parameters, to embed it in a statement.

``PRIVATE_API`` lists them with the shape relied on (a dotted name is looked up on the
connection's ``ops`` or ``introspection``, or on ``Query``); ``tests/attempts/test_dbadapter.py`` checks
it against the Django version pinned in ``pyproject.toml``, so an upgrade that renames or
reshapes one fails there, loudly, before it fails in a tool call. Everything else uses the
public API: ``connection.cursor()`` and ``transaction.atomic()``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import json
import json.encoder
from collections.abc import Callable, Iterator
from typing import Any

import django
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.functional import cached_property

# The Django release this module was written and tested against (pyproject.toml pins it).
PINNED_DJANGO = (6, 1)

# Each private name of BaseDatabaseWrapper used here: "method" with its parameters (self
# excluded), "property", or "attribute" (set on every instance).
PRIVATE_API: dict[str, tuple[str, tuple[str, ...]]] = {
    "close_if_health_check_failed": ("method", ()),
    "validate_no_broken_transaction": ("method", ()),
    "wrap_database_errors": ("property", ()),
    "queries_logged": ("property", ()),
    "connection": ("attribute", ()),
    "chunked_cursor": ("method", ()),
    "in_atomic_block": ("attribute", ()),
    "timezone": ("property", ()),
    "ops.quote_name": ("method", ("name",)),
    "ops.adapt_datetimefield_value": ("method", ("value",)),
    "ops.adapt_json_value": ("method", ("value", "encoder")),
    "introspection.table_names": ("method", ("cursor", "include_views")),
    "introspection.get_table_description": ("method", ("cursor", "table_name")),
    "query.sql_with_params": ("method", ()),
}


def _owner(db: BaseDatabaseWrapper, name: str) -> tuple[Any, str]:
    """The object (or class) a name of ``PRIVATE_API`` is looked up on, and the bare name."""
    prefix, _, bare = name.rpartition(".")
    if prefix == "query":
        from django.db.models.sql.query import Query

        return Query, bare
    return (getattr(db, prefix) if prefix else db), bare


def private_api_problems(db: BaseDatabaseWrapper) -> list[str]:
    """What in ``PRIVATE_API`` no longer holds for this Django and this connection (empty when
    all is as relied on)."""
    problems = []
    if django.VERSION[:2] != PINNED_DJANGO:
        problems.append(
            f"Django {django.get_version()} is not the pinned "
            f"{'.'.join(map(str, PINNED_DJANGO))}: re-check attempts/dbadapter.py"
        )
    for dotted, (kind, params) in PRIVATE_API.items():
        owner, name = _owner(db, dotted)
        cls = owner if isinstance(owner, type) else type(owner)
        if kind == "attribute":
            if name not in vars(owner):
                problems.append(f"{cls.__name__}.{name} is no longer an instance attribute")
            continue
        found = inspect.getattr_static(cls, name, None)
        if kind == "property":
            if not isinstance(found, property | functools.cached_property | cached_property):
                problems.append(f"{cls.__name__}.{name} is no longer a property")
            continue
        if not callable(found):
            problems.append(f"{cls.__name__}.{name}() is gone")
            continue
        got = tuple(inspect.signature(found).parameters)[1:]
        if got != params:
            problems.append(f"{cls.__name__}.{name}{got} is not {name}{params}")
    return problems


class DriverCursor:
    """A statement straight on the driver's cursor, with what Django's cursor guards kept:
    errors are Django's (``IntegrityError`` for a key already recorded), a broken transaction
    is refused, and a connection that failed its health check is replaced. On PostgreSQL each
    statement runs on the connection's driver cursor for that statement, reused
    (``_kept_cursor``): read a statement's result inside its ``with`` block, before the next
    statement."""

    def __init__(self, db: BaseDatabaseWrapper) -> None:
        db.close_if_health_check_failed()
        db.ensure_connection()
        self.qmark = db.vendor == "sqlite"
        # sqlite3 keeps a statement open until its cursor is reset, so there each statement
        # has a cursor of its own, closed after it; psycopg has read the whole result already.
        self.kept = not self.qmark
        self.db, self.cursor = db, None if self.kept else db.connection.cursor()

    def execute(self, sql: str, params: list[Any]) -> None:
        self.db.validate_no_broken_transaction()
        if self.kept:
            self.cursor = _kept_cursor(self.db, sql)
        with self.db.wrap_database_errors:
            self.cursor.execute(_qmark(sql) if self.qmark else sql, params)

    def fetchone(self) -> tuple | None:
        return self.cursor.fetchone()

    def fetchall(self) -> list[tuple]:
        return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self.cursor.lastrowid

    def __enter__(self) -> DriverCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            self.cursor.close()


def _kept_cursor(db: BaseDatabaseWrapper, sql: str) -> Any:
    """The psycopg cursor of the driver connection for the statement ``sql``, reused each time
    that statement runs (a Django connection belongs to one thread). A cursor keeps its
    adaptation state (the transformer that finds each parameter's dumper) only while it runs the
    same statement again: a cursor opened per statement, or one shared by statements in turn,
    built it again for every statement, a visible share of a tool call. A new driver connection
    (after a close or a failed health check) gets new cursors, and so does one that has run
    ``_KEPT_STATEMENTS`` different statements (one built with varying parts)."""
    raw = db.connection
    kept = db.__dict__.get(_KEPT)
    if (
        kept is None
        or kept[0] is not raw
        or (len(kept[1]) >= _KEPT_STATEMENTS and sql not in kept[1])
    ):
        kept = (raw, {})
        db.__dict__[_KEPT] = kept
    cursor = kept[1].get(sql)
    if cursor is None:
        cursor = kept[1][sql] = raw.cursor()
    return cursor


# Where the kept cursors live on the connection wrapper (a name of this module's own), and how
# many statements' cursors a connection keeps at most.
_KEPT = "_ledger_driver_cursors"
_KEPT_STATEMENTS = 64


@functools.cache
def _qmark(sql: str) -> str:
    # sqlite3 takes ?, the write path's statements are written with %s (and contain no other %).
    return sql.replace("%s", "?")


def cursor(db: BaseDatabaseWrapper) -> Any:
    """A cursor for the write path's statements: Django's own while queries are being logged,
    else the driver's (``DriverCursor``)."""
    return db.cursor() if db.queries_logged else DriverCursor(db)


def driver_connection(db: BaseDatabaseWrapper) -> Any:
    """The driver's connection under ``db``, connected."""
    db.ensure_connection()
    return db.connection


def is_connected(db: BaseDatabaseWrapper) -> bool:
    """Whether ``db`` has a driver connection open now (without opening one)."""
    return db.connection is not None


def in_atomic_block(db: BaseDatabaseWrapper) -> bool:
    """Whether ``db`` is inside ``transaction.atomic()`` now."""
    return db.in_atomic_block


def quote_name(db: BaseDatabaseWrapper, name: str) -> str:
    """A table or column name quoted as ``db`` writes it."""
    return db.ops.quote_name(name)


def datetime_param(db: BaseDatabaseWrapper, value: Any) -> Any:
    """A datetime as ``db`` takes it as a parameter of hand-written SQL. On SQLite a UTC
    datetime (what ``timezone.now()`` makes) for a connection in UTC is the naive text that
    ``adapt_datetimefield_value`` would make of it, made in one step: that adaptation reads the
    settings twice and converts the zone for each of an intent's half-dozen datetimes."""
    if (
        value.__class__ is dt.datetime
        and value.tzinfo is dt.UTC
        and db.vendor == "sqlite"
        and db.timezone is dt.UTC
    ):
        # An intent writes one moment three times (created, updated, its event): its text is
        # kept for that same object (which the pair keeps alive, so its id is not reused).
        last, text = _LAST_SQLITE_DATETIME[0]
        if last is not value:
            text = str(value.replace(tzinfo=None))
            _LAST_SQLITE_DATETIME[0] = (value, text)
        return text
    return db.ops.adapt_datetimefield_value(value)


# The last datetime ``datetime_param`` wrote for SQLite, and its text (one pair, swapped whole).
_LAST_SQLITE_DATETIME: list[tuple[Any, str]] = [(None, "")]


def built_json_encoder(default: Callable[[Any], Any]) -> Callable[[Any], str] | None:
    """``json.dumps`` with its defaults (ASCII, ", " and ": ", no sorting) and ``default`` for
    what JSON lacks, by the C encoder built once: json.dumps builds a new one for every call.
    None where CPython has no C encoder. It keeps no circular-reference markers: only for
    values that cannot hold a cycle."""
    if json.encoder.c_make_encoder is None:  # pragma: no cover - CPython always has it
        return None
    encode = json.encoder.c_make_encoder(
        None,
        default,
        json.encoder.c_encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        True,
    )
    return lambda value: "".join(encode(value, 0))


# The ledger's JSON values (normalized args, scopes, event details) were hashed as canonical
# JSON before they are written, which no cycle survives.
_json_dumps = built_json_encoder(json.JSONEncoder().default)


def json_param(db: BaseDatabaseWrapper, value: Any) -> Any:
    """A dict or list for a JSON column without its own encoder, as ``db`` takes it as a
    parameter of hand-written SQL: what ``adapt_json_value(value, None)`` makes of it (the text
    of ``json.dumps`` on SQLite, psycopg's ``Jsonb`` that writes that text on PostgreSQL),
    encoded by an encoder built once."""
    if _json_dumps is None:  # pragma: no cover - CPython always has the C encoder
        return db.ops.adapt_json_value(value, None)
    if db.vendor == "postgresql":
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=_json_dumps)
    if db.vendor == "sqlite":
        return _json_dumps(value)
    return db.ops.adapt_json_value(value, None)


def table_names(db: BaseDatabaseWrapper) -> list[str]:
    """The tables that exist in ``db`` now."""
    return db.introspection.table_names()


def index_state(db: BaseDatabaseWrapper, name: str) -> str:
    """Whether the index ``name`` is ``valid``, ``missing``, or ``invalid``: a PostgreSQL build
    with ``CONCURRENTLY`` that was cut short leaves the index in place but unused, to be dropped
    and built again (SQLite builds an index in its transaction, so never leaves one)."""
    with db.cursor() as cursor:
        if db.vendor == "sqlite":
            cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = %s", [name])
            return "valid" if cursor.fetchone() else "missing"
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
            [name],
        )
        row = cursor.fetchone()
    return "missing" if row is None else "valid" if row[0] else "invalid"


def concurrently(db: BaseDatabaseWrapper) -> dict[str, bool]:
    """The schema editor's options to build or drop an index without blocking writers: on
    PostgreSQL ``CONCURRENTLY`` (outside a transaction: the migration is not atomic); SQLite has
    no such option and needs none."""
    return {"concurrently": True} if db.vendor == "postgresql" else {}


def column_names(db: BaseDatabaseWrapper, table: str) -> set[str]:
    """The columns of ``table`` in ``db`` now."""
    with db.cursor() as cursor:
        return {column.name for column in db.introspection.get_table_description(cursor, table)}


def sql_with_params(queryset: Any) -> tuple[str, tuple[Any, ...]]:
    """A queryset's SQL and parameters, to embed in a hand-written statement."""
    return queryset.query.sql_with_params()


def streaming_cursor(db: BaseDatabaseWrapper) -> Any:
    """A cursor for reading a whole table in chunks: server-side on PostgreSQL, so memory stays
    flat (Django's, as ``QuerySet.iterator()`` gets it)."""
    return db.chunked_cursor()


def database_errors(db: BaseDatabaseWrapper) -> contextlib.AbstractContextManager:
    """Driver errors inside this block are raised as Django's."""
    return db.wrap_database_errors


@contextlib.contextmanager
def sqlite_own_transaction(
    db: BaseDatabaseWrapper,
    begin: Callable[[Any], None],
    errors: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Iterator[None]:
    """One write's own transaction on SQLite's driver connection, outside any Django block:
    ``begin(raw)`` opens it (``BEGIN IMMEDIATE``), ``COMMIT`` ends it, each inside ``errors()``
    (how the caller names a lock not had); whatever fails, it is rolled back before the error
    goes on. Django is not told (it stays in autocommit), so only
    ``DriverCursor`` statements may run inside, and never inside ``atomic()``."""
    if in_atomic_block(db):
        raise RuntimeError("sqlite_own_transaction() inside atomic(): join the caller's instead")
    raw = driver_connection(db)
    try:
        with errors(), database_errors(db):
            begin(raw)
        yield
        with errors(), database_errors(db):
            raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.rollback()
        raise
