"""PostgreSQL: the identifiers a prefix search reads compare in byte order, and their byte-order
copies go.

``idempotency_key``, ``task_id``, ``provider_request_id`` and ``args_hash`` become ``COLLATE "C"``
(``attempts.models.ByteOrderCharField``), so each one's own index serves both equality and a
prefix search's range, and the ``attempt_*_prefix_idx`` copy of each (``0001_squashed_schema``)
is dropped: four fewer B-tree inserts per intent.
``attempt_id`` keeps its copy: foreign keys of other tables compare it with columns of the
database's own collation.

No row is rewritten (the type stays ``varchar``); PostgreSQL rebuilds the four columns' indexes
under the new collation, holding the table's lock while it does.
SQLite compares bytes already: there only Django's state changes.
"""

from django.db import migrations

import attempts.models

COLUMNS = {  # column: (varchar length, its byte-order copy)
    "idempotency_key": (255, "attempt_key_prefix_idx"),
    "task_id": (200, "attempt_task_prefix_idx"),
    "provider_request_id": (255, "attempt_req_prefix_idx"),
    "args_hash": (64, "attempt_hash_prefix_idx"),
}


def set_collation(schema_editor, collation):
    """The four columns under ``collation``, in one ALTER (one lock)."""
    changes = ", ".join(
        f'ALTER COLUMN {column} TYPE varchar({length}) COLLATE "{collation}"'
        for column, (length, _copy) in COLUMNS.items()
    )
    schema_editor.execute(f"ALTER TABLE attempts_attempt {changes}")


def to_byte_order(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # The copies first, so that the ALTER does not rebuild them only to drop them.
    for _length, copy in COLUMNS.values():
        schema_editor.execute(f"DROP INDEX IF EXISTS {copy}")
    set_collation(schema_editor, "C")


def to_database_order(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    set_collation(schema_editor, "default")
    for column, (_length, copy) in COLUMNS.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS {copy} ON attempts_attempt (({column} COLLATE "C"))'
        )


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0012_live_counts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(to_byte_order, to_database_order)],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="idempotency_key",
                    field=attempts.models.ByteOrderCharField(max_length=255, unique=True),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="task_id",
                    field=attempts.models.ByteOrderCharField(max_length=200),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="provider_request_id",
                    field=attempts.models.ByteOrderCharField(
                        blank=True, default="", max_length=255
                    ),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="args_hash",
                    field=attempts.models.ByteOrderCharField(max_length=64),
                ),
            ],
        ),
    ]
