"""Release 0.2's schema: the unreleased migrations 0010-0017, folded into one (``replaces``), in
their order, so that a development ledger already at 0017 carries on and a 0.1.0 ledger (at 0009)
upgrades in one step. Migrating back from here goes to 0009.

- notification routes (0010); the W3C trace context of an attempt (0011);
- the transparency log (attempts/log.py, 0012): checkpoints gain a format (2: the root and size of
  one append-only Merkle tree over every sealed leaf), the authority digest and their C2SP note;
  the log keeps each leaf's place (LogEntry), its stored subtree hashes (LogNode, what proofs and
  tiles read), the checkpoint signatures and cosignatures, and what it knows of each witness.
  Existing checkpoints stay format 1 and verify as before; the sealer appends their leaves to the
  log first, in the order they were sealed;
- approval policies and approvals (0013); the terminal counts (0014); archives and retention
  (0015); erasure and the salted chain (0016);
- the append-only guards (attempts/history_guard.py) of each history table it creates or rebuilds,
  and of approvals (0017). The events' guard takes its exceptions from the schema it is installed
  on, so each install below is right for the step it follows, forward and back.
"""

import datetime

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from attempts import history_guard


def _id():
    return (
        "id",
        models.BigAutoField(
            auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
        ),
    )


def _install_guards(apps, schema_editor):
    """Every guard, with the events' exceptions of the schema as it stands: after archives, the
    archiver's DELETE; with text_digest, an erasure's UPDATE; migrating back past erasure, the
    guard from before it."""
    history_guard.install(schema_editor.connection)


def _guards_before_archives(apps, schema_editor):
    # Migrating back past archives: the events' DELETE refused outright, before the table the
    # guard reads goes.
    history_guard.install(schema_editor.connection, without_archives=True)


def _drop_sqlite_event_guards(apps, schema_editor):
    # Migrating back past erasure: SQLite's event triggers read text_digest, which is about to
    # go; the guards come back once it has gone (_install_guards, reversing the no-op before it).
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS attemptevent_no_update")
        schema_editor.execute("DROP TRIGGER IF EXISTS attemptevent_no_delete")


class Migration(migrations.Migration):
    replaces = [
        ("attempts", "0010_notification_routes"),
        ("attempts", "0011_traceparent"),
        ("attempts", "0012_transparency_log"),
        ("attempts", "0013_approval_policies"),
        ("attempts", "0014_terminal_counts"),
        ("attempts", "0015_archive_retention"),
        ("attempts", "0016_erasure_salted_chain"),
        ("attempts", "0017_approval_append_only"),
    ]

    dependencies = [
        ("attempts", "0009_drop_pattern_ops_copies"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # 0010_notification_routes
        migrations.CreateModel(
            name="NotificationRoute",
            fields=[
                _id(),
                ("name", models.SlugField(max_length=64, unique=True)),
                ("tenant_pattern", models.CharField(default="*", max_length=100)),
                ("tool_pattern", models.CharField(default="*", max_length=100)),
                ("kinds", models.JSONField(blank=True, default=list)),
                ("active", models.BooleanField(default=True)),
                (
                    "people",
                    models.ManyToManyField(
                        blank=True, related_name="notification_routes", to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        # 0011_traceparent
        migrations.AddField(
            model_name="attempt",
            name="trace_id",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=32
            ),
        ),
        migrations.AddField(
            model_name="attempt",
            name="traceparent",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=55
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("trace_id", ""), _negated=True),
                fields=["trace_id"],
                name="attempt_trace_idx",
            ),
        ),
        # 0012_transparency_log
        migrations.CreateModel(
            name="WitnessState",
            fields=[
                _id(),
                ("name", models.CharField(max_length=200, unique=True)),
                ("size", models.PositiveBigIntegerField(default=0)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("ok", "up to date"),
                            ("behind", "behind"),
                            ("refused", "refused"),
                            ("unreachable", "unreachable"),
                        ],
                        default="behind",
                        max_length=12,
                    ),
                ),
                ("message", models.TextField(blank=True, default="")),
                ("checked_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="authority",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="format",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="note",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.CreateModel(
            name="LogEntry",
            fields=[
                _id(),
                ("index", models.PositiveBigIntegerField(unique=True)),
                (
                    "leaf",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="log_entry",
                        to="attempts.checkpointleaf",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="LogNode",
            fields=[
                _id(),
                ("level", models.PositiveSmallIntegerField()),
                ("index", models.PositiveBigIntegerField()),
                ("hash", models.BinaryField(max_length=32)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("level", "index"), name="lognode_unique_place")
                ],
            },
        ),
        migrations.CreateModel(
            name="CheckpointSignature",
            fields=[
                _id(),
                (
                    "kind",
                    models.CharField(
                        choices=[("log", "log"), ("witness", "witness")], max_length=10
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("key_id", models.CharField(max_length=8)),
                ("line", models.TextField()),
                ("created_at", models.DateTimeField()),
                (
                    "checkpoint",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="signatures",
                        to="attempts.checkpoint",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("checkpoint", "kind", "name", "key_id"),
                        name="checkpointsig_unique_key",
                    )
                ],
            },
        ),
        # The log's tables are history too; SQLite rebuilt the checkpoint table above.
        history_guard.install_in_migration(
            ("attempts_logentry", "attempts_lognode", "attempts_checkpointsignature")
        ),
        history_guard.install_in_migration(("attempts_checkpoint",), created=False),
        # 0013_approval_policies
        migrations.AlterField(
            model_name="attempt",
            name="state",
            field=models.CharField(
                choices=[
                    ("INTENT_RECORDED", "Intent recorded"),
                    ("DISPATCHED", "Dispatched"),
                    ("OUTCOME_CONFIRMED", "Outcome confirmed"),
                    ("FAILED_RETRYABLE", "Failed (retryable)"),
                    ("UNKNOWN", "Unknown"),
                    ("AWAITING_APPROVAL", "Awaiting approval"),
                    ("MANUAL_REVIEW", "Manual review"),
                    ("FAILED", "Failed"),
                    ("RECONCILED", "Reconciled"),
                ],
                editable=False,
                max_length=20,
            ),
        ),
        migrations.CreateModel(
            name="ApprovalPolicy",
            fields=[
                ("name", models.SlugField(max_length=100, primary_key=True, serialize=False)),
                (
                    "tenants",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text="Tenant slugs it applies to (empty: every tenant).",
                    ),
                ),
                (
                    "condition",
                    models.TextField(
                        blank=True,
                        default="",
                        help_text="CEL over args, tenant and tool_name, e.g. args.amount_cents > 100000 (empty: every call).",
                    ),
                ),
                (
                    "approvals_needed",
                    models.PositiveSmallIntegerField(
                        default=1,
                        help_text="Distinct approvers needed (at least two on a critical tool).",
                    ),
                ),
                (
                    "approver_role",
                    models.CharField(
                        choices=[
                            ("viewer", "Viewer"),
                            ("operator", "Operator"),
                            ("reviewer", "Reviewer"),
                            ("admin", "Admin"),
                        ],
                        default="reviewer",
                        max_length=16,
                    ),
                ),
                (
                    "approver_group",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Identity-provider group an approver must also be in (empty: any).",
                        max_length=200,
                    ),
                ),
                ("approval_ttl", models.DurationField(default=datetime.timedelta(seconds=3600))),
                ("max_wait", models.DurationField(default=datetime.timedelta(days=1))),
                ("active", models.BooleanField(default=True)),
                ("version", models.PositiveIntegerField(default=1, editable=False)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="approval_policies",
                        to="attempts.tool",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "approval policies",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Approval",
            fields=[
                _id(),
                ("args_hash", models.CharField(max_length=64)),
                ("policy_version", models.PositiveIntegerField()),
                ("comment", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                (
                    "approver",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "attempt",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="approvals",
                        to="attempts.attempt",
                    ),
                ),
                (
                    "policy",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="approvals",
                        to="attempts.approvalpolicy",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.AddField(
            model_name="attempt",
            name="approval_policy",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="held_attempts",
                to="attempts.approvalpolicy",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("approval_policy__isnull", False)),
                fields=["approval_policy", "state"],
                name="attempt_held_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="approvalpolicy",
            index=models.Index(fields=["tool", "active"], name="approvalpolicy_tool_idx"),
        ),
        migrations.AddIndex(
            model_name="approval",
            index=models.Index(fields=["attempt", "expires_at"], name="approval_attempt_idx"),
        ),
        # 0014_terminal_counts
        migrations.CreateModel(
            name="TerminalCountPass",
            fields=[
                _id(),
                ("counted_at", models.DateTimeField()),
                ("live_by_day", models.JSONField(default=dict)),
                ("seconds", models.FloatField(default=0.0)),
                ("days_counted", models.PositiveIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="TerminalCount",
            fields=[
                _id(),
                ("tenant_id", models.CharField(max_length=64)),
                ("tool_name", models.CharField(max_length=100)),
                ("state", models.CharField(max_length=20)),
                ("n", models.PositiveBigIntegerField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant_id", "tool_name", "state"), name="terminal_count_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="TerminalDayCount",
            fields=[
                _id(),
                ("day", models.DateField()),
                ("tenant_id", models.CharField(max_length=64)),
                ("tool_name", models.CharField(max_length=100)),
                ("state", models.CharField(max_length=20)),
                ("n", models.PositiveBigIntegerField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("day", "tenant_id", "tool_name", "state"),
                        name="terminal_day_unique",
                    )
                ],
            },
        ),
        # 0015_archive_retention
        migrations.CreateModel(
            name="Archive",
            fields=[
                _id(),
                ("name", models.CharField(max_length=100, unique=True)),
                ("location", models.CharField(max_length=1000)),
                ("manifest_sha256", models.CharField(max_length=64)),
                ("attempts", models.PositiveIntegerField()),
                ("events", models.PositiveIntegerField()),
                ("checkpoint_seq", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "ordering": ["created_at", "id"],
            },
        ),
        migrations.CreateModel(
            name="ArchivedAttempt",
            fields=[
                _id(),
                ("row_id", models.BigIntegerField(unique=True)),
                ("attempt_id", models.CharField(max_length=32, unique=True)),
                ("tenant_id", models.CharField(max_length=64)),
                ("tool_name", models.CharField(max_length=100)),
                ("idempotency_key", models.CharField(max_length=255)),
                ("provider_request_id", models.CharField(blank=True, default="", max_length=255)),
                ("state", models.CharField(max_length=20)),
                ("chain_length", models.PositiveIntegerField()),
                ("chain_head", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                ("archived_at", models.DateTimeField()),
                (
                    "archive",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="archived",
                        to="attempts.archive",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["idempotency_key"], name="archived_key_idx"),
                    models.Index(
                        condition=models.Q(("provider_request_id", ""), _negated=True),
                        fields=["provider_request_id"],
                        name="archived_request_idx",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="RetentionRule",
            fields=[
                _id(),
                ("archive_after_days", models.PositiveIntegerField()),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="retention_rules",
                        to="attempts.tenant",
                    ),
                ),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="retention_rules",
                        to="attempts.tool",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "tool"), name="retention_rule_unique")
                ],
            },
        ),
        migrations.RunPython(_install_guards, _guards_before_archives),
        # 0016_erasure_salted_chain
        migrations.RunPython(migrations.RunPython.noop, _install_guards),
        migrations.AddField(
            model_name="attempt",
            name="args_salt",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=64
            ),
        ),
        migrations.AddField(
            model_name="attemptevent",
            name="text_digest",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=64
            ),
        ),
        migrations.CreateModel(
            name="ErasureRequest",
            fields=[
                _id(),
                ("reason", models.TextField()),
                ("requested_at", models.DateTimeField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("erased", "Erased"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="pending",
                        max_length=10,
                    ),
                ),
                ("decided_at", models.DateTimeField(blank=True, null=True)),
                (
                    "attempt",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="erasures",
                        to="attempts.attempt",
                    ),
                ),
                (
                    "decided_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "requested_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("status", "pending")),
                        fields=("attempt",),
                        name="erasure_one_pending_per_attempt",
                    )
                ],
            },
        ),
        migrations.RunPython(_install_guards, _drop_sqlite_event_guards),
        # 0017_approval_append_only: the database refuses UPDATE and DELETE (and TRUNCATE on
        # PostgreSQL) of approvals, as of events. Backwards, their triggers go with the table.
        migrations.RunPython(_install_guards, migrations.RunPython.noop),
    ]
