"""The approvals inbox: intents an approval policy holds before dispatch (protocol section 11).

Tabs: awaiting me (what I may approve now), my group (policies naming an identity-provider group
I am in), all (every held attempt in my tenants); oldest first, coloured by how much of the
policy's maximum wait has passed. Each item shows the arguments, the policy and the values its
condition saw; approve and reject are POSTs with CSRF that call ``review.approve_held`` /
``review.reject_held``, which check the policy's role and group. Several items are decided at
once with ``review.decide_held_many`` (a result per item), and ``edit`` lets an approver correct
the arguments (``review.edit_and_approve``) after seeing what differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.db.models import Max, Min
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from attempts import review, states
from attempts.ledger import InvalidIntent, LedgerError, StateConflict
from attempts.models import (
    ATTEMPT_ID,
    ApprovalPolicy,
    Attempt,
    AttemptEvent,
    State,
    read_people,
)
from attempts.money import known_currency, to_minor
from attempts.templatetags.ledger_ui import duration
from attempts.views._common import (
    REDACTED,
    bad_request,
    done,
    get_attempt_for_user,
    redact,
    refusal,
    refuse_nul_bytes,
    unredact,
)
from attempts.views.detail import linked_diff, pretty_json

TABS = {
    "me": "Awaiting me",
    "group": "My group",
    "all": "All held",
}
PAGE_SIZE = 50


def _items(attempts: list[Attempt], user: Any, now) -> list[dict]:
    """A page of items, read at once: the page costs the same few queries for 1 item or 50."""
    policies = {p.name: p for p in ApprovalPolicy.objects.all()}
    verdicts = Attempt.approval_verdicts(attempts, now)
    ends = (
        AttemptEvent.objects.filter(attempt_id__in=[a.pk for a in attempts])
        .values("attempt_id")
        .annotate(first=Min("id"), last=Max("id"))
    )
    first_ids = {row["attempt_id"]: row["first"] for row in ends}
    last_ids = {row["attempt_id"]: row["last"] for row in ends}
    firsts = AttemptEvent.objects.in_bulk(list(first_ids.values()))
    return [
        _item(
            attempt,
            policies[attempt.approval_policy_id],
            verdicts[attempt.pk],
            firsts.get(first_ids.get(attempt.pk)),
            last_ids.get(attempt.pk, 0),
            user,
            now,
        )
        for attempt in attempts
    ]


def _item(attempt: Attempt, policy, verdict, first, last_event: int, user: Any, now) -> dict:
    held = (first.details or {}).get("approval", {}) if first else {}
    shown_args, _ = redact(attempt.args)
    shown_values, _ = redact(held.get("values", {}))
    age = now - attempt.created_at
    may, why = review.may_decide_held(user, attempt, policy, fresh=False)
    return {
        # One person counts once: whoever's approval already counts may still reject.
        "approved_by_me": user.get_username() in verdict.valid,
        "attempt": attempt,
        "policy": policy,
        "held": held,
        "values": shown_values,
        "args_pretty": pretty_json(shown_args),
        "verdict": verdict,
        "age_text": duration(age),
        "wait_left": duration(max(attempt.created_at + policy.max_wait - now, age * 0)),
        "waited_pct": min(100, int(100 * age / policy.max_wait)) if policy.max_wait else 0,
        "sla": policy.sla_level(age),
        "may_decide": may,
        "why_not": why,
        "version": attempt.version,
        "seen_event": last_event,
        "edited_from": _edited_from(attempt, first, user),
    }


def _edited_from(attempt: Attempt, first: Any, user: Any) -> dict[str, Any] | None:
    """For a linked attempt an edit-and-approve made: the original, who corrected it and what
    differs (shown to the second approver)."""
    if not attempt.parent_id or first is None or "edited_from" not in (first.details or {}):
        return None
    parent = Attempt.objects.visible_to(user).filter(pk=attempt.parent_id).first()
    if parent is None:
        return None
    return {
        "parent": parent,
        "editor": first.actor,
        "diff": {
            "before_label": f"original {parent.attempt_id}",
            "after_label": "corrected",
            "rows": linked_diff(parent, attempt),
        },
    }


SORTS = {
    "oldest": ("created_at", "id"),
    "newest": ("-created_at", "-id"),
    "amount": ("-amount_minor", "created_at", "id"),
    "amount_asc": ("amount_minor", "created_at", "id"),
}


class InboxFilters:
    """The inbox's filters and sort, from the URL: tenant, tool, policy, a currency with an
    amount range (in that currency's units), and the order."""

    def __init__(self, get: Any) -> None:
        self.tenant = get.get("tenant", "").strip()[:64]
        self.tool = get.get("tool", "").strip()[:100]
        self.policy = get.get("policy", "").strip()[:100]
        self.currency = get.get("currency", "").strip().upper()[:3]
        self.sort = get.get("sort", "oldest")
        self.amount_min = get.get("amount_min", "").strip()
        self.amount_max = get.get("amount_max", "").strip()
        if self.sort not in SORTS:
            raise InvalidIntent(f"sort by one of {', '.join(SORTS)}, not {self.sort!r}")
        if self.currency and not known_currency(self.currency):
            raise InvalidIntent(f"{self.currency!r} is not a currency (ISO 4217, e.g. EUR)")
        if (self.amount_min or self.amount_max or self.sort in ("amount", "amount_asc")) and not (
            self.currency
        ):
            raise InvalidIntent("choose a currency to filter or sort by amount")
        self.minor_range = [self._minor(v, name) for v, name in self._bounds()]

    def _bounds(self) -> list[tuple[str, str]]:
        return [(self.amount_min, "the lowest amount"), (self.amount_max, "the highest amount")]

    def _minor(self, text: str, name: str) -> int | None:
        if not text:
            return None
        try:
            return to_minor(text, self.currency)
        except ValueError as exc:
            raise InvalidIntent(f"{name} {exc}") from None

    def apply(self, held: Any) -> Any:
        held = held.where_given(
            tenant_id=self.tenant, tool_name=self.tool, approval_policy_id=self.policy
        )
        if self.currency:
            held = held.with_amount().filter(amount_currency=self.currency)
            low, high = self.minor_range
            if low is not None:
                held = held.filter(amount_minor__gte=low)
            if high is not None:
                held = held.filter(amount_minor__lte=high)
        return held.order_by(*SORTS[self.sort])

    def params(self) -> dict[str, str]:
        values = {
            "tenant": self.tenant,
            "tool": self.tool,
            "policy": self.policy,
            "currency": self.currency,
            "amount_min": self.amount_min,
            "amount_max": self.amount_max,
            "sort": "" if self.sort == "oldest" else self.sort,
        }
        return {name: value for name, value in values.items() if value}


@require_GET
@refuse_nul_bytes
def inbox(request: HttpRequest) -> HttpResponse:
    """The inbox page: one tab, one page of held calls as compact rows (oldest first unless
    sorted), filtered by tenant, tool, policy and amount."""
    which = request.GET.get("tab", "me")
    if which not in TABS:
        return bad_request(request, f"there is no tab {which!r}: choose me, group or all")
    raw_page = request.GET.get("page", "1")
    if not raw_page.isdigit() or not 1 <= int(raw_page) <= 10_000:
        return bad_request(request, "page must be a whole number from 1")
    try:
        filters = InboxFilters(request.GET)
    except InvalidIntent as exc:
        return bad_request(request, exc.message)
    page = int(raw_page)
    now = timezone.now()
    read_people([request.user])  # fresh, once: the tabs, the list and each item's controls
    by_tab = {key: Attempt.objects.held_for(request.user, key, now) for key in TABS}
    held = filters.apply(by_tab[which].select_related("owner"))
    rows = list(held[(page - 1) * PAGE_SIZE : page * PAGE_SIZE + 1])
    items = _items(rows[:PAGE_SIZE], request.user, now)
    bulk_results = request.session.pop(BULK_RESULTS, None)
    kept = set(request.session.pop(BULK_KEPT, []))
    for item in items:
        item["picked"] = item["attempt"].attempt_id in kept
    here = reverse("approvals")
    params = {"tab": which, **filters.params()}
    visible = by_tab["all"]  # the filters offer what is held in the person's tenants
    return render(
        request,
        "attempts/approvals.html",
        {
            "tabs": [(key, title, *by_tab[key].count_upto()) for key, title in TABS.items()],
            "tab": which,
            "items": items,
            "bulk_results": bulk_results,
            "bulk_comment": request.session.pop(BULK_COMMENT, ""),
            "filters": filters,
            "choices": {
                "tenants": sorted(
                    visible.order_by().values_list("tenant_id", flat=True).distinct()
                ),
                "tools": sorted(visible.order_by().values_list("tool_name", flat=True).distinct()),
                "policies": sorted(ApprovalPolicy.objects.values_list("name", flat=True)),
            },
            "sort_urls": {key: here + "?" + urlencode({**params, "sort": key}) for key in SORTS},
            "tab_query": urlencode(filters.params()),
            "page": page,
            "next_url": here + "?" + urlencode({**params, "page": page + 1})
            if len(rows) > PAGE_SIZE
            else "",
            "prev_url": here + "?" + urlencode({**params, "page": page - 1}) if page > 1 else "",
        },
    )


def _seen(request: HttpRequest) -> review.Seen | None:
    """What the form showed: the attempt's version and newest event, its args hash and its
    policy's version (the last two optional for older pages)."""
    post = request.POST
    return _parse_seen(
        post.get("expected_version", ""),
        post.get("seen_event", ""),
        post.get("args_hash", ""),
        post.get("policy_version", ""),
    )


def _parse_seen(version: str, event: str, args_hash: str, policy_version: str):
    if not version.isdigit() or (event and not event.isdigit()):
        return None
    if policy_version and not policy_version.isdigit():
        return None
    if len(version) > 18 or len(event) > 18 or len(policy_version) > 9 or len(args_hash) > 64:
        return None
    return review.Seen(
        int(version),
        int(event) if event else None,
        args_hash=args_hash or None,
        policy_version=int(policy_version) if policy_version else None,
    )


def _back(request: HttpRequest) -> str:
    tab = request.POST.get("tab", "me")
    return reverse("approvals") + "?" + urlencode({"tab": tab if tab in TABS else "me"})


def _decide(
    request: HttpRequest,
    attempt_id: str,
    decision: Callable[[Attempt, review.Seen], HttpResponse],
) -> HttpResponse:
    """One person's decision on one held attempt, against the version they saw; a refusal
    sends them back to the inbox with the reason."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    seen = _seen(request)
    if seen is None:
        return bad_request(request, "the form did not say which version you saw; reload the page")
    try:
        return decision(attempt, seen)
    except LedgerError as exc:
        return refusal(request, exc, redirect_to=_back(request))


@require_POST
@refuse_nul_bytes
def approve(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Approve a held attempt with an optional comment."""

    def approved(attempt: Attempt, seen: review.Seen) -> HttpResponse:
        after = review.approve_held(
            attempt, user=request.user, comment=request.POST.get("comment", ""), seen=seen
        )
        if after.state == "INTENT_RECORDED":
            message = f"Approved {attempt_id}: enough approvals, it may be sent now."
        else:
            message = f"Approval of {attempt_id} recorded; it needs another person's approval."
        return done(request, message, redirect_to=_back(request))

    return _decide(request, attempt_id, approved)


@require_POST
@refuse_nul_bytes
def reject(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Reject a held attempt: FAILED with the reason given."""

    def rejected(attempt: Attempt, seen: review.Seen) -> HttpResponse:
        reason = request.POST.get("reason", "").strip()
        if not reason:
            raise InvalidIntent("say why you reject it: the agent and the history keep the reason")
        review.reject_held(attempt, user=request.user, reason=reason, seen=seen)
        return done(
            request,
            f"Rejected {attempt_id} (FAILED): it will not be sent.",
            redirect_to=_back(request),
        )

    return _decide(request, attempt_id, rejected)


BULK_RESULTS = "approval_bulk_results"
BULK_KEPT = "approval_bulk_kept"
BULK_COMMENT = "approval_bulk_comment"


@require_POST
@refuse_nul_bytes
def bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject the selected held attempts with one comment (a reason, to reject):
    each checked and decided on its own (``review.decide_held_many``); the inbox then shows a
    result per item."""
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "reject"):
        return bad_request(request, "choose approve or reject")
    picks: list[tuple[str, review.Seen]] = []
    malformed: list[review.HeldDecision] = []
    for raw in request.POST.getlist("pick"):
        attempt_id, *parts = raw.split(":")
        seen = _parse_seen(*parts) if len(parts) == 4 else None
        if seen is None:
            malformed.append(review.HeldDecision(attempt_id[:32], "refused", "malformed item"))
        else:
            picks.append((attempt_id[:32], seen))
    if not picks and not malformed:
        return refusal(
            request, InvalidIntent("select at least one held attempt"), redirect_to=_back(request)
        )
    try:
        results = malformed + (
            review.decide_held_many(
                picks,
                user=request.user,
                decision=decision,
                comment=request.POST.get("comment", ""),
            )
            if picks
            else []
        )
    except LedgerError as exc:
        # Refused as a whole (no reason to reject with, too many): nothing was decided, and the
        # inbox keeps the selection so the person adds what was missing and decides again.
        request.session[BULK_KEPT] = [attempt_id for attempt_id, _ in picks]
        request.session[BULK_COMMENT] = request.POST.get("comment", "")[:2000]
        return refusal(request, exc, redirect_to=_back(request))
    request.session[BULK_RESULTS] = [
        {
            "attempt_id": r.attempt_id,
            "outcome": r.outcome,
            "message": r.message,
            "link": bool(ATTEMPT_ID.fullmatch(r.attempt_id)) and r.message != "not found",
        }
        for r in results
    ]
    done_count = sum(r.outcome != "refused" for r in results)
    verb = "Approved" if decision == "approve" else "Rejected"
    return done(
        request,
        f"{verb} {done_count} of {len(results)}; the result of each is below.",
        redirect_to=_back(request),
    )


def _parse_args(text: str) -> Any:
    """The JSON a person typed, or InvalidIntent saying where it is wrong."""
    if len(text) > 1_000_000:
        raise InvalidIntent("the arguments are too long to be recorded", code="args_too_large")
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidIntent(
            "the arguments nest too deeply to be recorded", code="invalid_args"
        ) from None
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if hasattr(exc, "lineno") else ""
        raise InvalidIntent(
            f"the arguments are not valid JSON: {getattr(exc, 'msg', exc)}{where}",
            code="invalid_json",
        ) from None


def _edit_context(request: HttpRequest, attempt: Any, policy: ApprovalPolicy) -> dict[str, Any]:
    """What the editor shows: the original arguments (secrets redacted) and, on a POST, what
    was typed."""
    shown, redacted = redact(attempt.args)
    context: dict[str, Any] = {
        "attempt": attempt,
        "policy": policy,
        "original_pretty": pretty_json(shown),
        "redacted": redacted,
        "redacted_mark": REDACTED,
        "args_text": pretty_json(shown),
        "comment": "",
        "version": attempt.version,
        "seen_event": attempt.last_event_id(),
        "needed": policy.approvals_for(attempt.tool_name),
    }
    if request.method == "POST":
        context.update(
            args_text=request.POST.get("args", ""),
            comment=request.POST.get("comment", ""),
            version=request.POST.get("expected_version", ""),
            seen_event=request.POST.get("seen_event", ""),
        )
    return context


def _corrected(request: HttpRequest, attempt: Any, child: Any) -> HttpResponse:
    """The correction is made: where it continues, and whether it may be sent now."""
    if child.state == State.INTENT_RECORDED:
        told = "it is approved and may be sent now"
    else:
        verdict = child.approval_verdict()
        told = (
            f"your approval is 1 of the {verdict.needed} it needs: another person "
            "must approve it before it is sent"
        )
    return done(
        request,
        f"Corrected: {attempt.attempt_id} is RECONCILED and continues in linked attempt "
        f"{child.attempt_id}; {told}.",
        redirect_to=reverse("attempt-detail", args=[child.attempt_id]),
    )


@require_http_methods(["GET", "POST"])
@refuse_nul_bytes
def edit(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Edit-and-approve. GET: the held attempt's arguments in an editor. POST ``step=preview``:
    the corrected arguments checked and what differs from the original, with the policy the
    linked attempt would wait under. POST ``step=confirm``: ``review.edit_and_approve`` with
    exactly the previewed arguments; the linked attempt's page follows."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    back = reverse("attempt-detail", args=[attempt.attempt_id])
    if attempt.approval_policy_id is None or attempt.state != State.AWAITING_APPROVAL:
        return refusal(
            request,
            StateConflict(f"nothing to edit: the attempt is {attempt.state}, not held"),
            redirect_to=back,
        )
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    context = _edit_context(request, attempt, policy)
    may, why = review.may_decide_held(request.user, attempt, policy)
    if not may:
        context.update(error=why, error_code="forbidden", refused=True)
        return render(request, "attempts/approvals_edit.html", context, status=403)
    if request.method == "GET":
        return render(request, "attempts/approvals_edit.html", context)
    seen = _seen(request)
    step = request.POST.get("step", "preview")
    try:
        if seen is None:
            raise InvalidIntent("the form did not say which version you saw; reload the page")
        value = unredact(_parse_args(context["args_text"]), attempt.args)
        if step == "confirm":
            child = review.edit_and_approve(
                attempt,
                user=request.user,
                args=value,
                comment=context["comment"],
                seen=seen,
                previewed_args_hash=request.POST.get("preview_hash", "") or "-",
            )
        else:
            preview = review.edit_preview(attempt, args=value)
    except LedgerError as exc:
        context.update(error=exc.message, error_code=exc.code)
        return render(request, "attempts/approvals_edit.html", context, status=exc.status)
    except states.TransitionError as exc:
        context.update(error=str(exc), error_code=getattr(exc, "code", "conflict"))
        return render(request, "attempts/approvals_edit.html", context, status=409)
    if step == "confirm":
        return _corrected(request, attempt, child)
    context.update(
        preview=preview,
        preview_args_pretty=pretty_json(redact(preview["args"])[0]),
        diff={
            "before_label": "original",
            "after_label": "corrected",
            "rows": linked_diff(attempt, preview),
        },
    )
    return render(request, "attempts/approvals_edit.html", context)
