"""Database triggers that make history append-only: UPDATE, DELETE (and TRUNCATE on PostgreSQL)
of attempt events, approvals, configuration changes, checkpoints and their leaves are refused by
the database itself, whoever asks.

One exception, for retention (reconciliation/archive): the events of an attempt listed in
``attempts_archivedattempt`` (written to an archive, in the transaction that removes it) may be
deleted; any other DELETE of an event is still refused, and the listing itself is append-only.
And one exception for erasure (attempts/erasure.py): a format-3 event's free text may be replaced
by the erasure marker, every column its hash covers unchanged.

The one home of the trigger SQL: the migrations that create or rebuild history tables install
their guards from here (``install_in_migration``, ``install``), as do tests that drop them on
purpose and put them back. Nothing re-installs them behind a migration's back: a check
(``attempts.E003``, with ``check --database default`` and at the worker's start) says when one is
missing. The events' exceptions follow the schema the guards are installed on (the archived
list, the erasable text), so the same code is right at every migration.
"""

from __future__ import annotations

from attempts import dbadapter

TABLES = (
    "attempts_attemptevent",
    # An approval is never changed: a void one stays, and a new one is a new row.
    "attempts_approval",
    "attempts_configevent",
    "attempts_checkpoint",
    "attempts_checkpointleaf",
    "attempts_logentry",
    "attempts_lognode",
    "attempts_checkpointsignature",
    "attempts_archive",
    "attempts_archivedattempt",
    # The permanent indexes of keys and provider effects: a removed row would let a key take
    # effect twice, or an effect confirm two attempts.
    "attempts_recordedkey",
    "attempts_providereffect",
)

# The one DELETE history allows: the events of an attempt that ``ledgerweb archive run`` wrote
# to an archive and listed in this table, in the same transaction (reconciliation/archive).
EVENTS = "attempts_attemptevent"
ARCHIVED = "attempts_archivedattempt"
_ARCHIVED_ROW = f"EXISTS (SELECT 1 FROM {ARCHIVED} WHERE row_id = OLD.attempt_id)"  # noqa: S608
# The one UPDATE of an event the guards let through: erasure of a format-3 event's free text
# (attempts/erasure.py). Everything its hash covers stays, the text its salted digest
# committed to becomes the marker; the details it keeps are checked by the hash itself.
ERASED_TEXT = "[erased]"
_REDACTION = f"""OLD.chain_format >= 3 AND NEW.chain_format = OLD.chain_format
    AND NEW.id = OLD.id AND NEW.attempt_id = OLD.attempt_id AND NEW.action = OLD.action
    AND NEW.actor_kind = OLD.actor_kind AND NEW.actor = OLD.actor
    AND NEW.from_state = OLD.from_state AND NEW.to_state = OLD.to_state
    AND NEW.created_at = OLD.created_at AND NEW.prev_hash = OLD.prev_hash
    AND NEW.hash = OLD.hash AND NEW.text_digest = OLD.text_digest
    AND NEW.reason = '{ERASED_TEXT}'"""


def _short(table: str) -> str:
    return table.removeprefix("attempts_")


def _sqlite_install(table: str, *, archived: bool, redaction: bool) -> list[str]:
    name = _short(table)
    update = f"""BEFORE UPDATE ON {table}
            BEGIN SELECT RAISE(ABORT, 'audit history is append-only: UPDATE refused'); END"""
    delete = f"""BEFORE DELETE ON {table}
            BEGIN SELECT RAISE(ABORT, 'audit history is append-only: DELETE refused'); END"""
    if table != EVENTS:
        return [
            f"CREATE TRIGGER IF NOT EXISTS {name}_no_update {update}",
            f"CREATE TRIGGER IF NOT EXISTS {name}_no_delete {delete}",
        ]
    # The events' triggers are replaced, not kept: their exceptions follow the schema (the
    # archived list, the erasable text), migrating forward or back.
    update_when = f"WHEN NOT ({_REDACTION})" if redaction else ""
    delete_when = f"WHEN NOT {_ARCHIVED_ROW}" if archived else ""
    return [
        f"DROP TRIGGER IF EXISTS {name}_no_update",
        f"DROP TRIGGER IF EXISTS {name}_no_delete",
        f"CREATE TRIGGER {name}_no_update {update.replace('BEGIN', update_when + ' BEGIN', 1)}",
        f"CREATE TRIGGER {name}_no_delete {delete.replace('BEGIN', delete_when + ' BEGIN', 1)}",
    ]


def _sqlite_remove(table: str) -> list[str]:
    name = _short(table)
    return [f"DROP TRIGGER IF EXISTS {name}_no_update", f"DROP TRIGGER IF EXISTS {name}_no_delete"]


_PG_FUNCTION = """CREATE OR REPLACE FUNCTION ledger_refuse_history_change() RETURNS trigger AS $$
   BEGIN
     RAISE EXCEPTION 'audit history is append-only: % refused', TG_OP
       USING ERRCODE = 'insufficient_privilege';
   END; $$ LANGUAGE plpgsql"""


def _pg_event_function(*, archived: bool, redaction: bool) -> str:
    allowed = ""
    if archived:
        allowed += f"""
     IF TG_OP = 'DELETE' AND {_ARCHIVED_ROW} THEN
       RETURN OLD;
     END IF;"""
    if redaction:
        allowed += f"""
     IF TG_OP = 'UPDATE' AND {_REDACTION} THEN
       RETURN NEW;
     END IF;"""
    return f"""CREATE OR REPLACE FUNCTION ledger_refuse_event_change() RETURNS trigger
   AS $$
   BEGIN{allowed}
     RAISE EXCEPTION 'audit history is append-only: % refused', TG_OP
       USING ERRCODE = 'insufficient_privilege';
   END; $$ LANGUAGE plpgsql"""


def _pg_install(table: str, *, exceptions: bool) -> list[str]:
    name = _short(table)
    function = (
        "ledger_refuse_event_change"
        if table == EVENTS and exceptions
        else "ledger_refuse_history_change"
    )
    return [
        f"""CREATE OR REPLACE TRIGGER {name}_append_only BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION {function}()""",
        f"""CREATE OR REPLACE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_history_change()""",
    ]


def _pg_remove(table: str) -> list[str]:
    name = _short(table)
    return [
        f"DROP TRIGGER IF EXISTS {name}_no_truncate ON {table}",
        f"DROP TRIGGER IF EXISTS {name}_append_only ON {table}",
    ]


def _exceptions(connection, existing: set[str]) -> tuple[bool, bool]:
    """(archived, redaction): whether the events' guard lets the archiver's DELETE and the
    erasure's UPDATE through, from the schema (a schema from before archives or erasure, migrated
    back or not yet forward, has no archived list or no text_digest column)."""
    archived = ARCHIVED in existing
    redaction = False
    if EVENTS in existing:
        redaction = "text_digest" in dbadapter.column_names(connection, EVENTS)
    return archived, redaction


def statements(
    vendor: str,
    tables: tuple[str, ...] = TABLES,
    *,
    install: bool = True,
    archived: bool = False,
    redaction: bool = False,
) -> list[str]:
    """The SQL that installs (or removes) the guards of ``tables`` on a database of ``vendor``,
    with the events' exceptions (``_exceptions``); none of it takes parameters (the PostgreSQL
    functions' ``%`` belongs to RAISE)."""
    if vendor == "sqlite":
        if not install:
            return [sql for table in tables for sql in _sqlite_remove(table)]
        return [
            sql
            for table in tables
            for sql in _sqlite_install(table, archived=archived, redaction=redaction)
        ]
    if vendor != "postgresql":
        return []
    if not install:
        return [sql for table in tables for sql in _pg_remove(table)]
    head = [_PG_FUNCTION]
    exceptions = archived or redaction
    if exceptions and EVENTS in tables:
        head.append(_pg_event_function(archived=archived, redaction=redaction))
    return head + [sql for table in tables for sql in _pg_install(table, exceptions=exceptions)]


def install_in_migration(tables: tuple[str, ...], *, created: bool = True):
    """A migration operation that installs the guards of ``tables``: ones it created (removed
    again on the way back), or, with ``created=False``, guarded tables an earlier operation of
    the migration rebuilt (SQLite remakes a table for most changes of its columns, and the
    new table has no triggers until they are installed again)."""
    from django.db import migrations

    def forwards(apps, schema_editor):
        connection = schema_editor.connection
        existing = set(dbadapter.table_names(connection))
        archived, redaction = _exceptions(connection, existing)
        sql = statements(connection.vendor, tables, archived=archived, redaction=redaction)
        for statement in sql:
            schema_editor.execute(statement, None)

    def backwards(apps, schema_editor):
        if not created:
            return  # not ours to remove (check attempts.E003 tells of a table rebuilt back)
        for statement in statements(schema_editor.connection.vendor, tables, install=False):
            schema_editor.execute(statement, None)

    return migrations.RunPython(forwards, backwards)


def _run(connection, install: bool, *, without_archives: bool = False) -> None:
    existing = set(dbadapter.table_names(connection))
    if without_archives:
        existing -= {"attempts_archive", ARCHIVED}
    tables = tuple(table for table in TABLES if table in existing)
    archived, redaction = _exceptions(connection, existing)
    sql = statements(
        connection.vendor, tables, install=install, archived=archived, redaction=redaction
    )
    with connection.cursor() as cursor:
        for statement in sql:
            cursor.execute(statement)


def install(connection, *, without_archives: bool = False) -> None:
    """Install every guard. ``without_archives``: as before archives existed (the events'
    DELETE refused outright), for migrating back past them."""
    _run(connection, install=True, without_archives=without_archives)


def remove(connection) -> None:
    """Drop the guards. Only for test teardown (flush) and deliberate tamper tests."""
    _run(connection, install=False)


def unguarded(connection) -> list[str]:
    """The existing history tables that lack one of their guards."""
    existing = set(dbadapter.table_names(connection))
    missing = []
    with connection.cursor() as cursor:
        for table in TABLES:
            if table not in existing:
                continue
            if connection.vendor == "sqlite":
                cursor.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type='trigger' AND tbl_name=%s",
                    [table],
                )
            else:
                cursor.execute(
                    "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
                    "AND NOT tgisinternal",
                    [table],
                )
            if cursor.fetchone()[0] != 2:
                missing.append(table)
    return missing


def installed(connection) -> bool:
    """Whether every existing history table has both of its guards."""
    return not unguarded(connection)
