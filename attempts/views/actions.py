"""What people do to an attempt: take, assign, unassign, note, mark confirmed, mark failed,
approve a linked retry (or a prepared linked attempt), reject.

Every action is a POST with CSRF, finds the attempt within the user's tenants (404 otherwise),
and calls one ``attempts.review`` function, which checks the role, compares what the form saw
(``expected_version`` and ``seen_event``, see ``review.Seen``) and records the acting user in the
history. When the attempt really changed under the form, the form comes back with what was typed
and a list of the changes; other refusals are shown with their message (a 4xx fragment for htmx,
a redirect with the message otherwise).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from attempts import ledger, owners, review
from attempts.ledger import LedgerError
from attempts.models import Attempt, Role
from attempts.review import Seen, StaleForm
from attempts.views._common import (
    bad_request,
    done,
    get_attempt_for_user,
    has_role,
    refusal,
    refuse_nul_bytes,
)
from attempts.views.detail import (
    approval_kind,
    approval_preview,
    args_diff_for,
    detail_context,
)


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


def _seen(request: HttpRequest) -> Seen:
    """What the form saw: the version, and the newest event it showed (optional)."""
    version = _expected_version(request)
    raw = request.POST.get("seen_event", "")
    if not raw:
        return Seen(version)
    try:
        event_id = int(raw)
    except ValueError:
        raise MissingVersion("seen_event must be a number") from None
    if event_id < 0:
        raise MissingVersion("seen_event must not be negative")
    return Seen(version, event_id)


# The fields each decision form keeps when it comes back after a conflict.
TYPED_FIELDS = {
    "take": (),
    "assign": ("owner",),
    "unassign": (),
    "confirm": ("result_ref", "evidence"),
    "fail": ("reason",),
    "reject": ("reason",),
    "acknowledge": ("comment",),
}


FORM_FLAG = {
    "take": "can_take",
    "assign": "can_assign",
    "unassign": "can_unassign",
    "confirm": "can_confirm",
    "fail": "can_fail",
    "reject": "can_reject",
    "acknowledge": "can_ack",
}


def stale_form(request: HttpRequest, exc: StaleForm, form: str, attempt_id: str) -> HttpResponse:
    """The form again (htmx: just the form; otherwise the whole page), with what was typed,
    fresh version fields, and what changed since it was rendered. Status 409."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    context = detail_context(request, attempt)
    if not context[FORM_FLAG[form]]:
        # The form no longer applies (the attempt moved on): say what happened instead.
        return refusal(request, exc, redirect_to=_detail_url(attempt))
    context.update(
        {
            "typed": {name: request.POST.get(name, "") for name in TYPED_FIELDS[form]},
            "conflict_form": form,
            "conflict_changes": [
                review.describe_change(e, viewer=request.user.get_username()) for e in exc.changes
            ],
            "conflict_message": exc.message,
        }
    )
    template = f"attempts/detail.html#form_{form}" if request.htmx else "attempts/detail.html"
    return render(request, template, context, status=409)


def _act(request: HttpRequest, form: str, attempt_id: str, work, message: str) -> HttpResponse:
    """Run one review action and answer it: done, the form again after a real conflict, or
    the refusal's message."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    url = _detail_url(attempt)
    try:
        work(attempt)
    except StaleForm as exc:
        return stale_form(request, exc, form, attempt_id)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)
    return done(request, message, redirect_to=url)


def _detail_url(attempt: Attempt) -> str:
    return reverse("attempt-detail", args=[attempt.attempt_id])


@require_POST
@refuse_nul_bytes
def take(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Assign the attempt to myself."""
    return _act(
        request,
        "take",
        attempt_id,
        lambda a: review.assign(a, user=request.user, owner=request.user, seen=_seen(request)),
        "You own this attempt now.",
    )


@require_POST
@refuse_nul_bytes
def assign(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Give the attempt to another person (an operator or above in its tenant)."""
    get_attempt_for_user(request.user, attempt_id)
    username = request.POST.get("owner", "").strip()
    owner = owners.active_person(username)
    if owner is None:
        return bad_request(request, f"there is no active user called {username!r}")
    return _act(
        request,
        "assign",
        attempt_id,
        lambda a: review.assign(a, user=request.user, owner=owner, seen=_seen(request)),
        f"Assigned to {owner.get_username()}.",
    )


@require_POST
@refuse_nul_bytes
def unassign(request: HttpRequest, attempt_id: str) -> HttpResponse:
    return _act(
        request,
        "unassign",
        attempt_id,
        lambda a: review.assign(a, user=request.user, owner=None, seen=_seen(request)),
        "Nobody owns this attempt now.",
    )


@require_POST
@refuse_nul_bytes
def note(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """A note changes nothing anyone decided on: no version check."""
    return _act(
        request,
        "note",
        attempt_id,
        lambda a: review.add_note(a, user=request.user, text=request.POST.get("text", "")),
        "Note added.",
    )


@require_POST
@refuse_nul_bytes
def acknowledge(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Acknowledge an SLA warning or breach (the owner does not change)."""
    return _act(
        request,
        "acknowledge",
        attempt_id,
        lambda a: review.acknowledge_sla(
            a, user=request.user, comment=request.POST.get("comment", "")
        ),
        "SLA acknowledged: it will not escalate again.",
    )


@require_POST
@refuse_nul_bytes
def mark_confirmed(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """A reviewer confirms the effect happened: a result reference and evidence are required."""
    return _act(
        request,
        "confirm",
        attempt_id,
        lambda a: review.review_confirm(
            a,
            user=request.user,
            result_ref=request.POST.get("result_ref", ""),
            evidence=request.POST.get("evidence", ""),
            seen=_seen(request),
        ),
        "Marked OUTCOME_CONFIRMED.",
    )


@require_POST
@refuse_nul_bytes
def mark_failed(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """A reviewer declares the effect not done: a reason is required."""
    return _act(
        request,
        "fail",
        attempt_id,
        lambda a: review.review_fail(
            a, user=request.user, reason=request.POST.get("reason", ""), seen=_seen(request)
        ),
        "Marked FAILED.",
    )


@require_POST
@refuse_nul_bytes
def reject(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Reject a linked attempt that waits for approval: it becomes FAILED with the reason."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    if not attempt.awaiting_approval:
        return refusal(
            request,
            ledger.StateConflict("this attempt is not waiting for approval; use Mark failed"),
            redirect_to=_detail_url(attempt),
        )
    reason = request.POST.get("reason", "").strip()
    return _act(
        request,
        "reject",
        attempt_id,
        lambda a: review.review_fail(
            a,
            user=request.user,
            reason=f"linked attempt rejected: {reason}" if reason else "",
            seen=_seen(request),
        ),
        "Linked attempt rejected (FAILED).",
    )


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
        approvals = attempt.approvers_since_last_move()
        return render(
            request,
            "attempts/approve.html",
            {
                "attempt": attempt,
                "preview": preview,
                "approvals": approvals,
                "already_approved": request.user.get_username() in approvals,
                "last_event_id": attempt.last_event_id(),
                "diff": args_diff_for(request.user, attempt),
            },
        )
    try:
        return _approved(request, attempt, kind, preview)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=url)


def _approved(request: HttpRequest, attempt: Attempt, kind: str, preview: dict) -> HttpResponse:
    """The reviewer's approval of what the preview showed, and what it led to."""
    url = _detail_url(attempt)
    seen = _seen(request)
    comment = request.POST.get("comment", "")
    if request.POST.get("fingerprint", "") != preview["fingerprint"]:
        raise ledger.StateConflict(
            "what would be sent changed since you opened the preview (authority, key or "
            "arguments); review the new preview before approving",
            code="preview_changed",
        )
    if kind == "linked_retry":
        child = review.approve_linked_retry(attempt, user=request.user, seen=seen, comment=comment)
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
    result = review.approve_linked_attempt(attempt, user=request.user, seen=seen, comment=comment)
    if result.state == attempt.state:
        return done(
            request,
            "Your approval is recorded. This tool is critical: a second, different reviewer "
            "must approve before it is sent.",
            redirect_to=url,
        )
    return done(request, "Linked attempt approved: recovery will send it now.", redirect_to=url)
