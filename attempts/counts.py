"""The overview's terminal counts, kept by the reconcile worker instead of counted per request.

Terminal states (OUTCOME_CONFIRMED, FAILED, RECONCILED) are final and hold almost every row of a
busy ledger. Counting them on each request (even once a minute) reads the whole ledger, so the
worker's count pass (``refresh``, every ``COUNT_EVERY`` seconds) keeps them per day of
recording, tenant, tool and state (``TerminalDayCount``) and their sums (``TerminalCount``),
which is all the overview reads.

Why a pass need not count every day: an attempt is recorded with the time of its recording and
never leaves a terminal state, so the terminal counts of a day before yesterday change only when
one of that day's live attempts settles, and then that day's number of live attempts falls. Each
pass reads the live attempts per day first (live work is the small part of the ledger: the
overview already counts it on every request), then counts again the days whose live number
changed since the pass before, and every day since the day before that pass (new work, and
writes that committed late). Nothing is written on the agents' write path and no writer waits
for the pass. A ledger loaded behind the write path's back (a restore, an import with old
times) needs ``refresh(full=True)``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from attempts.locking import named_lock, write_transaction
from attempts.models import (
    TERMINAL_STATES,
    Attempt,
    State,
    TerminalCount,
    TerminalCountPass,
    TerminalDayCount,
)

LIVE_STATES = tuple(s for s in State.values if s not in TERMINAL_STATES)
# Seconds between the worker's count passes (the overview says how old its counts are).
COUNT_EVERY = 60
_LOCK = "attempts.terminal_counts"


def _day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def _live_by_day() -> dict[str, int]:
    return {
        day.isoformat(): n
        for day, n in Attempt.objects.filter(state__in=LIVE_STATES)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day")
        .annotate(n=Count("id"))
        .order_by()
    }


def _terminal_rows(where: Q) -> Iterable[tuple[dt.date, str, str, str, int]]:
    return (
        Attempt.objects.filter(where, state__in=sorted(TERMINAL_STATES))
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values_list("day", "tenant_id", "tool_name", "state")
        .annotate(n=Count("id"))
        .order_by()
    )


def days_to_count(
    previous: TerminalCountPass | None, live_now: dict[str, int]
) -> tuple[dt.date | None, list[dt.date]] | None:
    """(every day from, older days) a pass must count again; None for every day."""
    if previous is None:
        return None
    since = previous.counted_at.astimezone(dt.UTC).date() - dt.timedelta(days=1)
    before = previous.live_by_day or {}
    changed = {
        dt.date.fromisoformat(day)
        for day in set(before) | set(live_now)
        if before.get(day, 0) != live_now.get(day, 0)
    }
    return since, sorted(day for day in changed if day < since)


def refresh(*, full: bool = False, now: dt.datetime | None = None) -> TerminalCountPass:
    """One count pass: count again the days that may have changed and store the sums."""
    began = time.monotonic()
    with write_transaction():
        # Passes of several workers take turns; agents' writes never take this lock.
        named_lock(_LOCK)
        now = now or timezone.now()
        previous = None if full else TerminalCountPass.objects.order_by("pk").first()
        # Read first: work that settles after this read is counted by the next pass.
        live_now = _live_by_day()
        plan = days_to_count(previous, live_now)
        if plan is None:
            TerminalDayCount.objects.all().delete()
            rows = list(_terminal_rows(Q()))
            counted = len({row[0] for row in rows})
        else:
            since, older = plan
            where = Q(created_at__gte=_day_start(since))
            for day in older:
                where |= Q(
                    created_at__gte=_day_start(day),
                    created_at__lt=_day_start(day + dt.timedelta(days=1)),
                )
            TerminalDayCount.objects.filter(Q(day__gte=since) | Q(day__in=older)).delete()
            rows = list(_terminal_rows(where))
            counted = len(older) + (now.astimezone(dt.UTC).date() - since).days + 1
        TerminalDayCount.objects.bulk_create(
            TerminalDayCount(day=day, tenant_id=tenant, tool_name=tool, state=state, n=n)
            for day, tenant, tool, state, n in rows
        )
        TerminalCount.objects.all().delete()
        TerminalCount.objects.bulk_create(
            TerminalCount(tenant_id=tenant, tool_name=tool, state=state, n=n)
            for tenant, tool, state, n in TerminalDayCount.objects.values_list(
                "tenant_id", "tool_name", "state"
            )
            .annotate(n=Sum("n"))
            .order_by()
        )
        TerminalCountPass.objects.all().delete()
        return TerminalCountPass.objects.create(
            counted_at=now,
            live_by_day=live_now,
            seconds=time.monotonic() - began,
            days_counted=counted,
        )


def terminal_counts(tenants: list[str]) -> tuple[dict[str, int], dt.datetime] | None:
    """Terminal counts by state for these tenants and when they were taken, or None before the
    first count pass."""
    taken = TerminalCountPass.objects.values_list("counted_at", flat=True).first()
    if taken is None:
        return None
    counts: dict[str, Any] = dict(
        TerminalCount.objects.filter(tenant_id__in=tenants)
        .values_list("state")
        .annotate(n=Sum("n"))
        .order_by()
    )
    return {state: int(counts.get(state, 0)) for state in sorted(TERMINAL_STATES)}, taken
