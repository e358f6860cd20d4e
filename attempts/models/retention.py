"""What leaves the database: retention rules, archives and the attempts they hold
(reconciliation/archive, docs/archive.md), and requests to erase an attempt's data.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from attempts.models.roles import Tenant, tenants_where
from attempts.models.tools import Tool


class ErasureRequest(models.Model):
    """A request to erase an attempt's arguments and free text (four eyes): one person asks,
    with a reason; a different person approves, and then ``attempts.erasure`` erases. The
    erasure itself is an event in the attempt's history; this row keeps who asked and when."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ERASED = "erased", "Erased"
        CANCELLED = "cancelled", "Cancelled"

    attempt = models.ForeignKey("Attempt", on_delete=models.PROTECT, related_name="erasures")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField()
    requested_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt"],
                condition=Q(status="pending"),
                name="erasure_one_pending_per_attempt",
            )
        ]

    def __str__(self) -> str:
        return f"erasure of {self.attempt_id} ({self.status})"


class RetentionRule(models.Model):
    """How long one tenant's settled, sealed attempts of one tool stay in the database:
    ``ledgerweb archive run`` moves those whose last change is older than ``archive_after_days``
    to an archive file with their receipts, then removes them. Configuration as code
    (``[[retention_rules]]``), recorded in the configuration history."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="retention_rules")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="retention_rules")
    archive_after_days = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool"], name="retention_rule_unique")
        ]

    def __str__(self) -> str:
        return f"retention {self.tenant_id}/{self.tool_id}: {self.archive_after_days} days"


class Archive(models.Model):
    """One archive written by ``ledgerweb archive run``: where it is, the SHA-256 of its
    manifest (also recorded in the configuration history), what it holds and the signed
    checkpoint its receipts prove inclusion in. Append-only (attempts/history_guard.py)."""

    name = models.CharField(max_length=100, unique=True)
    location = models.CharField(max_length=1000)
    manifest_sha256 = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    checkpoint_seq = models.PositiveIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"archive {self.name}"


class ArchivedAttemptQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> ArchivedAttemptQuerySet:
        """Tenant scoping, as for attempts (``tenants_where``)."""
        return self.filter(tenant_id__in=tenants_where(user))

    def matching(self, term: str) -> ArchivedAttemptQuerySet:
        """Archived attempts whose attempt id, idempotency key or provider request id is
        ``term`` exactly."""
        term = term.strip()
        if not term:
            return self.none()
        return self.filter(
            Q(attempt_id=term) | Q(idempotency_key=term) | Q(provider_request_id=term)
        )


class ArchivedAttempt(models.Model):
    """An attempt removed from the database after it was archived: which archive holds it, and
    the identifiers a search may ask for. ``row_id`` is the attempt's database id: the events'
    append-only trigger lets exactly the events of these rows be deleted, and nothing else.
    Append-only itself (attempts/history_guard.py)."""

    row_id = models.BigIntegerField(unique=True)
    attempt_id = models.CharField(max_length=32, unique=True)
    archive = models.ForeignKey(Archive, on_delete=models.PROTECT, related_name="archived")
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=255)
    provider_request_id = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=20)
    # The outcome's durable reference, answered to an agent that replays the key after the
    # attempt was archived (``RecordedKey``). NULL: archived before this column was kept (the
    # archive file has it). Nullable so the column is added without rewriting the table.
    result_ref = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    chain_length = models.PositiveIntegerField()
    chain_head = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    archived_at = models.DateTimeField()

    objects = ArchivedAttemptQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["idempotency_key"], name="archived_key_idx"),
            models.Index(
                fields=["provider_request_id"],
                name="archived_request_idx",
                condition=~Q(provider_request_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_id} in {self.archive_id}"
