"""Database triggers that make history append-only: UPDATE, DELETE (and TRUNCATE on PostgreSQL)
of attempt events, configuration changes, checkpoints and their leaves are refused by the
database itself, whoever asks.

The one home of the trigger SQL: the migrations that create history tables install their
guards from here (``statements``), as do tests that drop them on purpose and put them back.
Nothing re-installs them behind a migration's back: a check (``attempts.E003``, with
``check --database default`` and at the worker's start) says when one is missing.
"""

from __future__ import annotations

TABLES = (
    "attempts_attemptevent",
    "attempts_configevent",
    "attempts_checkpoint",
    "attempts_checkpointleaf",
    "attempts_logentry",
    "attempts_lognode",
    "attempts_checkpointsignature",
)


def _short(table: str) -> str:
    return table.removeprefix("attempts_")


def _sqlite_install(table: str) -> list[str]:
    name = _short(table)
    return [
        f"""CREATE TRIGGER IF NOT EXISTS {name}_no_update BEFORE UPDATE ON {table}
            BEGIN SELECT RAISE(ABORT, 'audit history is append-only: UPDATE refused'); END""",
        f"""CREATE TRIGGER IF NOT EXISTS {name}_no_delete BEFORE DELETE ON {table}
            BEGIN SELECT RAISE(ABORT, 'audit history is append-only: DELETE refused'); END""",
    ]


def _sqlite_remove(table: str) -> list[str]:
    name = _short(table)
    return [f"DROP TRIGGER IF EXISTS {name}_no_update", f"DROP TRIGGER IF EXISTS {name}_no_delete"]


_PG_FUNCTION = """CREATE OR REPLACE FUNCTION ledger_refuse_history_change() RETURNS trigger AS $$
   BEGIN
     RAISE EXCEPTION 'audit history is append-only: % refused', TG_OP
       USING ERRCODE = 'insufficient_privilege';
   END; $$ LANGUAGE plpgsql"""


def _pg_install(table: str) -> list[str]:
    name = _short(table)
    return [
        f"""CREATE OR REPLACE TRIGGER {name}_append_only BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION ledger_refuse_history_change()""",
        f"""CREATE OR REPLACE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_history_change()""",
    ]


def _pg_remove(table: str) -> list[str]:
    name = _short(table)
    return [
        f"DROP TRIGGER IF EXISTS {name}_no_truncate ON {table}",
        f"DROP TRIGGER IF EXISTS {name}_append_only ON {table}",
    ]


def statements(vendor: str, tables: tuple[str, ...] = TABLES, *, install: bool = True) -> list[str]:
    """The SQL that installs (or removes) the guards of ``tables`` on a database of ``vendor``;
    none of it takes parameters (the PostgreSQL function's ``%`` belongs to RAISE)."""
    if vendor == "sqlite":
        make = _sqlite_install if install else _sqlite_remove
    elif vendor == "postgresql":
        make = _pg_install if install else _pg_remove
    else:
        return []
    head = [_PG_FUNCTION] if vendor == "postgresql" and install else []
    return head + [statement for table in tables for statement in make(table)]


def install_in_migration(tables: tuple[str, ...], *, created: bool = True):
    """A migration operation that installs the guards of ``tables``: ones it created (removed
    again on the way back), or, with ``created=False``, guarded tables an earlier operation of
    the migration rebuilt (SQLite remakes a table for most changes of its columns, and the
    new table has no triggers until they are installed again)."""
    from django.db import migrations

    def forwards(apps, schema_editor):
        for statement in statements(schema_editor.connection.vendor, tables):
            schema_editor.execute(statement, None)

    def backwards(apps, schema_editor):
        if not created:
            return  # not ours to remove (check attempts.E003 tells of a table rebuilt back)
        for statement in statements(schema_editor.connection.vendor, tables, install=False):
            schema_editor.execute(statement, None)

    return migrations.RunPython(forwards, backwards)


def _run(connection, install: bool) -> None:
    existing = set(connection.introspection.table_names())
    tables = tuple(table for table in TABLES if table in existing)
    with connection.cursor() as cursor:
        for statement in statements(connection.vendor, tables, install=install):
            cursor.execute(statement)


def install(connection) -> None:
    """Put the guards of every existing history table in place (after a test removed them)."""
    _run(connection, install=True)


def remove(connection) -> None:
    """Drop the guards. Only for test teardown (flush) and deliberate tamper tests."""
    _run(connection, install=False)


def unguarded(connection) -> list[str]:
    """The existing history tables that lack one of their guards."""
    existing = set(connection.introspection.table_names())
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
