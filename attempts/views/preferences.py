"""A person's own settings: time zone, which notices they get and how, the daily digest."""

from __future__ import annotations

import zoneinfo

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from attempts.models import NoticeKind, PersonSettings
from attempts.timezones import remember, zone_named
from attempts.views._common import bad_request, refuse_nul_bytes


def _zones() -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if "/" in z or z == "UTC")


@require_http_methods(["GET", "POST"])
@refuse_nul_bytes
def preferences(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: save it (only the person's own row)."""
    prefs = PersonSettings.of(request.user)
    if request.method == "POST":
        zone = request.POST.get("time_zone", "UTC").strip()
        if zone_named(zone) is None:
            return bad_request(request, f"{zone!r} is not a time zone (try Europe/Berlin or UTC)")
        kinds = request.POST.getlist("kinds")
        if any(k not in NoticeKind.values for k in kinds):
            return bad_request(request, "unknown kind of notice")
        hour = request.POST.get("digest_hour", "").strip()
        if hour and (not hour.isdigit() or not 0 <= int(hour) <= 23):
            return bad_request(request, "the digest hour is 0 to 23, or empty for no digest")
        prefs.time_zone = zone
        prefs.email = request.POST.get("email") == "on"
        prefs.chat = request.POST.get("chat") == "on"
        # Every kind ticked is the same as "everything", stored as the empty list.
        prefs.kinds = [] if set(kinds) == set(NoticeKind.values) else kinds
        prefs.digest_hour = int(hour) if hour else None
        prefs.save()
        remember(request, zone)
        messages.success(request, "Settings saved.")
        return HttpResponseRedirect(reverse("preferences"))
    return render(
        request,
        "attempts/preferences.html",
        {
            "prefs": prefs,
            "zones": _zones(),
            "kinds": [(k, label, prefs.wants(k)) for k, label in NoticeKind.choices],
            "hours": range(24),
        },
    )
