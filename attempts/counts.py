"""The overview's counts, kept by the reconcile worker where counting per request would read
too much.

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
writes that committed late). Nothing is written on the agents' write path, and the pass counts
before it takes the write lock, so no writer waits for its counting. A ledger loaded behind the
write path's back (a restore, an import with old times) needs ``refresh(full=True)``.

Live work is counted per request while it is small. A backlog of more than ``LIVE_EXACT`` live
attempts in a person's tenants (a provider down for a day, say) is read from what the same pass
keeps (``LiveDayCount``: per day, tenant, tool, state and whether anyone owns it), and the
overview says how old those counts are. Deciding costs one index range of at most
``LIVE_EXACT`` entries. Before a pass has kept them, such a backlog is counted per state up to
``LIVE_EXACT`` each (``Live.bounded``), never whole: a page load reads bounded index ranges only.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Case, Count, Q, Sum, When
from django.db.models.functions import TruncDate
from django.utils import timezone

from attempts.locking import named_lock, write_transaction
from attempts.models import (
    TERMINAL_STATES,
    Attempt,
    LiveDayCount,
    State,
    TerminalCount,
    TerminalCountPass,
    TerminalDayCount,
)

LIVE_STATES = tuple(s for s in State.values if s not in TERMINAL_STATES)
# Seconds between the worker's count passes (the overview says how old its counts are).
COUNT_EVERY = 60
_LOCK = "attempts.terminal_counts"
# The most live attempts (in a person's tenants) the overview counts per request.
LIVE_EXACT = 2_000


def _day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


LiveRow = tuple[dt.date, str, str, str, bool, int]  # day, tenant, tool, state, unowned, n


def _live_rows(attempts: Any) -> list[LiveRow]:
    """Live attempts counted per day of recording, tenant, tool, state and owned or not."""
    return [
        (day if isinstance(day, dt.date) else dt.date.fromisoformat(day), *rest)
        for day, *rest in attempts.filter(state__in=LIVE_STATES)
        .annotate(
            day=TruncDate("created_at", tzinfo=dt.UTC),
            unowned=Case(When(owner__isnull=True, then=True), default=False),
        )
        .values_list("day", "tenant_id", "tool_name", "state", "unowned")
        .annotate(n=Count("id"))
        .order_by()
    ]


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
    """One count pass: count again the days that may have changed and store the sums.

    The counting reads come first, outside any transaction; only storing what they found takes
    the write transaction. On SQLite a write transaction holds the whole database, and a pass
    that counted inside it made every agent's write wait for the pass.
    Passes of several workers may read at once; they store one at a time, and a pass that finds
    a newer pass stored while it read keeps that one."""
    began = time.monotonic()
    now = now or timezone.now()
    previous = None if full else TerminalCountPass.objects.order_by("pk").first()
    # Read first: work that settles after this read is counted by the next pass.
    live = _live_rows(Attempt.objects.all())
    live_now: dict[str, int] = defaultdict(int)
    for day, *_, n in live:
        live_now[day.isoformat()] += n
    plan = days_to_count(previous, live_now)
    if plan is None:
        recount = Q()
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
        recount = Q(day__gte=since) | Q(day__in=older)
        rows = list(_terminal_rows(where))
        counted = len(older) + (now.astimezone(dt.UTC).date() - since).days + 1
    with write_transaction():
        # Agents' writes never take this lock (on PostgreSQL they never wait for it).
        named_lock(_LOCK)
        stored = TerminalCountPass.objects.order_by("pk").first()
        if not full and stored is not None and stored.counted_at > now:
            return stored
        LiveDayCount.objects.all().delete()
        LiveDayCount.objects.bulk_create(
            LiveDayCount(day=d, tenant_id=t, tool_name=tool, state=st, unowned=u, n=n)
            for d, t, tool, st, u, n in live
        )
        TerminalDayCount.objects.filter(recount).delete()
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
            live_by_day=dict(live_now),
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


Bound = tuple[int, bool]  # a count up to LIVE_EXACT, and whether there are more


@dataclass(frozen=True)
class Live:
    """Live attempts per day, tenant, tool, state and owned or not; ``at`` is when the count
    pass took them, or None when they were counted for this request. ``bounded``: a backlog too
    large to count on a page load that no pass has counted yet; ``rows`` are then empty and
    these are each state's count up to LIVE_EXACT (and the unowned UNKNOWN's, ``unowned``)."""

    rows: list[LiveRow]
    at: dt.datetime | None
    bounded: dict[str, Bound] | None = None
    unowned: Bound = (0, False)


def _upto(attempts: Any) -> Bound:
    # ids only: read from an index, never from the rows.
    n = attempts.order_by().values("id")[: LIVE_EXACT + 1].count()
    return min(n, LIVE_EXACT), n > LIVE_EXACT


def live_counts(tenants: list[str]) -> Live:
    """The live counts of these tenants: exact while they hold at most LIVE_EXACT live
    attempts, else as the last count pass kept them, else (no pass has counted them yet) each
    state up to LIVE_EXACT."""
    live = Attempt.objects.for_tenants(tenants)
    if _upto(live.filter(state__in=LIVE_STATES))[1]:
        taken = TerminalCountPass.objects.values_list("counted_at", flat=True).first()
        kept = LiveDayCount.objects.filter(tenant_id__in=tenants)
        if taken is not None and kept.exists():
            return Live(
                list(kept.values_list("day", "tenant_id", "tool_name", "state", "unowned", "n")),
                taken,
            )
        return Live(
            [],
            None,
            bounded={state: _upto(live.filter(state=state)) for state in LIVE_STATES},
            unowned=_upto(live.filter(state=State.UNKNOWN, owner__isnull=True)),
        )
    return Live(_live_rows(live), None)
