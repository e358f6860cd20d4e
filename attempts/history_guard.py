"""Database triggers that make history append-only: UPDATE, DELETE (and TRUNCATE on PostgreSQL)
of attempt events are refused by the database itself, whoever asks.

Installed by migration 0002 and re-installed after every ``migrate`` or ``flush`` (post_migrate),
so a database can never be left without them by the tools we ship.
"""

from __future__ import annotations

TABLE = "attempts_attemptevent"

_SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS attemptevent_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'attempt history is append-only: UPDATE refused'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS attemptevent_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'attempt history is append-only: DELETE refused'); END""",
]
_SQLITE_REMOVE = [
    "DROP TRIGGER IF EXISTS attemptevent_no_update",
    "DROP TRIGGER IF EXISTS attemptevent_no_delete",
]
_PG_INSTALL = [
    """CREATE OR REPLACE FUNCTION ledger_refuse_history_change() RETURNS trigger AS $$
       BEGIN
         RAISE EXCEPTION 'attempt history is append-only: % refused', TG_OP
           USING ERRCODE = 'insufficient_privilege';
       END; $$ LANGUAGE plpgsql""",
    f"""CREATE OR REPLACE TRIGGER attemptevent_append_only BEFORE UPDATE OR DELETE ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION ledger_refuse_history_change()""",
    f"""CREATE OR REPLACE TRIGGER attemptevent_no_truncate BEFORE TRUNCATE ON {TABLE}
        FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_history_change()""",
]
_PG_REMOVE = [
    f"DROP TRIGGER IF EXISTS attemptevent_no_truncate ON {TABLE}",
    f"DROP TRIGGER IF EXISTS attemptevent_append_only ON {TABLE}",
]


def _run(connection, statements: dict[str, list[str]]) -> None:
    sql = statements.get(connection.vendor, [])
    if not sql or TABLE not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        for statement in sql:
            cursor.execute(statement)


def install(connection) -> None:
    _run(connection, {"sqlite": _SQLITE_INSTALL, "postgresql": _PG_INSTALL})


def remove(connection) -> None:
    """Drop the guards. Only for test teardown (flush) and deliberate tamper tests."""
    _run(connection, {"sqlite": _SQLITE_REMOVE, "postgresql": _PG_REMOVE})


def installed(connection) -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='trigger' AND tbl_name=%s", [TABLE]
            )
            return cursor.fetchone()[0] == 2
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            [TABLE],
        )
        return cursor.fetchone()[0] == 2
