"""What every dashboard page needs to draw its navigation: which screens this person's roles
may open (links to screens that would answer 403 are not shown)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from attempts.models import ROLE_RANK, Role, tenant_roles


def navigation(request: HttpRequest) -> dict[str, Any]:
    """``nav``: the links the person may follow, computed once per request."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": {}}
    ranks = [ROLE_RANK[r] for r in tenant_roles(user).values()]
    top = max(ranks) if ranks else -1
    return {
        "nav": {
            "queues": top >= ROLE_RANK[Role.VIEWER],
            "audit": top >= ROLE_RANK[Role.REVIEWER] or user.is_superuser,
            "admin": user.is_staff,
        }
    }
