from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reconciliation", "0001_squashed_schema")]

    operations = [
        migrations.AddField(
            model_name="workerheartbeat",
            name="providers",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
