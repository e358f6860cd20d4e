"""The overview screen (the dashboard's home): what needs attention, where, and since when.

Counts of the states that need people (UNKNOWN, MANUAL_REVIEW) and of in-flight work are exact
and live while the live backlog is small (up to ``counts.LIVE_EXACT`` attempts): a range count on
the (state, tenant, tool, owner) index. A larger backlog, and the terminal states, which hold
almost every row of a busy ledger, are read from what the reconcile worker's count pass keeps
(attempts/counts.py), and shown with the time they were taken. Before its first pass the
terminal counts are counted here only up to ``TERMINAL_UPTO`` each (one bounded index range per
state, at most once a minute per tenant set), a larger live backlog up to ``counts.LIVE_EXACT``
per state, and both are shown as "at least"; the tables by tenant and tool and the chart wait
for the pass (the queues are live): a page load never counts the whole ledger, nor the whole
backlog.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts import counts
from attempts.models import ATTENTION_STATES, TERMINAL_STATES, Attempt, State
from attempts.views._common import user_tenants

LIVE_STATES = tuple(s for s in State.values if s not in TERMINAL_STATES)
TERMINAL_TTL = 60
CHART_DAYS = 14
# Before the worker's first count pass, each terminal state is counted up to this many.
TERMINAL_UPTO = 10_000


def _terminal_counts(
    tenants: list[str], now: dt.datetime
) -> tuple[dict[str, int], dt.datetime, set[str]]:
    """Counts of the terminal states for these tenants, each up to TERMINAL_UPTO (one bounded
    range of the (tenant, state) index per state), cached for a minute; and the states that
    have more."""
    key = "overview:terminal:" + ",".join(tenants)
    cached = cache.get(key)
    if cached is not None:
        return cached["counts"], cached["at"], set(cached["more"])
    found: dict[str, int] = {}
    more: set[str] = set()
    for state in sorted(TERMINAL_STATES):
        n = (
            Attempt.objects.filter(tenant_id__in=tenants, state=state)
            .order_by()
            .values("id")[: TERMINAL_UPTO + 1]
            .count()
        )
        found[state] = min(n, TERMINAL_UPTO)
        if n > TERMINAL_UPTO:
            more.add(state)
    cache.set(key, {"counts": found, "at": now, "more": sorted(more)}, TERMINAL_TTL)
    return found, now, more


def _terminal_counts_kept(
    tenants: list[str], now: dt.datetime
) -> tuple[dict[str, int], dt.datetime, bool, set[str]]:
    """Terminal counts as the reconcile worker's count pass keeps them (attempts/counts.py):
    a few summary rows whatever the size of the ledger. Before its first pass they are counted
    here up to TERMINAL_UPTO each (cached for a minute). The flag says which; the set names
    the states with more than were counted."""
    kept = counts.terminal_counts(tenants)
    if kept is not None:
        return kept[0], kept[1], True, set()
    found, at, more = _terminal_counts(tenants, now)
    return found, at, False, more


def _chart(live: counts.Live, now: dt.datetime) -> dict[str, Any]:
    """Open UNKNOWN and MANUAL_REVIEW work by the day it was recorded, last CHART_DAYS days,
    as a small server-rendered SVG bar chart (no script)."""
    today = now.astimezone(dt.UTC).date()
    start_day = today - dt.timedelta(days=CHART_DAYS - 1)
    per_day: dict[str, list[int]] = {state: [0] * CHART_DAYS for state in ATTENTION_STATES}
    for day, _, _, state, _, n in live.rows:
        i = (day - start_day).days
        if state in per_day and 0 <= i < CHART_DAYS:
            per_day[state][i] += n
    width, height, gap = 560, 150, 4
    bar_w = (width - gap * (CHART_DAYS - 1)) / CHART_DAYS
    top = max(
        [per_day[State.UNKNOWN][i] + per_day[State.MANUAL_REVIEW][i] for i in range(CHART_DAYS)]
        + [1]
    )
    bars = []
    for i in range(CHART_DAYS):
        unknown = per_day[State.UNKNOWN][i]
        review = per_day[State.MANUAL_REVIEW][i]
        h_u = height * unknown / top
        h_r = height * review / top
        x = i * (bar_w + gap)
        day = start_day + dt.timedelta(days=i)
        bars.append(
            {
                "x": round(x, 1),
                "w": round(bar_w, 1),
                "y_u": round(height - h_u, 1),
                "h_u": round(h_u, 1),
                "y_r": round(height - h_u - h_r, 1),
                "h_r": round(h_r, 1),
                "unknown": unknown,
                "review": review,
                "label": day.strftime("%d %b"),
                "short": day.strftime("%d"),
                "label_x": round(x + bar_w / 2, 1),
            }
        )
    return {"bars": bars, "width": width, "height": height, "top": top}


def _my_open_work(user: Any, tenants: list[str]) -> list[dict[str, Any]]:
    return list(
        Attempt.objects.visible_to(user)
        .filter(owner_id=user.pk, state__in=ATTENTION_STATES)
        .order_by("created_at", "id")
        .values("attempt_id", "tenant_id", "tool_name", "state", "created_at", "review_reason")[:10]
    )


def _work_row(counts_by_state: dict[str, int]) -> dict[str, int]:
    """A tenant's or a tool's row: its UNKNOWN, its MANUAL_REVIEW, and the rest of its live
    work."""
    return {
        "unknown": counts_by_state[State.UNKNOWN],
        "review": counts_by_state[State.MANUAL_REVIEW],
        "in_flight": sum(counts_by_state[s] for s in LIVE_STATES if s not in ATTENTION_STATES),
    }


def overview_context(user: Any, now: dt.datetime) -> dict[str, Any]:
    """What the overview shows this person, at ``now``."""
    tenants = user_tenants(user)
    live = counts.live_counts(tenants)
    by_state: dict[str, int] = defaultdict(int)
    by_tenant: dict[str, dict[str, int]] = {t: defaultdict(int) for t in tenants}
    by_tool: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    unassigned, unassigned_more = live.unowned
    for _, tenant, tool, state, unowned, n in live.rows:
        by_state[state] += n
        by_tenant[tenant][state] += n
        by_tool[tool][state] += n
        if state == State.UNKNOWN and unowned:
            unassigned += n
    live_more: set[str] = set()
    for state, (n, more) in (live.bounded or {}).items():
        by_state[state] = n
        if more:
            live_more.add(state)
    terminal, terminal_at, terminal_kept, terminal_more = _terminal_counts_kept(tenants, now)
    tool_rows = sorted(
        ({"tool": tool, **_work_row(c)} for tool, c in by_tool.items()),
        key=lambda r: (-(r["unknown"] + r["review"]), r["tool"]),
    )
    # A bounded backlog is not broken down by tenant (nor by tool, nor by day) until the pass.
    tenant_rows = (
        [] if live.bounded else [{"tenant": t, **_work_row(c)} for t, c in by_tenant.items()]
    )
    state_rows = [
        {"state": s, "n": by_state.get(s, 0), "live": True, "more": s in live_more}
        for s in LIVE_STATES
    ] + [
        {"state": s, "n": terminal.get(s, 0), "live": False, "more": s in terminal_more}
        for s in sorted(TERMINAL_STATES)
    ]
    return {
        "tenants": tenants,
        "state_rows": state_rows,
        "tenant_rows": tenant_rows,
        "tool_rows": tool_rows,
        "terminal_at": terminal_at,
        "terminal_kept": terminal_kept,
        "terminal_upto": TERMINAL_UPTO,
        **_for_this_person(user, now),
        "my_work": _my_open_work(user, tenants),
        "unassigned_unknown": unassigned,
        "unassigned_more": unassigned_more,
        "chart": None if live.bounded else _chart(live, now),
        "live_at": live.at,
        "live_bounded": live.bounded is not None,
        "live_exact": counts.LIVE_EXACT,
        "now": now,
        "unknown_total": by_state.get(State.UNKNOWN, 0),
        "unknown_more": State.UNKNOWN in live_more,
        "review_total": by_state.get(State.MANUAL_REVIEW, 0),
        "review_more": State.MANUAL_REVIEW in live_more,
        # Approval before dispatch: held work, and what this person may approve now.
        "held_total": by_state.get(State.AWAITING_APPROVAL, 0),
        "held_more": State.AWAITING_APPROVAL in live_more,
    }


def _for_this_person(user: Any, now: dt.datetime) -> dict[str, Any]:
    """The oldest UNKNOWN this person can see, their own open work by state, and what waits
    for their approval."""
    oldest = (
        Attempt.objects.visible_to(user)
        .filter(state=State.UNKNOWN)
        .aggregate(oldest=Min("created_at"))["oldest"]
    )
    my_counts = dict(
        Attempt.objects.visible_to(user)
        .filter(owner_id=user.pk, state__in=ATTENTION_STATES)
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    held_me, held_me_more = Attempt.objects.held_for(user, "me", now).count_upto()
    return {
        "oldest_unknown": oldest,
        "oldest_unknown_age": (now - oldest) if oldest else None,
        "my_counts": {
            "unknown": my_counts.get(State.UNKNOWN, 0),
            "review": my_counts.get(State.MANUAL_REVIEW, 0),
        },
        "awaiting_me": Attempt.objects.awaiting_approval_of(user).count(),
        "held_me": held_me,
        "held_me_more": held_me_more,
    }


@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    """Counts by state, tenant and tool; the oldest UNKNOWN; my open work; the last days."""
    context = overview_context(request.user, timezone.now())
    if request.htmx:
        return render(request, "attempts/overview.html#panels", context)
    return render(request, "attempts/overview.html", context)
