"""The database itself refuses UPDATE and DELETE on history events (append-only)."""

from django.db import migrations


def forward(apps, schema_editor):
    from attempts import history_guard

    history_guard.install(schema_editor.connection)


def backward(apps, schema_editor):
    from attempts import history_guard

    history_guard.remove(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("attempts", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
