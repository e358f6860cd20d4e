"""Tool.adapter becomes a name from settings.LEDGER["ADAPTERS"], never an import path: a stored
dotted path that settings list is replaced by its name; any other is left for a person to fix
(recovery reports the tool as unusable, reconciliation.W001)."""

from django.conf import settings
from django.db import migrations, models

import attempts.models


def paths_to_names(apps, schema_editor):
    Tool = apps.get_model("attempts", "Tool")
    by_path = {path: name for name, path in settings.LEDGER["ADAPTERS"].items()}
    for tool in Tool.objects.all():
        if tool.adapter in by_path:
            Tool.objects.filter(pk=tool.pk).update(adapter=by_path[tool.adapter])
        elif tool.adapter == "":
            Tool.objects.filter(pk=tool.pk).update(adapter="http")


class Migration(migrations.Migration):
    dependencies = [("attempts", "0007_operator_shift")]

    operations = [
        migrations.RunPython(paths_to_names, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="tool",
            name="adapter",
            field=models.CharField(
                default="http",
                help_text="One of the adapters this deployment lists (LEDGER['ADAPTERS']).",
                max_length=200,
                validators=[attempts.models.validate_adapter_name],
            ),
        ),
    ]
