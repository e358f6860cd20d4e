"""The database itself refuses UPDATE and DELETE (and TRUNCATE on PostgreSQL) of approvals, as of
attempt events: an approval is bound to the arguments and policy version it saw and is never
changed; a void one stays, a new one is a new row. The triggers are history_guard's (installed
again after every migrate and flush); installing them is idempotent."""

from django.db import migrations


def forward(apps, schema_editor):
    from attempts import history_guard

    history_guard.install(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("attempts", "0016_erasure_salted_chain")]

    # Backwards: the triggers go with the table when 0013 is reversed.
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
