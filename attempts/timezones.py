"""Times in each person's own time zone (``PersonSettings.time_zone``, UTC by default)."""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

SESSION_KEY = "ledgerweb_tz"


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone called ``name`` (an IANA name such as Europe/Berlin), or None."""
    if not name or len(name) > 64:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def remember(request: HttpRequest, name: str) -> None:
    """Keep the person's zone in the session (set at log-in and when they change it)."""
    request.session[SESSION_KEY] = name


class TimeZoneMiddleware:
    """Activate the person's time zone for the request (templates show local times)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        name = None
        if request.user.is_authenticated:
            name = request.session.get(SESSION_KEY)
            if name is None:
                from attempts.models import PersonSettings

                name = PersonSettings.of(request.user).time_zone
                remember(request, name)
        zone = zone_named(name or "")
        if zone is not None:
            timezone.activate(zone)
        else:
            timezone.deactivate()
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
