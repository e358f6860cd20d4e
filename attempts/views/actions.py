"""What people do to an attempt: take, assign, unassign, note, mark confirmed, mark failed,
approve a linked retry (or a prepared linked attempt), reject.

Every action is a POST with CSRF, finds the attempt within the user's tenants (404 otherwise),
and calls one ``attempts.ledger`` function, which checks the role, compares the version the user
was looking at (``expected_version``) and records the acting user in the history. A refusal is
shown with its message: a 4xx fragment for htmx, a redirect with the message otherwise.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from attempts import ledger
from attempts.ledger import LedgerError
from attempts.models import Attempt, Role
from attempts.views._common import (
    bad_request,
    done,
    get_attempt_for_user,
    has_role,
    refusal,
    refuse_nul_bytes,
)
from attempts.views.detail import approval_kind, approval_preview, approvals_so_far


class MissingVersion(LedgerError):
    code = "bad_request"
    status = 400


def _expected_version(request: HttpRequest) -> int:
    raw = request.POST.get("expected_version", "")
    try:
        value = int(raw)
    except ValueError:
        raise MissingVersion(
            "the form did not say which version of the attempt you were looking at; reload the page"
        ) from None
    if value < 1:
        raise MissingVersion("expected_version must be a positive number")
    return value


def _detail_url(attempt: Attempt) -> str:
    return reverse("attempt-detail", args=[attempt.attempt_id])


@require_POST
@refuse_nul_bytes
def take(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Assign the attempt to myself."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        ledger.assign(
            attempt,
            user=request.user,
            owner=request.user,
            expected_version=_expected_version(request),
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "You own this attempt now.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def assign(request: HttpRequest, attempt_id: str) -> HttpResponse:
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    username = request.POST.get("owner", "").strip()
    owner = get_user_model().objects.filter(username=username, is_active=True).first()
    if owner is None:
        return bad_request(request, f"there is no active user called {username!r}")
    try:
        ledger.assign(
            attempt, user=request.user, owner=owner, expected_version=_expected_version(request)
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, f"Assigned to {owner.get_username()}.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def unassign(request: HttpRequest, attempt_id: str) -> HttpResponse:
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        ledger.assign(
            attempt, user=request.user, owner=None, expected_version=_expected_version(request)
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "Nobody owns this attempt now.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def note(request: HttpRequest, attempt_id: str) -> HttpResponse:
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        ledger.add_note(attempt, user=request.user, text=request.POST.get("text", ""))
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "Note added.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def mark_confirmed(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """A reviewer confirms the effect happened: a result reference and evidence are required."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        ledger.review_confirm(
            attempt,
            user=request.user,
            result_ref=request.POST.get("result_ref", ""),
            evidence=request.POST.get("evidence", ""),
            expected_version=_expected_version(request),
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "Marked OUTCOME_CONFIRMED.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def mark_failed(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """A reviewer declares the effect not done: a reason is required."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        ledger.review_fail(
            attempt,
            user=request.user,
            reason=request.POST.get("reason", ""),
            expected_version=_expected_version(request),
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "Marked FAILED.", redirect_to=url)


@require_POST
@refuse_nul_bytes
def reject(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Reject a linked attempt that waits for approval: it becomes FAILED with the reason."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    if not attempt.awaiting_approval:
        return refusal(
            request,
            ledger.StateConflict("this attempt is not waiting for approval; use Mark failed"),
            redirect_to=url,
        )
    reason = request.POST.get("reason", "").strip()
    try:
        ledger.review_fail(
            attempt,
            user=request.user,
            reason=f"linked attempt rejected: {reason}" if reason else "",
            expected_version=_expected_version(request),
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, "Linked attempt rejected (FAILED).", redirect_to=url)


@require_http_methods(["GET", "POST"])
@refuse_nul_bytes
def approve(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """GET: a preview of exactly what approving will record and send. POST: approve it, if the
    preview is still what would be sent (same fingerprint) and the version is unchanged."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    if not has_role(request.user, attempt.tenant_id, Role.REVIEWER):
        return refusal(
            request,
            ledger.NotAllowed(f"this needs the reviewer role in tenant {attempt.tenant_id}"),
            redirect_to=url,
        )
    kind = approval_kind(attempt)
    if not kind:
        return refusal(
            request,
            ledger.StateConflict(
                f"nothing to approve: the attempt is {attempt.state}", code="state_conflict"
            ),
            redirect_to=url,
        )
    try:
        preview = approval_preview(attempt)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    if request.method == "GET":
        if not has_role(request.user, attempt.tenant_id, Role.REVIEWER):
            return refusal(
                request,
                ledger.NotAllowed(
                    f"approving needs the reviewer role in tenant {attempt.tenant_id}"
                ),
                redirect_to=url,
            )
        events = list(attempt.events.order_by("id"))
        approvals = approvals_so_far(events)
        return render(
            request,
            "attempts/approve.html",
            {
                "attempt": attempt,
                "preview": preview,
                "approvals": approvals,
                "already_approved": request.user.get_username() in approvals,
            },
        )
    try:
        expected = _expected_version(request)
        if request.POST.get("fingerprint", "") != preview["fingerprint"]:
            raise ledger.StateConflict(
                "what would be sent changed since you opened the preview (authority, key or "
                "arguments); review the new preview before approving",
                code="preview_changed",
            )
        if kind == "linked_retry":
            child = ledger.approve_linked_retry(
                attempt, user=request.user, expected_version=expected
            )
            if child is None:
                return done(
                    request,
                    "Your approval is recorded. This tool is critical: a second, different "
                    "reviewer must approve before the linked retry is created.",
                    redirect_to=url,
                )
            return done(
                request,
                f"Linked retry approved: {child.attempt_id} will be sent with key "
                f"{child.idempotency_key}.",
                redirect_to=_detail_url(child),
            )
        result = ledger.approve_linked_attempt(
            attempt, user=request.user, expected_version=expected
        )
        if result.state == attempt.state:
            return done(
                request,
                "Your approval is recorded. This tool is critical: a second, different reviewer "
                "must approve before it is sent.",
                redirect_to=url,
            )
        return done(request, "Linked attempt approved: recovery will send it now.", redirect_to=url)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
