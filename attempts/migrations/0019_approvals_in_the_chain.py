"""Approvals live in the attempt's chain only (issue 39, docs/approvals.md "Upgrading").

- ``Approval.comment`` goes: a comment lives in its ``attempt.approval`` event's reason (every
  approval has written one since approvals exist, with the same text), where erasure redacts it
  like other free text. The approvals table is rebuilt on SQLite for this, so its append-only
  guard is installed again (``history_guard``).
- ``Attempt.recorded_by_issuer``: the issuer of the agent token that recorded an intent, a
  recorder who may not approve it. New intents record it (and their creation event does); for
  attempts still waiting for a decision (AWAITING_APPROVAL, MANUAL_REVIEW) it is filled from
  the token's issuer as it is now, the best that is known of them.

Nothing is appended to any chain: every approval made through the ledger already has its event,
and which approvals count is read from those events now, so an approval row without its event
(written behind the ledger's back) counts for nothing.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import migrations, models

from attempts import history_guard

WAITING = ("AWAITING_APPROVAL", "MANUAL_REVIEW")


def fill_issuers(apps, schema_editor):
    db = schema_editor.connection.alias
    Attempt = apps.get_model("attempts", "Attempt")
    AgentToken = apps.get_model("attempts", "AgentToken")
    tokens = (
        AgentToken.objects.using(db).filter(created_by__isnull=False).select_related("created_by")
    )
    # Historical models have no USERNAME_FIELD: the project's user model says which it is.
    field = get_user_model().USERNAME_FIELD
    for token in tokens.iterator():
        issuer = getattr(token.created_by, field)
        Attempt.objects.using(db).filter(
            recorded_by=token.name, state__in=WAITING, recorded_by_issuer=""
        ).update(recorded_by_issuer=issuer)


class Migration(migrations.Migration):
    dependencies = [
        ("attempts", "0018_key_and_effect_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveField(model_name="approval", name="comment"),
        history_guard.install_in_migration(("attempts_approval",), created=False),
        migrations.AddField(
            model_name="attempt",
            name="recorded_by_issuer",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=150
            ),
        ),
        migrations.RunPython(fill_issuers, migrations.RunPython.noop, elidable=True),
    ]
