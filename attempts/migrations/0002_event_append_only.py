"""The database itself refuses UPDATE and DELETE on history events (append-only). Superseded by
0001_squashed_schema; kept so that ledgers created before it can upgrade."""

from django.db import migrations

TABLE = "attempts_attemptevent"


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            schema_editor.execute(
                f"CREATE TRIGGER IF NOT EXISTS attemptevent_no_{verb.lower()} BEFORE {verb} "
                f"ON {TABLE} BEGIN SELECT RAISE(ABORT, "
                f"'audit history is append-only: {verb} refused'); END"
            )
    elif vendor == "postgresql":
        schema_editor.execute(
            "CREATE OR REPLACE FUNCTION ledger_refuse_history_change() RETURNS trigger AS $$ "
            "BEGIN RAISE EXCEPTION 'audit history is append-only: % refused', TG_OP "
            "USING ERRCODE = 'insufficient_privilege'; END; $$ LANGUAGE plpgsql",
            None,  # no parameters: the % belongs to RAISE
        )
        schema_editor.execute(
            f"CREATE OR REPLACE TRIGGER attemptevent_append_only BEFORE UPDATE OR DELETE ON "
            f"{TABLE} FOR EACH ROW EXECUTE FUNCTION ledger_refuse_history_change()"
        )
        schema_editor.execute(
            f"CREATE OR REPLACE TRIGGER attemptevent_no_truncate BEFORE TRUNCATE ON {TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_history_change()"
        )


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS attemptevent_no_update")
        schema_editor.execute("DROP TRIGGER IF EXISTS attemptevent_no_delete")
    elif vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS attemptevent_no_truncate ON {TABLE}")
        schema_editor.execute(f"DROP TRIGGER IF EXISTS attemptevent_append_only ON {TABLE}")


class Migration(migrations.Migration):
    dependencies = [("attempts", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
