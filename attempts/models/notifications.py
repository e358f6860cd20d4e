"""A person's shift: preferences, notices (an outbox the worker delivers), routes, Slack
messages with Approve / Reject buttons, and SLAs with their escalations.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from attempts.models.attempts import Attempt, State
from attempts.models.roles import Tenant
from attempts.models.tools import Tool


class NoticeKind(models.TextChoices):
    ASSIGNED = "assigned", "Work assigned to me"
    MANUAL_REVIEW = "manual_review", "An attempt I own entered MANUAL_REVIEW"
    APPROVAL = "approval", "An approval waits for me"
    SLA_BREACH = "sla_breach", "An SLA breach escalated to me"
    DIGEST = "digest", "Daily digest"


class PersonSettings(models.Model):
    """One person's dashboard and notification preferences (defaults when there is no row)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_settings"
    )
    time_zone = models.CharField(max_length=64, default="UTC")
    email = models.BooleanField(default=True, help_text="Send my notices by email.")
    chat = models.BooleanField(default=True, help_text="Send my notices to the chat webhook.")
    kinds = models.JSONField(
        default=list, blank=True, help_text="Kinds of notice I want (empty: every kind)."
    )
    digest_hour = models.PositiveSmallIntegerField(
        null=True, blank=True, default=8, help_text="Local hour of the daily digest (empty: none)."
    )

    def __str__(self) -> str:
        return f"settings of {self.user}"

    @classmethod
    def of(cls, user: Any) -> PersonSettings:
        """The person's settings, or unsaved defaults."""
        found = cls.objects.filter(user_id=user.pk).first()
        return found if found is not None else cls(user_id=user.pk)

    def wants(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


class NoticeStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    DEAD = "dead", "Given up"


class NotificationRoute(models.Model):
    """Who else is told of notices about matching attempts: the people on call for a tenant or a
    tool, beside the owner or reviewer a notice is for. Each person's own preferences (channels,
    kinds) still apply, and only people with a role in the attempt's tenant are told."""

    name = models.SlugField(max_length=64, unique=True)
    tenant_pattern = models.CharField(max_length=100, default="*")
    tool_pattern = models.CharField(max_length=100, default="*")
    # NoticeKind values this route carries; empty: every kind about an attempt.
    kinds = models.JSONField(default=list, blank=True)
    people = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="notification_routes", blank=True
    )
    active = models.BooleanField(default=True)
    # A Slack channel's id: held calls this route matches are posted there with Approve / Reject
    # buttons (attempts/slack.py), beside the notices to the route's people.
    slack_channel = models.CharField(
        max_length=80,
        blank=True,
        default="",
        help_text="Slack channel id (C...) where held calls this route matches are posted with "
        "Approve / Reject buttons (empty: none).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"route {self.name} ({self.tenant_pattern}/{self.tool_pattern})"

    def matches(self, kind: str, tenant: str, tool: str) -> bool:
        from fnmatch import fnmatchcase

        return (
            self.active
            and (not self.kinds or kind in self.kinds)
            and fnmatchcase(tenant, self.tenant_pattern)
            and fnmatchcase(tool, self.tool_pattern)
        )


class Notification(models.Model):
    """One notice to one person on one channel: the outbox row the worker delivers.

    Enqueued with a ``dedupe_key`` (unique), so whatever enqueues twice enqueues once. Delivered
    under a lease (``claim_token``, ``lease_until``): a worker killed mid-send leaves the row
    pending and another claims it when the lease ends. The ``notice_id`` goes out with every
    delivery (email Message-ID, webhook header and body) so a receiver can drop the copy a crash
    between "sent" and "recorded as sent" can produce.
    """

    dedupe_key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=20, choices=NoticeKind.choices)
    channel = models.CharField(max_length=10)  # email | chat
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_notices"
    )
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    subject = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(
        max_length=10, choices=NoticeStatus.choices, default=NoticeStatus.PENDING
    )
    created_at = models.DateTimeField()
    next_try_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="notice_due_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["recipient", "created_at"], name="notice_recipient_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.recipient_id} by {self.channel} ({self.status})"

    @property
    def notice_id(self) -> str:
        return f"ledgerweb-notice-{self.pk}"


class NotifyCursor(models.Model):
    """How far the notifier has read the attempts' history (one row, name ``events``)."""

    name = models.CharField(max_length=40, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} read to event {self.last_event_id}"


class SlackIdentity(models.Model):
    """A Slack user an administrator verified as one ledger user: a click on an Approve or
    Reject button by this Slack user decides as ``user`` (attempts/slack.py). Without a row, a
    Slack user is mapped only by an email Slack confirmed that equals the email of exactly one
    active ledger user who signs in through the identity provider."""

    team_id = models.CharField(max_length=40)
    slack_user_id = models.CharField(max_length=40)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slackidentity_unique"
            )
        ]
        verbose_name_plural = "Slack identities"

    def __str__(self) -> str:
        return f"Slack {self.team_id}/{self.slack_user_id} is {self.user}"


class SlackMessage(models.Model):
    """The interactive message about one held attempt in one Slack channel: an outbox row like
    ``Notification``. ``wanted`` goes up whenever what the message should show changes (it was
    held, approved, decided, expired); the worker posts or updates it under a lease and records
    the revision it showed in ``shown``, so a change while it was posting is posted again."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="slack_messages")
    channel = models.CharField(max_length=80)
    ts = models.CharField(max_length=40, blank=True, default="")
    wanted = models.PositiveIntegerField(default=1)
    shown = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    dead = models.BooleanField(default=False)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "channel"], name="slackmessage_unique")
        ]
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="slackmessage_due_idx",
                condition=Q(shown__lt=F("wanted"), dead=False),
            )
        ]

    def __str__(self) -> str:
        return f"Slack message about {self.attempt_id} in {self.channel}"


class SlackRequest(models.Model):
    """Interaction requests from Slack seen recently (their signature, and the click's own id):
    a request sent again is refused. Rows older than the signature's five minutes go."""

    key = models.CharField(max_length=200, unique=True)
    received_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"Slack request {self.key[:20]} at {self.received_at}"


class SlaPolicy(models.Model):
    """How old UNKNOWN and MANUAL_REVIEW work may grow for a tool (optionally one tenant only).

    Past ``*_warn_after`` an age shows amber, past ``*_breach_after`` red, and a breach is
    escalated once to ``escalate_to`` (else the default owner) unless someone acknowledged it.
    The most specific policy wins: tenant and tool, then tool for every tenant.
    """

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="sla_policies")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="sla_policies"
    )
    unknown_warn_after = models.DurationField(default=dt.timedelta(hours=1))
    unknown_breach_after = models.DurationField(default=dt.timedelta(hours=4))
    review_warn_after = models.DurationField(default=dt.timedelta(hours=4))
    review_breach_after = models.DurationField(default=dt.timedelta(hours=24))
    escalate_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tool", "tenant"],
                name="sla_unique_tool_tenant",
                condition=Q(tenant__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["tool"], name="sla_unique_tool", condition=Q(tenant__isnull=True)
            ),
        ]
        verbose_name = "SLA policy"
        verbose_name_plural = "SLA policies"

    def __str__(self) -> str:
        return f"SLA {self.tool_id}/{self.tenant_id or '*'}"

    def thresholds(self, state: str) -> tuple[dt.timedelta, dt.timedelta] | None:
        """(warn after, breach after) for a state, None for states without an SLA."""
        if state == State.UNKNOWN:
            return self.unknown_warn_after, self.unknown_breach_after
        if state == State.MANUAL_REVIEW:
            return self.review_warn_after, self.review_breach_after
        return None

    @classmethod
    def table(cls) -> dict[tuple[str, str | None], SlaPolicy]:
        """Every policy by (tool, tenant or None)."""
        return {(p.tool_id, p.tenant_id): p for p in cls.objects.all()}

    @staticmethod
    def pick(
        table: dict[tuple[str, str | None], SlaPolicy], tool: str, tenant: str
    ) -> SlaPolicy | None:
        """The one home of "which SLA applies": tenant-specific first, then the tool's."""
        return table.get((tool, tenant)) or table.get((tool, None))

    @staticmethod
    def level(policy: SlaPolicy | None, state: str, age: dt.timedelta) -> str:
        """'' (no SLA or in time), 'warn' or 'breach'."""
        limits = policy.thresholds(state) if policy is not None else None
        if limits is None:
            return ""
        warn, breach = limits
        if age >= breach:
            return "breach"
        if age >= warn:
            return "warn"
        return ""


class SlaEscalation(models.Model):
    """An SLA breach of one attempt in one state: escalated once, acknowledged by a person."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="sla_escalations")
    state = models.CharField(max_length=20)
    escalated_to = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    escalated_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "state"], name="sla_escalation_unique")
        ]

    def __str__(self) -> str:
        return f"SLA {self.attempt_id} {self.state}"
