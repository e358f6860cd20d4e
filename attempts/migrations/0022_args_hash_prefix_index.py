"""The args hash indexed by its first 16 characters instead of all 64.

Only the dashboard's prefix search reads ``args_hash`` through an index (an equality lookup by
hash always comes with the attempt's parent, read from ``attempt_parent_idx``). Sixteen hex
characters tell a ledger's hashes apart as well for a search, and a longer term is checked on
each row of that range (``AttemptQuerySet.prefix_search``); the index is about a third of the
whole hash's, the largest index of the attempts table.

On PostgreSQL the new index is built with ``CREATE INDEX CONCURRENTLY`` before the old one is
dropped with ``DROP INDEX CONCURRENTLY`` (the migration is not atomic), so a large ledger's
writers are not blocked and a search always has an index; plain statements on SQLite.
"""

from django.db import migrations, models

import attempts.models.attempts
from attempts import dbadapter

OLD = models.Index(fields=["args_hash"], name="attempt_args_hash_idx")
NEW = models.Index(attempts.models.attempts.HashPrefix("args_hash"), name="attempt_args_hash16_idx")


def _swap(schema_editor, model, add: models.Index, drop: models.Index) -> None:
    """Build ``add`` (again, if a concurrent build left it invalid), then drop ``drop``: a
    search always has one of them."""
    db = schema_editor.connection
    state = dbadapter.index_state(db, add.name)
    if state == "invalid":
        schema_editor.remove_index(model, add, **dbadapter.concurrently(db))
    if state != "valid":
        schema_editor.add_index(model, add, **dbadapter.concurrently(db))
    schema_editor.remove_index(model, drop, **dbadapter.concurrently(db))


def forwards(apps, schema_editor):
    _swap(schema_editor, apps.get_model("attempts", "Attempt"), NEW, OLD)


def backwards(apps, schema_editor):
    _swap(schema_editor, apps.get_model("attempts", "Attempt"), OLD, NEW)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("attempts", "0021_leaf_without_checkpoint_copy")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
            state_operations=[
                migrations.RemoveIndex(model_name="attempt", name="attempt_args_hash_idx"),
                migrations.AddIndex(model_name="attempt", index=NEW),
            ],
        )
    ]
