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

from attempts import dbadapter

INDEX = models.Index(
    fields=["id"], name="event_legacy_chain_idx", condition=models.Q(chain_format=1)
)


def forwards(apps, schema_editor):
    model, db = apps.get_model("attempts", "AttemptEvent"), schema_editor.connection
    state = dbadapter.index_state(db, INDEX.name)
    if state == "invalid":
        schema_editor.remove_index(model, INDEX, **dbadapter.concurrently(db))
    if state != "valid":
        schema_editor.add_index(model, INDEX, **dbadapter.concurrently(db))


def backwards(apps, schema_editor):
    model, db = apps.get_model("attempts", "AttemptEvent"), schema_editor.connection
    if dbadapter.index_state(db, INDEX.name) != "missing":
        schema_editor.remove_index(model, INDEX, **dbadapter.concurrently(db))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("attempts", "0022_args_hash_prefix_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[migrations.AddIndex(model_name="attemptevent", index=INDEX)],
        )
    ]
