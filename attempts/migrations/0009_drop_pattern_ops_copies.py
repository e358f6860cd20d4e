"""PostgreSQL: drop the ``varchar_pattern_ops`` copies of the unique text columns' indexes.

Django adds such a copy beside the index of every unique or indexed text column, for ``LIKE
'prefix%'``. Migration 0004 dropped them (nothing runs those lookups; prefix search reads the
``COLLATE "C"`` indexes, ``attempts.models.search_key``), but a ledger created from
``0001_squashed_schema`` got them back, and each was one more B-tree insert on every intent and
every move of an attempt. A ledger upgraded through 0004 has none, and nothing happens here.
"""

from django.db import migrations

PATTERN_OPS_INDEXES = [
    "attempts_attempt_tenant_id_4dde2969_like",
    "attempts_attempt_attempt_id_addab3ac_like",
    "attempts_attempt_idempotency_key_99547edc_like",
    "attempts_attemptevent_hash_74d3914f_like",
]


def drop_copies(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in PATTERN_OPS_INDEXES:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0001_squashed_schema"),
    ]

    # Not restored on the way back: nothing uses them.
    operations = [migrations.RunPython(drop_copies, migrations.RunPython.noop)]
