"""The permanent index of every idempotency key ever recorded (``RecordedKey``) and of every
provider effect an attempt claimed (``ProviderEffect``), both append-only; and the result
reference of an archived attempt (``ArchivedAttempt.result_ref``, a nullable column added
without rewriting the table).

The indexes are filled from what the ledger holds, in batches that each commit on their own (the
migration is not atomic), so a large ledger is read a slice at a time and no lock is held for
the whole fill (on PostgreSQL, only the new tables are written; the attempts table is read).
Live attempts first, then archived ones: a key recorded twice before this index existed (the
break it closes) keeps its live attempt; an archived attempt's arguments hash was never kept, so
its key is indexed without one and a repeat of it is refused. One provider effect claimed by
several attempts before now keeps its oldest claimant; the others are left as they are.

Run it with the agents' writers stopped (as every migration): an intent recorded by the old code
while it runs would not be indexed.
"""

import hashlib

from django.db import migrations, models

from attempts.history_guard import install_in_migration

BATCH = 2000


def _digest(key):
    return hashlib.sha256(key.encode()).hexdigest()


def _batches(queryset, fields, order):
    last = None
    while True:
        rows = queryset
        if last is not None:
            rows = rows.filter(**{f"{order}__gt": last})
        rows = list(rows.order_by(order).values_list(order, *fields)[:BATCH])
        if not rows:
            return
        last = rows[-1][0]
        yield [row[1:] for row in rows]


def fill(apps, schema_editor):
    Attempt = apps.get_model("attempts", "Attempt")
    ArchivedAttempt = apps.get_model("attempts", "ArchivedAttempt")
    RecordedKey = apps.get_model("attempts", "RecordedKey")
    ProviderEffect = apps.get_model("attempts", "ProviderEffect")
    live = ("idempotency_key", "tenant_id", "tool_name", "args_hash", "attempt_id")
    for rows in _batches(Attempt.objects.all(), live, "id"):
        RecordedKey.objects.bulk_create(
            [
                RecordedKey(
                    key_digest=_digest(key),
                    tenant_id=tenant,
                    tool_name=tool,
                    args_hash=args_hash,
                    attempt_id=attempt_id,
                )
                for key, tenant, tool, args_hash, attempt_id in rows
            ],
            ignore_conflicts=True,
        )
    archived = ("idempotency_key", "tenant_id", "tool_name", "attempt_id")
    for rows in _batches(ArchivedAttempt.objects.all(), archived, "row_id"):
        RecordedKey.objects.bulk_create(
            [
                RecordedKey(
                    key_digest=_digest(key),
                    tenant_id=tenant,
                    tool_name=tool,
                    args_hash="",
                    attempt_id=attempt_id,
                )
                for key, tenant, tool, attempt_id in rows
            ],
            ignore_conflicts=True,
        )
    effect = ("tool_name", "provider_request_id", "attempt_id")
    for model, order in ((ArchivedAttempt, "row_id"), (Attempt, "id")):
        claimed = model.objects.exclude(provider_request_id="")
        for rows in _batches(claimed, effect, order):
            ProviderEffect.objects.bulk_create(
                [
                    ProviderEffect(tool_name=tool, provider_request_id=request, attempt_id=aid)
                    for tool, request, aid in rows
                ],
                ignore_conflicts=True,
            )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("attempts", "0017_tool_display_hints"),
    ]

    operations = [
        migrations.CreateModel(
            name="RecordedKey",
            fields=[
                (
                    "key_digest",
                    models.CharField(max_length=64, primary_key=True, serialize=False),
                ),
                ("tenant_id", models.CharField(max_length=64)),
                ("tool_name", models.CharField(max_length=100)),
                ("args_hash", models.CharField(blank=True, max_length=64)),
                ("attempt_id", models.CharField(max_length=32)),
            ],
        ),
        migrations.CreateModel(
            name="ProviderEffect",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tool_name", models.CharField(max_length=100)),
                ("provider_request_id", models.CharField(max_length=255)),
                ("attempt_id", models.CharField(max_length=32)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tool_name", "provider_request_id"),
                        name="provider_effect_unique",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="archivedattempt",
            name="result_ref",
            field=models.CharField(blank=True, max_length=500, null=True),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
        install_in_migration(("attempts_recordedkey", "attempts_providereffect")),
    ]
