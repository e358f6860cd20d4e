"""The worker heartbeat table in one migration. It replaces 0001-0002, which stay only so that a
ledger created before this squash can upgrade; remove them and ``replaces`` once every ledger has
migrated past 0002."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("reconciliation", "0001_initial"),
        ("reconciliation", "0002_worker_restarts"),
    ]

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("worker_id", models.CharField(max_length=100, unique=True)),
                ("hostname", models.CharField(max_length=200)),
                ("pid", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField()),
                ("last_seen", models.DateTimeField(db_index=True)),
                ("settled_total", models.PositiveBigIntegerField(default=0)),
                ("lookups_total", models.PositiveBigIntegerField(default=0)),
                ("restarts", models.PositiveIntegerField(default=0)),
                ("last_exit", models.CharField(blank=True, default="", max_length=200)),
            ],
        ),
    ]
