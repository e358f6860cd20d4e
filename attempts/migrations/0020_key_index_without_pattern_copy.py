"""The permanent key index without its pattern-ops copy (PostgreSQL).

Django gives every indexed text column on PostgreSQL a second index with ``varchar_pattern_ops``
(named ``..._like``), for ``LIKE`` and ``startswith`` under a non-C collation. The key index's
primary key (``RecordedKey.key_digest``, a SHA-256 in hex) is only ever looked up whole, so that
copy served no query while every intent wrote to it: about 120 bytes an attempt and one B-tree
insert per intent.

Dropped with ``DROP INDEX CONCURRENTLY`` (the migration is not atomic), so a large ledger's
writers are not blocked while it runs. Nothing to do on SQLite, which never had the copy. The
model's state does not change: the copy was never part of it.
"""

from django.db import migrations

TABLE = "attempts_recordedkey"


def _pattern_copies(cursor):
    cursor.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
        "AND tablename = %s AND indexdef LIKE %s",
        [TABLE, "%varchar_pattern_ops%"],
    )
    return [name for (name,) in cursor.fetchall()]


def drop_pattern_copy(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in _pattern_copies(cursor):
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def restore_pattern_copy(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if _pattern_copies(cursor):
            return
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY {TABLE}_key_digest_like "
            f"ON {TABLE} (key_digest varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("attempts", "0019_approvals_in_the_chain")]

    operations = [migrations.RunPython(drop_pattern_copy, restore_pattern_copy, elidable=False)]
