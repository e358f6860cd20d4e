"""Database triggers that make history append-only: UPDATE, DELETE (and TRUNCATE on PostgreSQL)
of attempt events, approvals, configuration changes, checkpoints and their leaves are refused by
the database itself, whoever asks.

Installed by migration 0002 and re-installed after every ``migrate`` or ``flush`` (post_migrate),
so a database can never be left without them by the tools we ship.
"""

from __future__ import annotations

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


def _run(connection, install: bool) -> None:
    existing = set(connection.introspection.table_names())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and install:
            cursor.execute(_PG_FUNCTION)
        for table in TABLES:
            if table not in existing:
                continue
            if connection.vendor == "sqlite":
                statements = _sqlite_install(table) if install else _sqlite_remove(table)
            elif connection.vendor == "postgresql":
                statements = _pg_install(table) if install else _pg_remove(table)
            else:
                statements = []
            for statement in statements:
                cursor.execute(statement)


def install(connection) -> None:
    _run(connection, install=True)


def remove(connection) -> None:
    """Drop the guards. Only for test teardown (flush) and deliberate tamper tests."""
    _run(connection, install=False)


def installed(connection) -> bool:
    """Whether every history table has both of its guards."""
    with connection.cursor() as cursor:
        for table in TABLES:
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
                return False
    return True
