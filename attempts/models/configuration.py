"""The history of configuration changes that decide authority or review: one hash chain of its
own, and who may read which change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q

from attempts.models.events import ActorKind
from attempts.models.querysets import LedgerQuerySet
from attempts.models.roles import Role, tenants_where

if TYPE_CHECKING:
    from attempts.models.attempts import Attempt


# Config-history subjects that concern one tenant (the tenant is in the subject's key).
TENANT_SUBJECT_KINDS = (
    "tenant",
    "membership",
    "grant",
    "sso_group",
    "sla_policy",
    "retention_rule",
)


class ConfigEventQuerySet(LedgerQuerySet):
    def visible_to(self, user: Any) -> ConfigEventQuerySet:
        """The one home of who may read which configuration changes: a superuser every one; a
        reviewer or admin of a tenant that tenant's (its row, memberships, grants, SSO group
        roles, SLA policies) and tools' and SLAs-for-every-tenant's, which concern every
        tenant alike. Changes that span tenants and name them (people, groups, SSO identities,
        agent tokens, ownership rules' patterns) are for superusers. Nobody else sees any."""
        if user is None or not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self.all()
        tenants = tenants_where(user, Role.REVIEWER)
        if not tenants:
            return self.none()
        seen = (
            Q(subject__startswith="tool:")
            | Q(subject="authority")
            | (Q(subject__startswith="sla_policy:") & Q(subject__endswith="/*"))
            | Q(subject__in=self._policies_concerning(set(tenants)))
        )
        for tenant in tenants:
            seen |= (
                Q(subject=f"tenant:{tenant}")
                | Q(subject__startswith=f"membership:{tenant}/")
                | Q(subject__startswith=f"grant:{tenant}/")
                | Q(subject__startswith=f"retention_rule:{tenant}/")
                | (
                    (Q(subject__startswith="sso_group:") | Q(subject__startswith="sla_policy:"))
                    & Q(subject__endswith=f"/{tenant}")
                )
            )
        return self.filter(seen)

    def _policies_concerning(self, tenants: set[str]) -> list[str]:
        """Approval policies' subjects whose recorded tenants (before or after any change) are
        every tenant (an empty list) or include one of ``tenants``: a policy names its tenants
        in its values, not in its subject."""
        found = set()
        rows = ConfigEvent.objects.filter(subject__startswith="approval_policy:")
        for subject, before, after in rows.values_list("subject", "before", "after"):
            for values in (before, after):
                if isinstance(values, dict) and (
                    not values.get("tenants") or tenants & set(values["tenants"])
                ):
                    found.add(subject)
        return sorted(found)

    def affecting(self, attempt: Attempt) -> ConfigEventQuerySet:
        """Changes to what decides the attempt's authority or review: its tenant, its tool, the
        tenant's grant for the tool, and ownership rules (which may match any attempt)."""
        return self.filter(
            Q(subject=f"tenant:{attempt.tenant_id}")
            | Q(subject=f"tool:{attempt.tool_name}")
            | Q(subject=f"grant:{attempt.tenant_id}/{attempt.tool_name}")
            | Q(subject__startswith="ownership_rule:")
            | Q(subject=f"approval_policy:{attempt.approval_policy_id or ''}")
        )


class ConfigEvent(models.Model):
    """One change to configuration that decides authority or review (tenants, tools, grants,
    ownership rules, users and roles), with who made it. Append-only and hash-chained like
    attempt history, in one chain of its own that checkpoints seal (attempts/chain.py)."""

    subject = models.CharField(max_length=200)
    action = models.CharField(max_length=64)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor = models.CharField(max_length=150)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    seq = models.PositiveIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = ConfigEventQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["subject", "seq"], name="configevent_subject_idx")]

    def __str__(self) -> str:
        return f"{self.seq} {self.subject} {self.action}"
