"""What every dashboard page needs to draw its navigation: which screens this person's roles
may open (links to screens that would answer 403 are not shown)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from attempts.models import Attempt, Role, highest_role
from attempts.models.roles import admin_everywhere


def navigation(request: HttpRequest) -> dict[str, Any]:
    """``nav``: the links the person may follow, computed once per request."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": {}}
    top = highest_role(user)
    return {
        "nav": {
            "queues": Role.can_view(top),
            "audit": Role.can_review(top) or admin_everywhere(user),
            "admin": user.is_staff,
            # Counted only when a page draws the navigation (the template calls it), bounded.
            "approvals_waiting": lambda: Attempt.objects.held_for(user, "me").count_upto(),
        }
    }
