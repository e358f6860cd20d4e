"""Helpers shared by the dashboard's screens: tenant scope, roles, the one get-attempt-or-404,
redaction (``attempts.redact``), and turning a ledger refusal into a clear answer."""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from attempts.ledger import LedgerError
from attempts.models import Attempt, has_role, highest_role, tenant_roles, tenants_where
from attempts.redact import REDACTED, redact, unredact

__all__ = ["REDACTED", "has_role", "redact", "tenant_roles", "unredact"]


def user_tenants(user: Any) -> list[str]:
    """The tenants whose attempts the user may see, sorted."""
    return tenants_where(user)


def max_role(user: Any) -> str | None:
    """The user's highest role in any tenant (decides which controls and links to show)."""
    return highest_role(user)


def get_attempt_for_user(user: Any, attempt_id: str) -> Attempt:
    """The attempt by public id if it belongs to one of the user's tenants; 404 otherwise
    (another tenant's attempt is indistinguishable from one that does not exist)."""
    if "\x00" in attempt_id or len(attempt_id) > 32:
        raise Http404("No such attempt.")
    attempt = (
        Attempt.objects.visible_to(user)
        .select_related("owner", "parent")
        .filter(attempt_id=attempt_id)
        .first()
    )
    if attempt is None:
        raise Http404("No such attempt.")
    return attempt


def refusal(
    request: HttpRequest, exc: LedgerError, *, redirect_to: str, target: str = "#action-feedback"
) -> HttpResponse:
    """Answer a ledger refusal: for htmx a 4xx fragment swapped into the page's feedback area,
    otherwise a redirect back with the message (never a 500)."""
    if request.htmx:
        response = render(
            request,
            "attempts/detail.html#feedback",
            {"feedback_error": exc.message, "feedback_code": exc.code},
            status=exc.status if 400 <= exc.status < 500 else 409,
        )
        return reswap(retarget(response, target), "innerHTML")
    messages.error(request, exc.message)
    return HttpResponseRedirect(redirect_to)


def done(request: HttpRequest, message: str, *, redirect_to: str) -> HttpResponse:
    """Answer a successful action: a message, and the page reloads (full page for htmx too, so
    every panel shows the new state and version)."""
    messages.success(request, message)
    if request.htmx:
        return HttpResponseClientRedirect(redirect_to)
    return HttpResponseRedirect(redirect_to)


def refuse_nul_bytes(view):
    """Answer 400 when any query or form value holds a NUL character: PostgreSQL cannot store
    or compare one, and no legitimate input contains it."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        for data in (request.GET, request.POST):
            for values in data.lists():
                if any("\x00" in value for value in values[1]) or "\x00" in values[0]:
                    return bad_request(request, "the request contains a NUL character")
        return view(request, *args, **kwargs)

    return wrapper


def bad_request(request: HttpRequest, message: str, *, status: int = 400) -> HttpResponse:
    """A clear 4xx page (or fragment for htmx) for input the dashboard cannot use."""
    if request.htmx:
        response = render(
            request,
            "attempts/detail.html#feedback",
            {"feedback_error": message, "feedback_code": "bad_request"},
            status=status,
        )
        return reswap(retarget(response, "#action-feedback"), "innerHTML")
    return render(request, "attempts/error.html", {"message": message}, status=status)


log = logging.getLogger("ledgerweb.dashboard")


def forbidden(request: HttpRequest, reason: str) -> HttpResponse:
    """A 403 page inside the layout that says why; one log line, no traceback (an ordinary
    refusal is not an error of the server)."""
    log.info("forbidden %s for %s: %s", request.path, request.user.get_username(), reason)
    if request.htmx:
        response = render(
            request,
            "attempts/detail.html#feedback",
            {"feedback_error": reason, "feedback_code": "forbidden"},
            status=403,
        )
        return reswap(retarget(response, "#action-feedback"), "innerHTML")
    return render(request, "403.html", {"exception": reason}, status=403)


def refuse_politely(view):
    """Turn a ``PermissionDenied`` raised by the view into ``forbidden`` (Django would log the
    refusal with its traceback)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return forbidden(request, str(exc) or "your role does not allow this")

    return wrapper
