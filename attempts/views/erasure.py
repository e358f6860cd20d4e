"""The erasure action on the attempt page (admins only, four eyes): ask for the erasure of an
attempt's arguments and free text with a reason, approve another admin's request, or withdraw
it. Each is a POST that finds the attempt within the user's tenants (404 otherwise) and calls
one ``attempts.erasure`` function, which checks the role and the rules."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from attempts import erasure
from attempts.ledger import LedgerError
from attempts.models import Attempt
from attempts.views._common import done, get_attempt_for_user, refusal, refuse_nul_bytes


def erasure_context(user: Any, attempt: Attempt) -> dict[str, Any]:
    """What the attempt page shows of erasure: only to admins of the attempt's tenant."""
    if not erasure.has_role(user, attempt.tenant_id, erasure.ERASURE_ROLE):
        return {"erasure": None}
    pending = erasure.pending_request(attempt)
    return {
        "erasure": {
            "refusal": erasure.erasure_refusal(attempt),
            "pending": pending,
            "mine": pending is not None and pending.requested_by_id == user.pk,
        }
    }


# What each step of the action does, and what the person is told when it is done.
STEPS = {
    "request": (
        lambda attempt, request: erasure.request_erasure(
            attempt, user=request.user, reason=request.POST.get("reason", "")
        ),
        "Erasure requested: another admin must approve it.",
    ),
    "approve": (
        lambda attempt, request: erasure.approve_erasure(attempt, user=request.user),
        "Erased: the arguments and free text are gone; the history still verifies.",
    ),
    "cancel": (
        lambda attempt, request: erasure.cancel_erasure(attempt, user=request.user),
        "Erasure request withdrawn.",
    ),
}


@require_POST
@refuse_nul_bytes
def erasure_step(request: HttpRequest, attempt_id: str, step: str) -> HttpResponse:
    """Ask for the erasure (a second admin approves), approve another admin's request (the
    arguments and free text are erased now), or withdraw the pending request."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = reverse("attempt-detail", args=[attempt.attempt_id])
    work, message = STEPS[step]
    try:
        work(attempt, request)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url, target="#erasure-feedback")
    return done(request, message, redirect_to=url)
