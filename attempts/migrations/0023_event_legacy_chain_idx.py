"""The events of chain format 1 (written before per-attempt chains) indexed by id, alone.

``verify_audit`` walks them in id order as the one ledger-wide chain they were written into;
without this index that read was a scan of every event of the ledger on each run, however few
of them (none, on a ledger begun since) are of that format. The index holds only those events,
so it costs nothing to the write path, which writes later formats.

On PostgreSQL it is built with ``CREATE INDEX CONCURRENTLY`` (the migration is not atomic), so
a large ledger's writers are not blocked; an invalid index left by a build that was cut short
is dropped and built again. A plain statement on SQLite.
"""

from django.db import migrations, models

INDEX = models.Index(
    fields=["id"], name="event_legacy_chain_idx", condition=models.Q(chain_format=1)
)


def _options(schema_editor) -> dict[str, bool]:
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def _invalid(schema_editor) -> bool | None:
    """None: no such index; True: a concurrent build of it was cut short."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = %s", [INDEX.name]
            )
            return False if cursor.fetchone() else None
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
            [INDEX.name],
        )
        row = cursor.fetchone()
    return None if row is None else not row[0]


def forwards(apps, schema_editor):
    model = apps.get_model("attempts", "AttemptEvent")
    invalid = _invalid(schema_editor)
    if invalid:
        schema_editor.remove_index(model, INDEX, **_options(schema_editor))
    if invalid is not False:
        schema_editor.add_index(model, INDEX, **_options(schema_editor))


def backwards(apps, schema_editor):
    model = apps.get_model("attempts", "AttemptEvent")
    if _invalid(schema_editor) is not None:
        schema_editor.remove_index(model, INDEX, **_options(schema_editor))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("attempts", "0022_args_hash_prefix_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[migrations.AddIndex(model_name="attemptevent", index=INDEX)],
        )
    ]
