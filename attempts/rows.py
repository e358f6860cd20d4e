"""How the state machine's rows reach the database: the statements every tool call sends.

An intent inserts an attempt and its first event; every later move is a compare-and-set
``UPDATE`` of the attempt plus one event ``INSERT``; intents read the grant's terms, and a
claim checks them inside its compare-and-set.
Building these statements with the ORM was the largest cost of a tool call (docs/scaling.md,
"Why the write path is shaped so"), so they are written here once as parameterized SQL, with
columns and values taken from the models' own fields, and nothing else writes attempts or
events. They run on the driver's cursor through ``attempts.dbadapter``, the one module that
touches Django's private database API. On
PostgreSQL an attempt's row and its event go in one statement (a data-modifying ``WITH``): a
single statement is atomic on its own, so a move made alone needs no transaction around it. On
SQLite the two statements run in a transaction of their own. Inside a caller's
``write_transaction()`` both simply join it.

Only ``attempts.states`` (and the grant read in ``attempts.authority``) call the write path's
statements. The module also holds the ledger's two other hand-written reads: the agent token
lookup every API call starts with (``live_token_rows``, for ``api.authenticate``, on the
driver's cursor as the write path), and the planner's row estimate for a long queue
(``planned_rows``, for ``queues.queue_page``, on Django's public cursor). The models never
import this module: what calls it imports both.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateField, DateTimeField, Field

from attempts import dbadapter
from attempts.event_row import EventRow
from attempts.locking import lock_errors, sqlite_transaction, write_transaction
from attempts.models import (
    AgentToken,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    Grant,
    ProviderEffect,
    RecordedKey,
    Tool,
    key_digest,
)


def _db() -> BaseDatabaseWrapper:
    return connections[DEFAULT_DB_ALIAS]


def _q(name: str) -> str:
    return dbadapter.quote_name(_db(), name)


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


def _cursor(db: BaseDatabaseWrapper) -> Any:
    return dbadapter.cursor(db)


# ---------------------------------------------------------------------------------------------
# Statements, built once from the models


# The pre_save methods that return the field's attribute (the date ones unless the field sets
# itself: auto_now, auto_now_add).
_READING_PRE_SAVES = (Field.pre_save, DateField.pre_save, DateTimeField.pre_save)


class _Column:
    """A model field this module writes, and how its values reach the database.

    Django's field preparation (``get_db_prep_save``) runs for every value of every write
    (docs/scaling.md) while handing most values back unchanged: a ``str`` for a text
    column, an ``int`` or ``bool`` of exactly that type for a number or flag column, ``None``.
    Those go as they are. An aware ``datetime`` goes straight to the backend's adaptation (all
    the field's own preparation adds is a check that it is aware): as it is on PostgreSQL, UTC
    text on SQLite; ``None`` for a datetime column goes as it is, as Django's preparation hands
    it back. A dict or list for a JSON column goes straight to the backend's adaptation
    too (the field's own preparation adds only a lazy string's check). Every other value (naive
    datetimes, dates, other JSON, lazy strings, a bool for a number column) still goes through
    Django."""

    # Internal field types (of the field, or of the field a foreign key points at) whose
    # prepared value is the Python value itself.
    PLAIN = {
        "CharField": str,
        "SlugField": str,
        "TextField": str,
        "BooleanField": bool,
        "PositiveIntegerField": int,
        "PositiveSmallIntegerField": int,
        "AutoField": int,
        "BigAutoField": int,
    }

    def __init__(self, field: Field) -> None:
        self.field = field
        self.name = _q(field.column)
        target = field.target_field if field.is_relation else field
        self.plain = self.PLAIN.get(target.get_internal_type())
        self.datetime = target.get_internal_type() == "DateTimeField"
        self.json = target.get_internal_type() == "JSONField" and target.encoder is None
        # Field.pre_save returns the attribute, and so do Django's date and datetime fields
        # without auto_now or auto_now_add; a field that does more (those, or one overriding
        # pre_save) is asked.
        reads = type(field).pre_save in _READING_PRE_SAVES and not (
            getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        )
        self.attname = field.attname if reads else ""

    def prep(self, value: Any, db: BaseDatabaseWrapper) -> Any:
        plain = self.plain
        if value is None and (plain is not None or self.datetime):
            return None
        if plain is str and isinstance(value, str):
            # Django hands a str subclass (a state or actor kind) back as it is; its characters
            # as a plain str are the same parameter, which the drivers adapt without looking up
            # the subclass (psycopg walks its classes for every statement).
            return str.__str__(value)
        if plain is not None and type(value) is plain:
            return value
        if self.datetime and type(value) is dt.datetime and value.utcoffset() is not None:
            return dbadapter.datetime_param(db, value)
        if self.json and (type(value) is dict or type(value) is list):
            return dbadapter.json_param(db, value)
        return self.field.get_db_prep_save(value, db)


@functools.cache
def _attempt_fields() -> tuple[_Column, ...]:
    return tuple(_Column(f) for f in Attempt._meta.concrete_fields if not f.primary_key)


@functools.cache
def _attempt_insert(returning: bool = True) -> str:
    """The attempt's INSERT, returning its id (PostgreSQL's statement needs it for the event),
    or not (SQLite's, whose cursor has the new row's id as ``lastrowid``: RETURNING costs
    SQLite a result to build and the driver a row to fetch)."""
    columns = ", ".join(c.name for c in _attempt_fields())
    return (
        f"INSERT INTO {_q(Attempt._meta.db_table)} ({columns}) "
        f"VALUES ({_marks(len(_attempt_fields()))})"
        + (f" RETURNING {_q('id')}" if returning else "")
    )


# What an intent writes to the permanent key index, and a move that first names a provider
# effect to the effects' index: one narrow row each, of plain text columns.
_KEY_COLUMNS = ("key_digest", "tenant_id", "tool_name", "args_hash", "attempt_id")
_EFFECT_COLUMNS = ("tool_name", "provider_request_id", "attempt_id")


@functools.cache
def _index_insert(model: type, columns: tuple[str, ...]) -> str:
    names = ", ".join(_q(model._meta.get_field(name).column) for name in columns)
    return f"INSERT INTO {_q(model._meta.db_table)} ({names})"


def _key_values(attempt: Attempt) -> list[str]:
    return [
        key_digest(attempt.idempotency_key),
        attempt.tenant_id,
        attempt.tool_name,
        attempt.args_hash,
        attempt.attempt_id,
    ]


@functools.cache
def _event_fields() -> tuple[_Column, ...]:
    return tuple(_Column(AttemptEvent._meta.get_field(name)) for name in EventRow._fields)


@functools.cache
def _event_insert(source: str, marks: str = "") -> str:
    """The event INSERT taking its attempt's id from the CTE ``source`` (PostgreSQL), or from
    the first parameter (``source`` empty); its values' placeholders are ``marks`` if given."""
    attempt = _q(AttemptEvent._meta.get_field("attempt").column)
    columns = ", ".join([attempt, *(c.name for c in _event_fields())])
    head = f"INSERT INTO {_q(AttemptEvent._meta.db_table)} ({columns})"
    marks = marks or _marks(len(_event_fields()))
    if source:
        return f"{head} SELECT {source}.{_q('id')}, {marks} FROM {source}"
    return f"{head} VALUES (%s, {marks})"


@functools.cache
def _attempt_field(name: str) -> _Column:
    field = Attempt._meta.get_field(name)
    if not field.concrete or field.primary_key:
        raise ValueError(f"{name!r} is not a column a move may set")
    return _Column(field)


@functools.cache
def _set_columns(names: tuple[str, ...]) -> tuple[_Column, ...]:
    return tuple(_attempt_field(name) for name in names)


@functools.cache
def _update(
    names: tuple[str, ...], increments: tuple[str, ...], granted: bool, unclaimed: int
) -> str:
    sets = [f"{_attempt_field(name).name} = %s" for name in names]
    for name in increments:
        column = _attempt_field(name).name
        sets.append(f"{column} = {column} + %s")
    return (
        f"UPDATE {_q(Attempt._meta.db_table)} SET {', '.join(sets)} "
        f"WHERE {_still(granted, unclaimed)}"
    )


@functools.cache
def _still(granted: bool, unclaimed: int) -> str:
    """The compare-and-set's condition on the attempt's row (its parameters: the id, the
    expected state and version, then ``_unclaimed``'s)."""
    return (
        f"{_q('id')} = %s AND {_q('state')} = %s AND {_q('version')} = %s"
        + (f" AND {_grant_covers()}" if granted else "")
        + (f" AND {_unclaimed(unclaimed)}" if unclaimed else "")
    )


@functools.cache
def _claim_while_still(granted: bool, unclaimed: int) -> str:
    """SQLite: the effects' index row of a move that claims an effect, inserted only while
    the attempt's row meets the compare-and-set's condition (its parameters: the effect's,
    then ``_still``'s)."""
    return (
        f"{_index_insert(ProviderEffect, _EFFECT_COLUMNS)} SELECT {_marks(len(_EFFECT_COLUMNS))} "
        f"WHERE EXISTS (SELECT 1 FROM {_q(Attempt._meta.db_table)} "
        f"WHERE {_still(granted, unclaimed)})"
    )


@functools.cache
def _unclaimed(names: int) -> str:
    """The compare-and-set's check that no other attempt claimed a provider effect of the
    attempt's tool named by any of ``names`` ids (its parameters: the tool, the ids, the
    attempt's public id): the effects' unique index answers it."""
    effect = ProviderEffect._meta
    return (
        f"NOT EXISTS (SELECT 1 FROM {_q(effect.db_table)} e "
        f"WHERE e.{_q('tool_name')} = %s AND e.{_q('provider_request_id')} IN ({_marks(names)}) "
        f"AND e.{_q('attempt_id')} <> %s)"
    )


def _prepared(columns: tuple[_Column, ...], values: Any, db: BaseDatabaseWrapper) -> list[Any]:
    """``values`` prepared for ``columns``: a value of exactly its column's plain type goes as
    it is without a call per value (most of them), the rest through ``_Column.prep``."""
    return [
        value if type(value) is column.plain else column.prep(value, db)
        for column, value in zip(columns, values, strict=True)
    ]


def _event_values(event: EventRow, db: BaseDatabaseWrapper) -> list[Any]:
    return _prepared(_event_fields(), event, db)


# ---------------------------------------------------------------------------------------------
# Writes


def _atomic(db: BaseDatabaseWrapper, statements: int) -> contextlib.AbstractContextManager:
    """What makes a write of ``statements`` statements atomic: the caller's transaction if it
    holds one, the statement itself if it is one, else a transaction of its own."""
    if dbadapter.in_atomic_block(db):
        return contextlib.nullcontext()
    if statements == 1:
        return lock_errors()
    return sqlite_transaction(db) if db.vendor == "sqlite" else write_transaction()


def insert_attempt(
    attempt: Attempt, event: EventRow, *, terms: tuple[str, list[str], bool] | None = None
) -> bool:
    """Insert a new attempt with its first event and its key's row in the permanent key index
    (``RecordedKey``), and set the attempt's primary key. The index's primary key raises
    IntegrityError for a key ever recorded, its attempt live or archived (the attempts' own
    unique index also does while the attempt is live).

    ``terms`` (policy version, allowed scopes, whether an approval policy is active: what
    ``grant_terms`` read earlier for the attempt's tenant and tool): the insert is made only
    while they are still the grant's terms (``_terms_still``), checked in the same statement
    (PostgreSQL) or transaction; False when they are not, and nothing was written."""
    db = _db()
    key_values = _key_values(attempt)
    columns = _attempt_fields()
    saved = [
        getattr(attempt, c.attname) if c.attname else c.field.pre_save(attempt, True)
        for c in columns
    ]
    values = _prepared(columns, saved, db)
    event_values = _event_values(event, db)
    check = _terms_params(attempt, terms, db) if terms is not None else None
    # A savepoint when nested: a key already recorded (IntegrityError) must not abort the
    # caller's transaction.
    nested = write_transaction() if dbadapter.in_atomic_block(db) else None
    if db.vendor == "postgresql":
        # One statement: the key's index row, the attempt and its event (and the terms' check).
        if check is None:
            sql, params = _intent_statement(), key_values + values + event_values
        else:
            sql, params = (
                _checked_intent_statement(),
                _checked_params(key_values, check, values, event_values),
            )
        with nested or lock_errors(), _cursor(db) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return False
        attempt.pk = row[0]
    else:
        with nested or _atomic(db, 3), _cursor(db) as cursor:
            if check is None:
                cursor.execute(_key_insert(), key_values)
            else:
                # The key's row is written only while the terms hold: their check and the key
                # in one statement, as on PostgreSQL; nothing else is written when they do not.
                cursor.execute(_key_insert_while_terms_hold(), key_values + check)
                if cursor.rowcount != 1:
                    return False
            cursor.execute(_attempt_insert(returning=False), values)
            attempt.pk = cursor.lastrowid
            cursor.execute(_event_insert(""), [attempt.pk, *event_values])
    attempt._state.adding = False
    attempt._state.db = db.alias
    return True


@functools.cache
def _key_insert() -> str:
    """SQLite: the key's row in the permanent key index."""
    return f"{_index_insert(RecordedKey, _KEY_COLUMNS)} VALUES ({_marks(len(_KEY_COLUMNS))})"


@functools.cache
def _key_insert_while_terms_hold() -> str:
    """SQLite: the key's row, inserted only while the grant's terms hold (``_terms_still``; its
    parameters: the key's, then ``_terms_params``)."""
    return (
        f"{_index_insert(RecordedKey, _KEY_COLUMNS)} SELECT {_marks(len(_KEY_COLUMNS))} "
        f"WHERE {_terms_still()}"
    )


@functools.cache
def _intent_statement() -> str:
    """PostgreSQL's one statement of an intent."""
    return (
        f"WITH k AS ({_index_insert(RecordedKey, _KEY_COLUMNS)} "
        f"VALUES ({_marks(len(_KEY_COLUMNS))})), "
        f"new AS ({_attempt_insert()}) {_event_insert('new')} RETURNING attempt_id"
    )


@functools.cache
def _checked_intent_statement() -> str:
    """``_intent_statement`` whose rows are written only while the grant's terms hold
    (``_terms_still``). Its parameters are named (``_checked_params``), each value sent once:
    psycopg parses a statement of more than 50 parameters anew at every execution."""
    names = _checked_names()
    count = len(_attempt_fields())
    attempt = {c.field.attname: f"%({names[i]})s" for i, c in enumerate(_attempt_fields())}
    key = ["%(key)s", *(attempt[name] for name in _KEY_COLUMNS[1:])]
    event = ", ".join(f"%({name})s" for name in names[count:])
    still = _terms_still(
        attempt["tenant_id"], attempt["tool_name"], "%(version)s", "%(scopes)s", "%(policies)s"
    )
    return (
        f"WITH ok AS (SELECT 1 WHERE {still}), "
        f"k AS ({_index_insert(RecordedKey, _KEY_COLUMNS)} SELECT {', '.join(key)} FROM ok), "
        f"new AS (INSERT INTO {_q(Attempt._meta.db_table)} "
        f"({', '.join(c.name for c in _attempt_fields())}) "
        f"SELECT {', '.join(attempt.values())} FROM ok RETURNING {_q('id')}) "
        f"{_event_insert('new', event)} RETURNING attempt_id"
    )


def _checked_params(
    key_values: list[Any], check: list[Any], values: list[Any], event_values: list[Any]
) -> dict[str, Any]:
    """The named parameters of ``_checked_intent_statement``: the key's digest (the key
    index's other columns are the attempt's own), the terms' (``_terms_params``; tenant and
    tool are the attempt's), the attempt's values and the event's."""
    params = dict(zip(_checked_names(), [*values, *event_values], strict=True))
    params.update(key=key_values[0], version=check[2], scopes=check[3], policies=check[4])
    return params


@functools.cache
def _checked_names() -> tuple[str, ...]:
    """The names of ``_checked_intent_statement``'s attempt and event parameters, in the order
    of their values: each name made once, not formatted again for every intent."""
    return (
        *(f"a{i}" for i in range(len(_attempt_fields()))),
        *(f"e{i}" for i in range(len(_event_fields()))),
    )


def compare_and_set(
    pk: int,
    *,
    state: str,
    version: int,
    values: Mapping[str, Any],
    increments: Mapping[str, int],
    event: EventRow,
    granted: bool = False,
    effect: tuple[str, str, str] | None = None,
    unclaimed: tuple[str, tuple[str, ...], str] | None = None,
) -> bool:
    """Set ``values`` and add ``increments`` on attempt ``pk`` and append ``event``, if the
    attempt is still in ``state`` at ``version`` (and, with ``granted``, its grant still
    covers it: ``_grant_covers``; with ``unclaimed`` (tool name, provider request ids, the
    attempt's public id), no other attempt has claimed any of those effects). Returns whether
    it was (False: someone else changed it first, the grant no longer covers it or an effect
    is claimed, and nothing was written).

    ``effect`` (tool name, provider request id, attempt id): the move claims that provider
    effect for the attempt in the effects' index, in the same statement (PostgreSQL) or
    transaction. An effect another attempt claimed raises IntegrityError (its unique
    constraint) and nothing is written; the caller's transaction stays usable."""
    db = _db()
    names = tuple(values)
    checks = (granted, len(unclaimed[1]) if unclaimed else 0)
    update = _update(names, tuple(increments), *checks)
    params = _prepared(_set_columns(names), values.values(), db)
    params += [int(amount) for amount in increments.values()]
    still = [pk, state, version]
    if unclaimed:
        tool_name, ids, attempt_id = unclaimed
        still += [tool_name, *ids, attempt_id]
    params += still
    event_values = _event_values(event, db)
    if effect is not None and db.vendor == "sqlite":
        return _compare_and_set_claiming_sqlite(
            db, pk, (update, params), (_claim_while_still(*checks), [*effect, *still]), event_values
        )
    if effect is not None:
        return _compare_and_set_claiming(db, update, params, event_values, list(effect))
    if db.vendor == "postgresql":
        with _atomic(db, 1), _cursor(db) as cursor:
            cursor.execute(_move_statement(update), params + event_values)
            return cursor.rowcount == 1
    with _atomic(db, 2), _cursor(db) as cursor:
        cursor.execute(update, params)
        if cursor.rowcount != 1:
            return False
        cursor.execute(_event_insert(""), [pk, *event_values])
        return True


@functools.cache
def _move_statement(update: str) -> str:
    """PostgreSQL's one statement of a move: ``update`` and the event's ``INSERT`` (one text
    object for each ``update``, so the driver's cursor for it keeps its adaptation state)."""
    return f"WITH moved AS ({update} RETURNING {_q('id')}) {_event_insert('moved')}"


def _compare_and_set_claiming(
    db: BaseDatabaseWrapper,
    update: str,
    params: list[Any],
    event_values: list[Any],
    effect: list[str],
) -> bool:
    """PostgreSQL: the move, its effect's index row and its event in one statement, in a
    savepoint when nested (an effect another attempt claimed fails the statement, and
    PostgreSQL goes on in no transaction after an error)."""
    claim = _index_insert(ProviderEffect, _EFFECT_COLUMNS)
    sql = (
        f"WITH moved AS ({update} RETURNING {_q('id')}), "
        f"claimed AS ({claim} SELECT {_marks(len(effect))} FROM moved) "
        f"{_event_insert('moved')}"
    )
    nested = write_transaction() if dbadapter.in_atomic_block(db) else None
    with nested or lock_errors(), _cursor(db) as cursor:
        cursor.execute(sql, params + effect + event_values)
        return cursor.rowcount == 1


def _compare_and_set_claiming_sqlite(
    db: BaseDatabaseWrapper,
    pk: int,
    update: tuple[str, list[Any]],
    claim: tuple[str, list[Any]],
    event_values: list[Any],
) -> bool:
    """SQLite: the effect's index row first, only while the attempt is as the move expects
    (``_claim_while_still``), then the move and its event. An effect already claimed fails that
    first statement, which SQLite undoes alone: nothing is written and the caller's transaction
    goes on, with no savepoint around the three. From that statement on this transaction holds
    the database's one write lock, so the attempt is still as expected for the UPDATE."""
    with _atomic(db, 3), _cursor(db) as cursor:
        cursor.execute(*claim)
        if cursor.rowcount != 1:
            return False
        cursor.execute(*update)
        if cursor.rowcount != 1:
            raise RuntimeError(
                f"attempt {pk} changed inside the write transaction that holds SQLite's lock"
            )
        cursor.execute(_event_insert(""), [pk, *event_values])
        return True


# ---------------------------------------------------------------------------------------------
# Leases

# Candidates per lease UPDATE: their (id, version) pairs are two parameters each, well under
# every backend's limit on parameters and on the depth of an expression.
LEASE_CHUNK = 100


@functools.cache
def _lease_update(count: int) -> str:
    pairs = " OR ".join([f"({_q('id')} = %s AND {_q('version')} = %s)"] * count)
    until = _q("lease_until")
    return (
        f"UPDATE {_q(Attempt._meta.db_table)} SET {_q('lease_owner')} = %s, {until} = %s, "
        f"{_q('version')} = {_q('version')} + 1 "
        f"WHERE ({until} IS NULL OR {until} < %s) AND ({pairs}) RETURNING {_q('id')}"
    )


def claim_leases(
    candidates: list[tuple[int, int]], *, owner: str, until: dt.datetime, now: dt.datetime
) -> set[int]:
    """Lease each candidate (id, version) whose lease is free at ``now`` and whose version is
    unchanged to ``owner`` until ``until``, bumping its version: per row the compare-and-set of
    ``states.claim_lease``, a hundred rows a statement. Returns the ids leased."""
    db = _db()
    column = _attempt_field("lease_until")
    times = [column.prep(until, db), column.prep(now, db)]
    claimed: set[int] = set()
    for start in range(0, len(candidates), LEASE_CHUNK):
        chunk = candidates[start : start + LEASE_CHUNK]
        params: list[Any] = [owner, *times]
        for pk, version in chunk:
            params += [pk, version]
        with _cursor(db) as cursor:
            cursor.execute(_lease_update(len(chunk)), params)
            claimed.update(row[0] for row in cursor.fetchall())
    return claimed


# ---------------------------------------------------------------------------------------------
# The grant read


@functools.cache
def _terms_select(tool_active: bool) -> str:
    grant, tool = Grant._meta, Tool._meta
    tenant_col, tool_col = grant.get_field("tenant").column, grant.get_field("tool").column
    sql = f"SELECT g.{_q('policy_version')}, g.{_q('allowed_scopes')}"
    if tool_active:
        # New intents also learn whether any approval policy is active for the tool (its
        # index answers), so an intent no policy could hold spends no query on policies.
        policy = ApprovalPolicy._meta
        sql += (
            f", EXISTS (SELECT 1 FROM {_q(policy.db_table)} p "
            f"WHERE p.{_q(policy.get_field('tool').column)} = g.{_q(tool_col)} "
            f"AND p.{_q('active')})"
        )
    sql += f" FROM {_q(grant.db_table)} g "
    if tool_active:
        sql += (
            f"JOIN {_q(tool.db_table)} t "
            f"ON t.{_q(tool.pk.column)} = g.{_q(tool_col)} AND t.{_q('active')} "
        )
    return sql + (
        f"WHERE g.{_q(tenant_col)} = %s AND g.{_q(tool_col)} = %s AND g.{_q('active')} "
        f"ORDER BY g.{_q(grant.pk.column)} LIMIT 1"
    )


@functools.cache
def _grant_covers() -> str:
    """The claim's grant check inside its compare-and-set, the SQL form of
    ``authority.authority_holds``: the tenant's grant for the attempt's tool is active, at the
    attempt's policy version, and allows every scope the attempt was recorded with. (One grant
    per tenant and tool: ``grant_unique_tenant_tool``.)"""
    attempt, grant = Attempt._meta, Grant._meta
    a = _q(attempt.db_table)
    scopes = f"{a}.{_q(attempt.get_field('credential_scope').column)}"
    allowed = f"g.{_q(grant.get_field('allowed_scopes').column)}"
    if _db().vendor == "postgresql":
        covered = f"{scopes} <@ {allowed}"  # jsonb containment: every element is in allowed
    else:
        covered = (
            f"NOT EXISTS (SELECT 1 FROM json_each({scopes}) s "
            f"WHERE s.value NOT IN (SELECT value FROM json_each({allowed})))"
        )
    return (
        f"EXISTS (SELECT 1 FROM {_q(grant.db_table)} g "
        f"WHERE g.{_q(grant.get_field('tenant').column)} = "
        f"{a}.{_q(attempt.get_field('tenant').column)} "
        f"AND g.{_q(grant.get_field('tool').column)} = "
        f"{a}.{_q(attempt.get_field('tool_name').column)} "
        f"AND g.{_q('active')} "
        f"AND g.{_q('policy_version')} = {a}.{_q('policy_version')} AND {covered})"
    )


@functools.cache
def _terms_still(
    tenant: str = "%s", tool: str = "%s", version: str = "%s", scopes: str = "%s", flag: str = "%s"
) -> str:
    """Whether the tenant's grant for a tool still has the terms an intent was built with:
    active, with the tool active, at that policy version and those allowed scopes, and an
    approval policy active for the tool exactly when one was (``_terms_select`` asked with
    ``tool_active``, as a condition). Its placeholders: tenant, tool, policy version, allowed
    scopes, whether a policy was active."""
    grant, tool_meta, policy = Grant._meta, Tool._meta, ApprovalPolicy._meta
    tool_col = _q(grant.get_field("tool").column)
    allowed = f"g.{_q(grant.get_field('allowed_scopes').column)}"
    same_scopes = (
        f"{allowed} = {scopes}"
        if _db().vendor == "postgresql"
        else f"json({allowed}) = json({scopes})"
    )
    return (
        f"EXISTS (SELECT 1 FROM {_q(grant.db_table)} g JOIN {_q(tool_meta.db_table)} t "
        f"ON t.{_q(tool_meta.pk.column)} = g.{tool_col} AND t.{_q('active')} "
        f"WHERE g.{_q(grant.get_field('tenant').column)} = {tenant} AND g.{tool_col} = {tool} "
        f"AND g.{_q('active')} AND g.{_q('policy_version')} = {version} AND {same_scopes} "
        f"AND EXISTS (SELECT 1 FROM {_q(policy.db_table)} p "
        f"WHERE p.{_q(policy.get_field('tool').column)} = g.{tool_col} "
        f"AND p.{_q('active')}) = {flag})"
    )


def _terms_params(
    attempt: Attempt, terms: tuple[str, list[str], bool], db: BaseDatabaseWrapper
) -> list[Any]:
    version, scopes, policies = terms
    scopes_value = _allowed_scopes().prep(list(scopes), db)
    return [attempt.tenant_id, attempt.tool_name, version, scopes_value, bool(policies)]


@functools.cache
def _allowed_scopes() -> _Column:
    return _Column(Grant._meta.get_field("allowed_scopes"))


def grant_terms(
    tenant: str, tool_name: str, *, tool_active: bool
) -> tuple[str, list[str], bool] | None:
    """(policy version, allowed scopes, whether an approval policy is active for the tool) of
    the tenant's active grant for the tool, or None; with ``tool_active``, only while the tool
    is active too (the third value is read only then, else False)."""
    db = _db()
    with _cursor(db) as cursor:
        cursor.execute(_terms_select(tool_active), [tenant, tool_name])
        row = cursor.fetchone()
    if row is None:
        return None
    scopes = Grant._meta.get_field("allowed_scopes").from_db_value(row[1], None, db)
    return row[0], scopes, bool(row[2]) if tool_active else False


# ---------------------------------------------------------------------------------------------
# The token lookup


@functools.cache
def _token_select() -> str:
    # One statement rather than the ORM's many-to-many machinery, which was a large share of an
    # intent's CPU (docs/scaling.md).
    # The issuer's username comes with it (a recorder of what the token records), in the same
    # statement: an intent costs no extra query for it.
    token = AgentToken._meta
    through = AgentToken.tenants.through._meta
    people = token.get_field("created_by").related_model._meta
    username = people.get_field(people.model.USERNAME_FIELD).column
    return (
        f"SELECT t.id, t.name, m.tenant_id, "  # noqa: S608 (table names, not input)
        f"CASE WHEN t.last_used_at IS NOT NULL AND t.last_used_at > %s THEN 1 ELSE 0 END, "
        f"u.{_q(username)} "
        f"FROM {token.db_table} t LEFT JOIN {through.db_table} m ON m.agenttoken_id = t.id "
        f"LEFT JOIN {people.db_table} u ON u.{_q(people.pk.column)} = t.created_by_id "
        f"WHERE t.token_hash = %s AND t.revoked_at IS NULL"
    )


def live_token_rows(token_hash: str, *, used_after: dt.datetime) -> list[tuple[Any, ...]]:
    """(token id, name, tenant slug or None, whether its use was recorded after ``used_after``,
    the issuer's username or None) for the live (not revoked) token whose hash is ``token_hash``: one row per tenant (one row
    with no tenant when it has none), no row for no such token."""
    db = _db()
    with _cursor(db) as cursor:
        cursor.execute(_token_select(), [dbadapter.datetime_param(db, used_after), token_hash])
        return cursor.fetchall()


# ---------------------------------------------------------------------------------------------
# The planner's row estimate


def planned_rows(queryset: Any) -> int:
    """PostgreSQL's planner estimate of how many rows ``queryset`` returns (``EXPLAIN``, which
    reads no rows); 0 for a queryset that can match nothing."""
    try:
        sql, params = dbadapter.sql_with_params(queryset)
    except EmptyResultSet:
        return 0
    with _db().cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])
