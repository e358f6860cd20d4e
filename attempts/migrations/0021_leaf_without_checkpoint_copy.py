"""The checkpoint leaves without the foreign key's own index on ``checkpoint_id``.

The unique (checkpoint, position) index starts with the same column, so it serves every lookup
of a checkpoint's leaves and the foreign key's checks; the copy was one more B-tree insert for
every leaf of every seal (one leaf per attempt written since the last one) and about 7 bytes a
leaf.

Dropped with ``DROP INDEX CONCURRENTLY`` on PostgreSQL (the migration is not atomic), so a large
ledger's sealer is not blocked while it runs; a plain ``DROP INDEX`` on SQLite, which would
otherwise copy the whole table to change the field. Found by its column, not its name.
"""

from django.db import migrations, models

TABLE = "attempts_checkpointleaf"
# The name Django gave it (the same on both databases), for the reverse migration.
NAME = "attempts_checkpointleaf_checkpoint_id_7dcdd865"


def _copies(connection) -> list[str]:
    """The non-unique, non-partial indexes on exactly ``checkpoint_id``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
                "WHERE i.indrelid = %s::regclass AND NOT i.indisunique AND i.indnatts = 1 "
                "AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'checkpoint_id'",
                [TABLE],
            )
            return [name for (name,) in cursor.fetchall()]
        cursor.execute(
            'SELECT name FROM pragma_index_list(%s) WHERE "unique" = 0 AND partial = 0',
            [TABLE],
        )
        names = [name for (name,) in cursor.fetchall()]
        found = []
        for name in names:
            cursor.execute("SELECT name FROM pragma_index_info(%s)", [name])
            if [column for (column,) in cursor.fetchall()] == ["checkpoint_id"]:
                found.append(name)
        return found


def drop_copy(apps, schema_editor):
    connection = schema_editor.connection
    concurrently = " CONCURRENTLY" if connection.vendor == "postgresql" else ""
    for name in _copies(connection):
        schema_editor.execute(
            f"DROP INDEX{concurrently} IF EXISTS {schema_editor.quote_name(name)}"
        )


def restore_copy(apps, schema_editor):
    connection = schema_editor.connection
    if _copies(connection):
        return
    concurrently = " CONCURRENTLY" if connection.vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX{concurrently} {schema_editor.quote_name(NAME)} ON {TABLE} (checkpoint_id)"
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("attempts", "0020_key_index_without_pattern_copy")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(drop_copy, restore_copy, elidable=False),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="checkpointleaf",
                    name="checkpoint",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.PROTECT,
                        related_name="leaves",
                        to="attempts.checkpoint",
                    ),
                ),
            ],
        )
    ]
