"""The database itself refuses UPDATE and DELETE on history events (append-only)."""

from django.db import migrations

TABLE = "attempts_attemptevent"

SQLITE_FORWARD = [
    f"""CREATE TRIGGER IF NOT EXISTS attemptevent_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'attempt history is append-only: UPDATE refused'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS attemptevent_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'attempt history is append-only: DELETE refused'); END""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS attemptevent_no_update",
    "DROP TRIGGER IF EXISTS attemptevent_no_delete",
]
PG_FORWARD = [
    """CREATE OR REPLACE FUNCTION ledger_refuse_history_change() RETURNS trigger AS $$
       BEGIN
         RAISE EXCEPTION 'attempt history is append-only: % refused', TG_OP
           USING ERRCODE = 'insufficient_privilege';
       END; $$ LANGUAGE plpgsql""",
    f"""CREATE TRIGGER attemptevent_append_only BEFORE UPDATE OR DELETE ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION ledger_refuse_history_change()""",
    f"""CREATE TRIGGER attemptevent_no_truncate BEFORE TRUNCATE ON {TABLE}
        FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_history_change()""",
]
PG_BACKWARD = [
    f"DROP TRIGGER IF EXISTS attemptevent_no_truncate ON {TABLE}",
    f"DROP TRIGGER IF EXISTS attemptevent_append_only ON {TABLE}",
    "DROP FUNCTION IF EXISTS ledger_refuse_history_change()",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql, params=None)  # no placeholders: "%" is PL/pgSQL

    return run


class Migration(migrations.Migration):
    dependencies = [("attempts", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_FORWARD, "postgresql": PG_FORWARD}),
            _run({"sqlite": SQLITE_BACKWARD, "postgresql": PG_BACKWARD}),
        )
    ]
