"""Who owns an attempt that needs attention (UNKNOWN or MANUAL_REVIEW), and who is told when
such an attempt breaches its SLA."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q

from attempts.models import OwnershipRule, Role, has_role


def owner_id_for(tenant: str, tool_name: str) -> int | None:
    """The first ownership rule (by priority) matching tenant and tool, else the default owner."""
    for rule in OwnershipRule.objects.filter(owner__is_active=True).only(
        "tenant_pattern", "tool_pattern", "owner_id"
    ):
        if fnmatchcase(tenant, rule.tenant_pattern) and fnmatchcase(tool_name, rule.tool_pattern):
            return rule.owner_id
    default = settings.LEDGER["DEFAULT_OWNER"]
    if default:
        return (
            get_user_model()
            .objects.filter(username=default, is_active=True)
            .values_list("id", flat=True)
            .first()
        )
    return None


def reviewers_of(tenant: str) -> list[Any]:
    """The active people who may review the tenant's attempts, by username."""
    users = (
        get_user_model()
        .objects.filter(is_active=True)
        .filter(Q(ledger_memberships__tenant_id=tenant) | Q(is_superuser=True))
    )
    return [u for u in users.distinct().order_by("username") if has_role(u, tenant, Role.REVIEWER)]


def default_owner() -> Any | None:
    """The active person ``LEDGERWEB_DEFAULT_OWNER`` names, if any."""
    name = settings.LEDGER["DEFAULT_OWNER"]
    return get_user_model().objects.filter(username=name, is_active=True).first() if name else None


def told_of_breach(attempt: Any, named: Any | None) -> list[Any]:
    """Who hears that ``attempt`` breached its SLA: the person the policy names (else the
    default owner) and the attempt's owner, each only if they belong to its tenant; when neither
    can hear it, the tenant's reviewers, so a breach never goes unheard."""
    candidates = [named if named is not None else default_owner(), attempt.owner]
    told: list[Any] = []
    for person in candidates:
        if (
            person is not None
            and person.is_active
            and person not in told
            and has_role(person, attempt.tenant_id, Role.VIEWER)
        ):
            told.append(person)
    return told or reviewers_of(attempt.tenant_id)
