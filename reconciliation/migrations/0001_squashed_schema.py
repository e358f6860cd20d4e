"""The worker heartbeat table up to release 0.1.0. A ledger of that release has it recorded as
applied, with the names of the two migrations it once replaced (removed since)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

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
