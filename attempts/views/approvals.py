"""The approvals inbox: intents an approval policy holds before dispatch (protocol section 11).

Tabs: awaiting me (what I may approve now), my group (policies naming an identity-provider group
I am in), all (every held attempt in my tenants); oldest first, coloured by how much of the
policy's maximum wait has passed. Each item shows the arguments, the policy and the values its
condition saw; approve and reject are POSTs with CSRF that call ``review.approve_held`` /
``review.reject_held``, which check the policy's role and group.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from attempts import review
from attempts.ledger import InvalidIntent, LedgerError
from attempts.models import Approval, ApprovalPolicy, Attempt
from attempts.templatetags.ledger_ui import duration
from attempts.views._common import (
    bad_request,
    done,
    get_attempt_for_user,
    redact,
    refusal,
    refuse_nul_bytes,
)
from attempts.views.detail import pretty_json

TABS = {
    "me": "Awaiting me",
    "group": "My group",
    "all": "All held",
}
PAGE_SIZE = 50


def _item(attempt: Attempt, policies: dict[str, ApprovalPolicy], user: Any, now) -> dict:
    policy = policies[attempt.approval_policy_id]
    first = attempt.events.order_by("id").first()
    held = (first.details or {}).get("approval", {}) if first else {}
    verdict = Approval.verdict(attempt, now)
    shown_args, _ = redact(attempt.args)
    shown_values, _ = redact(held.get("values", {}))
    age = now - attempt.created_at
    may, why = policy.may_approve(user, attempt.tenant_id)
    return {
        "attempt": attempt,
        "policy": policy,
        "held": held,
        "values": shown_values,
        "args_pretty": pretty_json(shown_args),
        "verdict": verdict,
        "age_text": duration(age),
        "wait_left": duration(max(attempt.created_at + policy.max_wait - now, age * 0)),
        "sla": policy.sla_level(age),
        "may_decide": may and (first is None or first.actor != user.get_username()),
        "why_not": why,
        "version": attempt.version,
        "seen_event": attempt.last_event_id(),
    }


@require_GET
@refuse_nul_bytes
def inbox(request: HttpRequest) -> HttpResponse:
    """The inbox page: one tab, one page of items, oldest first."""
    which = request.GET.get("tab", "me")
    if which not in TABS:
        return bad_request(request, f"there is no tab {which!r}: choose me, group or all")
    raw_page = request.GET.get("page", "1")
    if not raw_page.isdigit() or not 1 <= int(raw_page) <= 10_000:
        return bad_request(request, "page must be a whole number from 1")
    page = int(raw_page)
    now = timezone.now()
    held = Attempt.objects.held_for(request.user, which, now).select_related("owner")
    tenant = request.GET.get("tenant", "")
    if tenant:
        held = held.filter(tenant_id=tenant)
    rows = list(held[(page - 1) * PAGE_SIZE : page * PAGE_SIZE + 1])
    policies = {p.name: p for p in ApprovalPolicy.objects.all()}
    items = [_item(a, policies, request.user, now) for a in rows[:PAGE_SIZE]]
    here = reverse("approvals")
    params = {"tab": which, **({"tenant": tenant} if tenant else {})}
    return render(
        request,
        "attempts/approvals.html",
        {
            "tabs": [
                (key, title, Attempt.objects.held_for(request.user, key, now).count())
                for key, title in TABS.items()
            ],
            "tab": which,
            "items": items,
            "tenant": tenant,
            "page": page,
            "next_url": here + "?" + urlencode({**params, "page": page + 1})
            if len(rows) > PAGE_SIZE
            else "",
            "prev_url": here + "?" + urlencode({**params, "page": page - 1}) if page > 1 else "",
        },
    )


def _seen(request: HttpRequest) -> review.Seen | None:
    version, event = request.POST.get("expected_version", ""), request.POST.get("seen_event", "")
    if not version.isdigit() or (event and not event.isdigit()):
        return None
    return review.Seen(int(version), int(event) if event else None)


def _back(request: HttpRequest) -> str:
    tab = request.POST.get("tab", "me")
    return reverse("approvals") + "?" + urlencode({"tab": tab if tab in TABS else "me"})


@require_POST
@refuse_nul_bytes
def approve(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Approve a held attempt with an optional comment."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    seen = _seen(request)
    if seen is None:
        return bad_request(request, "the form did not say which version you saw; reload the page")
    try:
        after = review.approve_held(
            attempt, user=request.user, comment=request.POST.get("comment", ""), seen=seen
        )
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=_back(request))
    if after.state == "INTENT_RECORDED":
        message = f"Approved {attempt_id}: enough approvals, it may be sent now."
    else:
        message = f"Approval of {attempt_id} recorded; it needs another person's approval."
    return done(request, message, redirect_to=_back(request))


@require_POST
@refuse_nul_bytes
def reject(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Reject a held attempt: FAILED with the reason given."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    seen = _seen(request)
    if seen is None:
        return bad_request(request, "the form did not say which version you saw; reload the page")
    reason = request.POST.get("reason", "").strip()
    if not reason:
        return refusal(
            request,
            InvalidIntent("say why you reject it: the agent and the history keep the reason"),
            redirect_to=_back(request),
        )
    try:
        review.reject_held(attempt, user=request.user, reason=reason, seen=seen)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=_back(request))
    return done(
        request, f"Rejected {attempt_id} (FAILED): it will not be sent.", redirect_to=_back(request)
    )
