# Fewer B-tree pages (and WAL frames) written per intent: see the comments on Attempt.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

DROPPED_INDEXES = [
    "attempts_attempt_tenant_id_4dde2969",
    "attempts_attempt_owner_id_7d729ffd",
    "attempts_attempt_parent_id_8a1e018c",
    "attempts_attemptevent_attempt_id_4f99c2e8",
]
# PostgreSQL only: Django adds a varchar_pattern_ops copy of the index of every indexed or unique
# text column, for LIKE 'prefix%' lookups. The ledger makes none, so each was one more B-tree
# insert per intent (per event, for the hash). Not restored on the way back: nothing uses them.
PATTERN_OPS_INDEXES = [
    "attempts_attempt_tenant_id_4dde2969_like",
    "attempts_attempt_attempt_id_addab3ac_like",
    "attempts_attempt_idempotency_key_99547edc_like",
    "attempts_attemptevent_hash_74d3914f_like",
]
RESTORE_INDEXES = [
    'CREATE INDEX "attempts_attempt_tenant_id_4dde2969" ON "attempts_attempt" ("tenant_id")',
    'CREATE INDEX "attempts_attempt_owner_id_7d729ffd" ON "attempts_attempt" ("owner_id")',
    'CREATE INDEX "attempts_attempt_parent_id_8a1e018c" ON "attempts_attempt" ("parent_id")',
    'CREATE INDEX "attempts_attemptevent_attempt_id_4f99c2e8" '
    'ON "attempts_attemptevent" ("attempt_id")',
]


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0003_issue5_dashboard"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="attempt",
            name="attempt_owner_state_idx",
        ),
        # Single-column foreign-key indexes that composite (or partial) indexes already cover:
        # dropped by name on both databases. Django's AlterField would rebuild the whole
        # attempts table on SQLite for this (and drops nothing on PostgreSQL).
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in DROPPED_INDEXES],
                    reverse_sql=RESTORE_INDEXES,
                ),
                migrations.RunSQL(
                    [f'DROP INDEX IF EXISTS "{name}"' for name in PATTERN_OPS_INDEXES],
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="owned_attempts",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="parent",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="children",
                        to="attempts.attempt",
                    ),
                ),
                migrations.AlterField(
                    model_name="attempt",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="attempts.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="attemptevent",
                    name="attempt",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="events",
                        to="attempts.attempt",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "state"],
                name="attempt_owner_state_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent"],
                name="attempt_parent_idx",
            ),
        ),
    ]
