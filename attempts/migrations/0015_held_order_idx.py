"""The approvals inbox's index: held attempts (AWAITING_APPROVAL) in the inbox's order, with
what "awaiting me" tests (tenant, policy, who recorded it), so a page reads its own rows and a
bounded count can be answered from the index. Partial: a few entries in a big ledger.

Building it reads the attempts table once; on PostgreSQL agents' writes wait for that.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0014_recorded_by"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("state", "AWAITING_APPROVAL")),
                fields=["created_at", "id", "tenant", "approval_policy", "recorded_by"],
                name="attempt_held_order_idx",
            ),
        ),
    ]
