"""PostgreSQL: drop the ``varchar_pattern_ops`` copies of the write path's indexes.

Django adds such a copy beside the index of every unique or indexed text column, for ``LIKE
'prefix%'``. On the tables every intent and every move writes (attempts and their events)
nothing runs such a lookup (prefix search reads the ``COLLATE "C"`` indexes of
``0001_squashed_schema``), and each copy is one more B-tree insert per write. They are found in
the catalog by what they are, not by Django's hashed names. This cannot be part of the schema
migration: Django creates the copies when that migration ends (deferred with its other
indexes), after its last operation has run.
"""

from django.db import migrations

WRITE_PATH_TABLES = ["attempts_attempt", "attempts_attemptevent"]


def drop_copies(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = ANY(%s) AND indexdef LIKE %s",
            [WRITE_PATH_TABLES, "%pattern_ops%"],
        )
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'DROP INDEX "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0001_squashed_schema"),
    ]

    # Not restored on the way back: nothing uses them.
    operations = [migrations.RunPython(drop_copies, migrations.RunPython.noop)]
