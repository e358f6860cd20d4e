"""The overview's counts by day, tenant, tool and state, as the worker's count pass last found
them (attempts/counts.py).
"""

from __future__ import annotations

from django.db import models


class AttemptCount(models.Model):
    """How many attempts of a tenant's tool are in ``state`` (``n``), as the count pass found
    them: what every count row says; each kind adds what it is counted by."""

    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    state = models.CharField(max_length=20)
    n = models.PositiveBigIntegerField()

    class Meta:
        abstract = True


class TerminalDayCount(AttemptCount):
    """How many attempts recorded on ``day`` (UTC) rest in terminal ``state``, per tenant and
    tool, as the reconcile worker's count pass last found them (``attempts.counts``). Terminal
    states are final, so a day's counts change only while it still holds live work."""

    day = models.DateField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant_id", "tool_name", "state"], name="terminal_day_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class TerminalCount(AttemptCount):
    """The terminal counts summed over every day, per tenant, tool and state: what the overview
    reads (a few rows per tenant, whatever the size of the ledger)."""

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "tool_name", "state"], name="terminal_count_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class LiveDayCount(AttemptCount):
    """How many live (not terminal) attempts recorded on ``day`` (UTC) are in ``state``, per
    tenant, tool and whether anyone owns them, as the count pass last found them. The overview
    reads these instead of counting a live backlog too large to count per request
    (``attempts.counts.LIVE_EXACT``); below that size it counts live work itself."""

    day = models.DateField()
    unowned = models.BooleanField()

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class TerminalCountPass(models.Model):
    """The one row saying when the terminal counts were taken and how many live attempts each
    day held then (what the next pass compares to find the days it must count again)."""

    counted_at = models.DateTimeField()
    live_by_day = models.JSONField(default=dict)
    seconds = models.FloatField(default=0.0)
    days_counted = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"terminal counts as of {self.counted_at}"
