"""Each attempt keeps who recorded it (``Attempt.recorded_by``, its creation event's actor), so
"never whoever recorded the intent" is a column test and not a read of the history per attempt.

The column is added empty (no row is rewritten to add it) and filled from each attempt's first
event for the attempts an approval check reads: those a policy held and the linked ones. The
rest keep NULL; their first event still says who recorded them (``review._recorded_by``).
"""

from django.db import migrations, models
from django.db.models import OuterRef, Q, Subquery


def fill(apps, schema_editor):
    Attempt = apps.get_model("attempts", "Attempt")
    AttemptEvent = apps.get_model("attempts", "AttemptEvent")
    first_actor = (
        AttemptEvent.objects.filter(attempt=OuterRef("pk")).order_by("id").values("actor")[:1]
    )
    Attempt.objects.filter(Q(approval_policy__isnull=False) | Q(parent__isnull=False)).update(
        recorded_by=Subquery(first_actor)
    )


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0013_byte_order_identifiers"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="recorded_by",
            field=models.CharField(blank=True, editable=False, max_length=150, null=True),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
    ]
