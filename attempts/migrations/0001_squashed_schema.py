"""The ledger's schema up to release 0.1.0 in one migration: every model, the append-only
triggers on the history tables (``attempts.history_guard``) and PostgreSQL's byte-order prefix
indexes for the dashboard's search.

A ledger of release 0.1.0 has it recorded as applied, together with the names of the
migrations it once replaced (0001_initial to 0008, removed since: Django passes over records
of migrations it does not know). A ledger older than 0.1.0 must first migrate with 0.1.0; the
first operation here refuses it with a message saying so, instead of failing half way.
"""

import datetime

import django.db.models.deletion
from django.conf import settings
from django.core.management import CommandError
from django.db import migrations, models

import attempts.models
from attempts import dbadapter, history_guard

HISTORY_TABLES = (
    "attempts_attemptevent",
    "attempts_configevent",
    "attempts_checkpoint",
    "attempts_checkpointleaf",
)
PREFIX_INDEXES = {
    "attempt_key_prefix_idx": "idempotency_key",
    "attempt_id_prefix_idx": "attempt_id",
    "attempt_task_prefix_idx": "task_id",
    "attempt_req_prefix_idx": "provider_request_id",
    "attempt_hash_prefix_idx": "args_hash",
}


def refuse_a_ledger_older_than_0_1_0(apps, schema_editor):
    """Tables already here while this migration is not recorded: a ledger from before release
    0.1.0, whose migrations are gone."""
    if "attempts_attempt" in dbadapter.table_names(schema_editor.connection):
        raise CommandError(
            "this ledger was created before release 0.1.0 and cannot be migrated by this "
            "version: migrate it with release 0.1.0 first (its `manage.py migrate`), then "
            "with this one"
        )


def add_prefix_indexes(apps, schema_editor):
    """PostgreSQL: byte-order (COLLATE "C") indexes, so ``LIKE 'prefix%'`` searches use an index
    whatever the database's collation. SQLite compares bytes already."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, column in PREFIX_INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS {name} ON attempts_attempt (({column} COLLATE "C"))'
        )


def drop_prefix_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in PREFIX_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(refuse_a_ledger_older_than_0_1_0, migrations.RunPython.noop),
        migrations.CreateModel(
            name="Checkpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.PositiveIntegerField(unique=True)),
                ("prev_hash", models.CharField(max_length=64)),
                ("root", models.CharField(max_length=64)),
                ("size", models.PositiveIntegerField()),
                ("config_length", models.PositiveIntegerField()),
                ("config_head", models.CharField(max_length=64)),
                ("sealed_at", models.DateTimeField()),
                ("hash", models.CharField(max_length=64, unique=True)),
            ],
            options={
                "ordering": ["seq"],
            },
        ),
        migrations.CreateModel(
            name="LoginThrottle",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=64, unique=True)),
                ("username", models.CharField(blank=True, default="", max_length=150)),
                ("address", models.CharField(blank=True, default="", max_length=64)),
                ("failures", models.PositiveIntegerField(default=0)),
                ("first_failure_at", models.DateTimeField()),
                ("locked_until", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name="NotifyCursor",
            fields=[
                ("name", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("last_event_id", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="Tenant",
            fields=[
                ("slug", models.SlugField(max_length=64, primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name="Tool",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("description", models.CharField(blank=True, max_length=300)),
                (
                    "effect_class",
                    models.CharField(
                        choices=[
                            ("idempotent", "Idempotent (provider honours the key, has a lookup)"),
                            ("reconcilable", "Reconcilable (lookup only)"),
                            ("manual", "Manual (no key, no lookup)"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "critical",
                    models.BooleanField(
                        default=False,
                        help_text="Payments, deletions, messages, deployments: never retried without a person, and a linked retry needs two distinct reviewers.",
                    ),
                ),
                (
                    "adapter",
                    models.CharField(
                        default="http",
                        help_text="One of the adapters this deployment lists (LEDGER['ADAPTERS']).",
                        max_length=200,
                        validators=[attempts.models.validate_adapter_name],
                    ),
                ),
                ("dispatch_url", models.URLField(blank=True, max_length=500)),
                ("lookup_url", models.URLField(blank=True, max_length=500)),
                ("timeout_seconds", models.FloatField(default=10.0)),
                (
                    "max_sends",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        help_text="Overrides LEDGER['MAX_SENDS'] for this tool.",
                        null=True,
                    ),
                ),
                ("active", models.BooleanField(default=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "attempt_id",
                    models.CharField(
                        default=attempts.models.new_attempt_id,
                        editable=False,
                        max_length=32,
                        unique=True,
                    ),
                ),
                ("task_id", models.CharField(max_length=200)),
                ("tool_name", models.CharField(max_length=100)),
                ("args", models.JSONField()),
                ("args_hash", models.CharField(max_length=64)),
                ("idempotency_key", models.CharField(max_length=255, unique=True)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("INTENT_RECORDED", "Intent recorded"),
                            ("DISPATCHED", "Dispatched"),
                            ("OUTCOME_CONFIRMED", "Outcome confirmed"),
                            ("FAILED_RETRYABLE", "Failed (retryable)"),
                            ("UNKNOWN", "Unknown"),
                            ("MANUAL_REVIEW", "Manual review"),
                            ("FAILED", "Failed"),
                            ("RECONCILED", "Reconciled"),
                        ],
                        editable=False,
                        max_length=20,
                    ),
                ),
                ("version", models.PositiveIntegerField(default=1, editable=False)),
                ("provider_request_id", models.CharField(blank=True, default="", max_length=255)),
                ("result_ref", models.CharField(blank=True, default="", max_length=500)),
                ("policy_version", models.CharField(blank=True, default="", max_length=64)),
                ("credential_scope", models.JSONField(blank=True, default=list)),
                ("review_reason", models.CharField(blank=True, default="", max_length=64)),
                ("awaiting_approval", models.BooleanField(default=False)),
                ("send_count", models.PositiveIntegerField(default=0)),
                ("lookup_count", models.PositiveIntegerField(default=0)),
                ("next_check_at", models.DateTimeField(blank=True, null=True)),
                ("lease_owner", models.CharField(blank=True, default="", max_length=100)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("chain_head", models.CharField(editable=False, max_length=64)),
                ("chain_length", models.PositiveIntegerField(default=0, editable=False)),
                ("sealed", models.BooleanField(default=False, editable=False)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
                (
                    "owner",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="owned_attempts",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "parent",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="children",
                        to="attempts.attempt",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="attempts.tenant",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="ConfigEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("subject", models.CharField(max_length=200)),
                ("action", models.CharField(max_length=64)),
                (
                    "actor_kind",
                    models.CharField(
                        choices=[
                            ("agent", "Agent"),
                            ("worker", "Reconciliation worker"),
                            ("user", "Person"),
                            ("system", "System"),
                        ],
                        max_length=16,
                    ),
                ),
                ("actor", models.CharField(max_length=150)),
                ("before", models.JSONField(blank=True, null=True)),
                ("after", models.JSONField(blank=True, null=True)),
                ("reason", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField()),
                ("seq", models.PositiveIntegerField(unique=True)),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
            ],
            options={
                "ordering": ["seq"],
                "indexes": [
                    models.Index(fields=["subject", "seq"], name="configevent_subject_idx")
                ],
            },
        ),
        migrations.CreateModel(
            name="OwnershipRule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tenant_pattern", models.CharField(default="*", max_length=100)),
                ("tool_pattern", models.CharField(default="*", max_length=100)),
                ("priority", models.PositiveIntegerField(default=100)),
                (
                    "owner",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={
                "ordering": ["priority", "id"],
            },
        ),
        migrations.CreateModel(
            name="PersonSettings",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("time_zone", models.CharField(default="UTC", max_length=64)),
                ("email", models.BooleanField(default=True, help_text="Send my notices by email.")),
                (
                    "chat",
                    models.BooleanField(
                        default=True, help_text="Send my notices to the chat webhook."
                    ),
                ),
                (
                    "kinds",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text="Kinds of notice I want (empty: every kind).",
                    ),
                ),
                (
                    "digest_hour",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        default=8,
                        help_text="Local hour of the daily digest (empty: none).",
                        null=True,
                    ),
                ),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ledger_settings",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="SsoIdentity",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("subject", models.CharField(max_length=255, unique=True)),
                ("last_login_groups", models.JSONField(blank=True, default=list)),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sso_identity",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="AgentToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100, unique=True)),
                ("token_hash", models.CharField(editable=False, max_length=64, unique=True)),
                ("prefix", models.CharField(editable=False, max_length=16)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenants",
                    models.ManyToManyField(related_name="agent_tokens", to="attempts.tenant"),
                ),
            ],
        ),
        migrations.CreateModel(
            name="SlaPolicy",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "unknown_warn_after",
                    models.DurationField(default=datetime.timedelta(seconds=3600)),
                ),
                (
                    "unknown_breach_after",
                    models.DurationField(default=datetime.timedelta(seconds=14400)),
                ),
                (
                    "review_warn_after",
                    models.DurationField(default=datetime.timedelta(seconds=14400)),
                ),
                ("review_breach_after", models.DurationField(default=datetime.timedelta(days=1))),
                (
                    "escalate_to",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sla_policies",
                        to="attempts.tenant",
                    ),
                ),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sla_policies",
                        to="attempts.tool",
                    ),
                ),
            ],
            options={
                "verbose_name": "SLA policy",
                "verbose_name_plural": "SLA policies",
            },
        ),
        migrations.CreateModel(
            name="Grant",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("policy_version", models.CharField(max_length=64)),
                ("allowed_scopes", models.JSONField(blank=True, default=list)),
                ("active", models.BooleanField(default=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="grants",
                        to="attempts.tenant",
                    ),
                ),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="grants",
                        to="attempts.tool",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="AttemptEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("action", models.CharField(max_length=64)),
                (
                    "actor_kind",
                    models.CharField(
                        choices=[
                            ("agent", "Agent"),
                            ("worker", "Reconciliation worker"),
                            ("user", "Person"),
                            ("system", "System"),
                        ],
                        max_length=16,
                    ),
                ),
                ("actor", models.CharField(max_length=150)),
                ("from_state", models.CharField(blank=True, default="", max_length=20)),
                ("to_state", models.CharField(blank=True, default="", max_length=20)),
                ("reason", models.TextField(blank=True, default="")),
                ("details", models.JSONField(blank=True, default=dict)),
                ("created_at", models.DateTimeField()),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
                ("chain_format", models.PositiveSmallIntegerField(default=2, editable=False)),
                (
                    "attempt",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="events",
                        to="attempts.attempt",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [models.Index(fields=["attempt", "id"], name="event_attempt_idx")],
            },
        ),
        migrations.CreateModel(
            name="CheckpointLeaf",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("position", models.PositiveIntegerField()),
                ("attempt_id", models.CharField(max_length=32)),
                ("length", models.PositiveIntegerField()),
                ("head", models.CharField(max_length=64)),
                (
                    "checkpoint",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="leaves",
                        to="attempts.checkpoint",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["attempt_id", "checkpoint"], name="leaf_attempt_idx")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("checkpoint", "position"), name="checkpointleaf_unique_position"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Notification",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("dedupe_key", models.CharField(max_length=200, unique=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("assigned", "Work assigned to me"),
                            ("manual_review", "An attempt I own entered MANUAL_REVIEW"),
                            ("approval", "An approval waits for me"),
                            ("sla_breach", "An SLA breach escalated to me"),
                            ("digest", "Daily digest"),
                        ],
                        max_length=20,
                    ),
                ),
                ("channel", models.CharField(max_length=10)),
                ("subject", models.CharField(max_length=300)),
                ("body", models.TextField()),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("sent", "Sent"), ("dead", "Given up")],
                        default="pending",
                        max_length=10,
                    ),
                ),
                ("created_at", models.DateTimeField()),
                ("next_try_at", models.DateTimeField()),
                ("tries", models.PositiveIntegerField(default=0)),
                ("claim_token", models.CharField(blank=True, default="", max_length=40)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("sent_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.CharField(blank=True, default="", max_length=500)),
                (
                    "attempt",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notices",
                        to="attempts.attempt",
                    ),
                ),
                (
                    "recipient",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ledger_notices",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["next_try_at"],
                        name="notice_due_idx",
                    ),
                    models.Index(fields=["recipient", "created_at"], name="notice_recipient_idx"),
                ],
            },
        ),
        migrations.CreateModel(
            name="SlaEscalation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=20)),
                ("escalated_at", models.DateTimeField(blank=True, null=True)),
                ("acknowledged_at", models.DateTimeField(blank=True, null=True)),
                (
                    "acknowledged_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "attempt",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sla_escalations",
                        to="attempts.attempt",
                    ),
                ),
                (
                    "escalated_to",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("attempt", "state"), name="sla_escalation_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="SsoGroupRole",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("group", models.CharField(max_length=200)),
                (
                    "role",
                    models.CharField(
                        choices=[
                            ("viewer", "Viewer"),
                            ("operator", "Operator"),
                            ("reviewer", "Reviewer"),
                            ("admin", "Admin"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sso_group_roles",
                        to="attempts.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("group", "tenant"), name="ssogrouprole_unique")
                ],
            },
        ),
        migrations.CreateModel(
            name="Membership",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "role",
                    models.CharField(
                        choices=[
                            ("viewer", "Viewer"),
                            ("operator", "Operator"),
                            ("reviewer", "Reviewer"),
                            ("admin", "Admin"),
                        ],
                        default="viewer",
                        max_length=16,
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ledger_memberships",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memberships",
                        to="attempts.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("user", "tenant"), name="membership_unique_user_tenant"
                    )
                ],
            },
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("next_check_at__isnull", False)),
                fields=["next_check_at"],
                name="attempt_due_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(fields=["state", "created_at", "id"], name="attempt_state_age_idx"),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                fields=["tenant", "state", "created_at", "id"], name="attempt_tenant_state_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "state"],
                name="attempt_owner_state_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                fields=["tenant", "created_at", "id"], name="attempt_tenant_age_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["owner", "tenant", "state", "created_at", "id"],
                name="attempt_owner_queue_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                fields=["state", "tenant", "tool_name", "owner"],
                name="attempt_state_tenant_tool_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(fields=["task_id"], name="attempt_task_idx"),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(fields=["provider_request_id"], name="attempt_provider_req_idx"),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(fields=["args_hash"], name="attempt_args_hash_idx"),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent"],
                name="attempt_parent_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("sealed", False)), fields=["id"], name="attempt_unsealed_idx"
            ),
        ),
        migrations.AddConstraint(
            model_name="slapolicy",
            constraint=models.UniqueConstraint(
                condition=models.Q(("tenant__isnull", False)),
                fields=("tool", "tenant"),
                name="sla_unique_tool_tenant",
            ),
        ),
        migrations.AddConstraint(
            model_name="slapolicy",
            constraint=models.UniqueConstraint(
                condition=models.Q(("tenant__isnull", True)),
                fields=("tool",),
                name="sla_unique_tool",
            ),
        ),
        migrations.AddConstraint(
            model_name="grant",
            constraint=models.UniqueConstraint(
                fields=("tenant", "tool"), name="grant_unique_tenant_tool"
            ),
        ),
        history_guard.install_in_migration(HISTORY_TABLES),
        migrations.RunPython(add_prefix_indexes, drop_prefix_indexes),
    ]
