"""Who owns an attempt that needs attention (UNKNOWN or MANUAL_REVIEW)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from django.conf import settings
from django.contrib.auth import get_user_model

from attempts.models import OwnershipRule


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
