"""Which attempts a retention rule moves: settled (terminal) and sealed, of the rule's tenant
and tool, last changed more than ``archive_after_days`` ago, with no linked attempt left in the
database (a linked attempt points to its parent: the parent waits until its children are
archived, on a later run) and no erasure request pending (archived, its text would be where
erasure cannot reach: it waits for the decision)."""

from __future__ import annotations

import datetime as dt

from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from attempts.models import TERMINAL_STATES, Attempt, ErasureRequest, RetentionRule


def eligible(
    *, tenant: str, tool: str, days: int, now: dt.datetime | None = None
) -> QuerySet[Attempt]:
    """The attempts the rule (tenant, tool, days) archives at ``now``."""
    cutoff = (now or timezone.now()) - dt.timedelta(days=days)
    children = Attempt.objects.filter(parent_id=OuterRef("pk"))
    pending = ErasureRequest.objects.filter(
        attempt_id=OuterRef("pk"), status=ErasureRequest.Status.PENDING
    )
    return Attempt.objects.filter(
        tenant_id=tenant,
        tool_name=tool,
        state__in=list(TERMINAL_STATES),
        sealed=True,
        updated_at__lt=cutoff,
    ).exclude(Exists(children) | Exists(pending))


def eligible_for(rule: RetentionRule, now: dt.datetime | None = None):
    return eligible(tenant=rule.tenant_id, tool=rule.tool_id, days=rule.archive_after_days, now=now)


def eligible_count(*, tenant: str, tool: str, days: int) -> int:
    return eligible(tenant=tenant, tool=tool, days=days).count()
