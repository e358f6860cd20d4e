"""The overview's terminal counts, kept by the reconcile worker's count pass (attempts/counts.py):
right after moves (old days included), shown with the time they were taken, and read from a few
summary rows, so the overview's queries do not grow with the ledger."""

from __future__ import annotations

import datetime as dt
import io
import re
from collections import Counter

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from attempts import counts, ledger, review
from attempts.models import (
    TERMINAL_STATES,
    Attempt,
    State,
    TerminalCount,
    TerminalCountPass,
    TerminalDayCount,
)
from tests.dashboard.conftest import WORKER, make_attempt, make_review, make_unknown


def truth() -> Counter:
    """The terminal counts as the ledger holds them now, per (tenant, tool, state)."""
    return Counter(
        {
            (t, tool, s): n
            for t, tool, s, n in Attempt.objects.filter(state__in=sorted(TERMINAL_STATES))
            .values_list("tenant_id", "tool_name", "state")
            .annotate(n=Count("id"))
            .order_by()
        }
    )


def kept() -> Counter:
    return Counter(
        {(r.tenant_id, r.tool_name, r.state): r.n for r in TerminalCount.objects.all() if r.n}
    )


def confirmed(world, **kwargs) -> Attempt:
    attempt = make_attempt(world, **kwargs)
    attempt, _ = ledger.claim_dispatch(attempt, actor=world.agent)
    return ledger.confirm(attempt, result_ref="r-1", actor=world.agent)


def recorded_days_ago(attempt: Attempt, days: int) -> Attempt:
    Attempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - dt.timedelta(days=days)
    )
    attempt.refresh_from_db()
    return attempt


def test_counts_are_right_after_moves_on_old_and_new_days(world):
    old_unknown = recorded_days_ago(make_unknown(world, tool="charge_card"), 10)
    old_live = recorded_days_ago(make_unknown(world), 20)
    recorded_days_ago(confirmed(world), 30)
    confirmed(world, tenant="globex")
    today_unknown = make_unknown(world)
    # Old times set behind the write path's back: one full pass, as after a restore.
    counts.refresh(full=True)
    assert kept() == truth() and sum(kept().values()) == 2
    # Work settles: an UNKNOWN recorded ten days ago, today's, and new work.
    review.review_confirm(old_unknown, user=world.reviewer, result_ref="r-old", evidence="seen")
    review.review_fail(today_unknown, user=world.reviewer, reason="declined")
    confirmed(world, tool="charge_card")
    ledger.fail(make_attempt(world, tenant="globex"), reason="no", retryable=False, actor=WORKER)
    assert kept() != truth()  # not live: the pass has not run yet
    done = counts.refresh()
    assert kept() == truth() and sum(kept().values()) == 6
    # Only yesterday, today and the one older day whose live work changed were counted again.
    assert done.days_counted == 3
    ten_days_ago = (timezone.now() - dt.timedelta(days=10)).astimezone(dt.UTC).date()
    assert TerminalDayCount.objects.get(day=ten_days_ago).state == State.OUTCOME_CONFIRMED
    # The last old one settles; a pass with nothing new changes nothing.
    review.review_fail(old_live, user=world.reviewer, reason="never sent")
    counts.refresh()
    assert kept() == truth() and sum(kept().values()) == 7
    again = counts.refresh()
    assert kept() == truth() and again.days_counted == 2


def test_the_overview_shows_the_kept_counts_and_when_they_were_taken(world, clients):
    cache.clear()
    confirmed(world)
    taken = counts.refresh().counted_at
    confirmed(world)
    response = clients.viewer.get("/")
    ctx = response.context
    states = {row["state"]: row["n"] for row in ctx["state_rows"]}
    assert states[State.OUTCOME_CONFIRMED] == 1  # as of the pass, not live
    assert ctx["terminal_kept"] and ctx["terminal_at"] == taken
    body = response.content.decode()
    assert "counted by the reconcile worker" in body
    assert taken.astimezone(dt.UTC).strftime("%Y-%m-%d") in body
    # Scoped to the viewer's tenants like every other count.
    confirmed(world, tenant="globex")
    counts.refresh()
    outsider = {r["state"]: r["n"] for r in clients.outsider.get("/").context["state_rows"]}
    assert outsider[State.OUTCOME_CONFIRMED] == 1


def _overview_queries(client) -> list[str]:
    client.get("/")  # a first request loads what a session keeps (not what we measure)
    cache.clear()
    with CaptureQueriesContext(connection) as captured:
        assert client.get("/").status_code == 200
    return [q["sql"] for q in captured.captured_queries]


def test_the_overview_does_not_count_terminal_work_and_its_queries_do_not_grow(world, clients):
    for _ in range(3):
        confirmed(world)
    counts.refresh()
    small = _overview_queries(clients.viewer)
    for days in (3, 9, 40):
        recorded_days_ago(confirmed(world, tool="charge_card"), days)
        ledger.fail(make_attempt(world), reason="no", retryable=False, actor=WORKER)
    counts.refresh(full=True)
    large = _overview_queries(clients.viewer)
    assert len(large) == len(small)
    attempt_table = Attempt._meta.db_table
    for sql in large:
        if attempt_table in sql:
            assert not any(f"'{state}'" in sql for state in TERMINAL_STATES), sql


def test_the_reconcile_worker_runs_the_count_pass(world):
    confirmed(world)
    assert not TerminalCountPass.objects.exists()
    call_command("reconcile", "--once", stdout=io.StringIO())
    assert TerminalCountPass.objects.count() == 1
    assert kept() == truth()


def test_a_large_live_backlog_is_read_from_the_count_pass_and_says_how_old_it_is(
    world, clients, monkeypatch
):
    """Above LIVE_EXACT live attempts the overview reads the pass's live counts (still per
    tenant, tool, owned or not and day, for the chart), not the backlog itself."""
    cache.clear()
    monkeypatch.setattr(counts, "LIVE_EXACT", 2)
    old = recorded_days_ago(make_unknown(world, tool="charge_card"), 3)
    mine = make_unknown(world)
    review.assign(mine, user=world.operator, owner=world.operator)
    review.assign(old, user=world.operator, owner=None)
    review.assign(make_unknown(world), user=world.operator, owner=None)
    make_unknown(world, tenant="globex")
    bounded = clients.operator.get("/").context  # 3 > 2 and no pass yet: counted up to 2
    assert bounded["live_at"] is None and bounded["live_bounded"]
    assert (bounded["unknown_total"], bounded["unknown_more"]) == (2, True)
    taken = counts.refresh().counted_at
    make_unknown(world)  # after the pass: not in its counts
    response = clients.operator.get("/")
    ctx = response.context
    assert ctx["live_at"] == taken
    assert (ctx["unknown_total"], ctx["unassigned_unknown"]) == (3, 2)
    tools = {r["tool"]: r["unknown"] for r in ctx["tool_rows"]}
    assert tools == {"charge_card": 1, "open_ticket": 2}
    assert [r["tenant"] for r in ctx["tenant_rows"]] == ["acme"]
    assert ctx["chart"]["bars"][-4]["unknown"] == 1 and ctx["chart"]["bars"][-1]["unknown"] == 2
    assert ctx["my_counts"]["unknown"] == 1  # a person's own work is always counted live
    assert 'data-testid="live-freshness"' in response.content.decode()
    counts.refresh()
    assert clients.operator.get("/").context["unknown_total"] == 4
    # Settling work below the limit brings back exact counts at once.
    for attempt in Attempt.objects.filter(tenant_id="acme", state=State.UNKNOWN)[:3]:
        review.review_fail(attempt, user=world.reviewer, reason="declined")
    small = clients.operator.get("/").context
    assert small["live_at"] is None and small["unknown_total"] == 1
    assert old


@pytest.mark.django_db(transaction=True)
def test_a_count_pass_counts_before_it_takes_the_write_lock(monkeypatch):
    """The pass's reads run outside any transaction: on SQLite a write transaction holds the
    whole database, and counting inside it made agents' writes wait for the pass (a write
    waited 13.7 s beside a pass at 1M attempts). Only storing the counts takes the lock."""
    seen = []
    live_rows, terminal_rows = counts._live_rows, counts._terminal_rows

    def live(attempts):
        seen.append(("live", connection.in_atomic_block))
        return live_rows(attempts)

    def terminal(where):
        seen.append(("terminal", connection.in_atomic_block))
        return terminal_rows(where)

    monkeypatch.setattr(counts, "_live_rows", live)
    monkeypatch.setattr(counts, "_terminal_rows", terminal)
    first = counts.refresh()
    second = counts.refresh()
    assert seen == [("live", False), ("terminal", False)] * 2
    assert second.counted_at > first.counted_at


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_finds_a_newer_pass_stored_keeps_it():
    """Two workers' passes may read at once; the one that stores last keeps the newer one."""
    newer = counts.refresh()
    kept = counts.refresh(now=newer.counted_at - dt.timedelta(seconds=5))
    assert kept.pk == newer.pk and TerminalCountPass.objects.count() == 1
    assert counts.refresh(full=True).counted_at > newer.counted_at


def test_before_the_first_count_pass_the_overview_counts_terminal_work_only_up_to_a_bound(
    world, clients, monkeypatch
):
    """No page load counts the whole ledger: before the worker's first count pass each
    terminal state is counted up to TERMINAL_UPTO, and a state with more reads "at least"."""
    from attempts.views import overview

    monkeypatch.setattr(overview, "TERMINAL_UPTO", 2, raising=False)
    for _ in range(3):
        confirmed(world)
    ledger.fail(make_attempt(world), reason="no", retryable=False, actor=WORKER)
    assert not TerminalCountPass.objects.exists()
    sql = _overview_queries(clients.viewer)
    attempt_table = Attempt._meta.db_table
    terminal_reads = [
        q for q in sql if attempt_table in q and any(f"'{s}'" in q for s in TERMINAL_STATES)
    ]
    assert terminal_reads and all("LIMIT 3" in q for q in terminal_reads), terminal_reads
    response = clients.viewer.get("/")
    rows = {row["state"]: row for row in response.context["state_rows"]}
    assert rows[State.OUTCOME_CONFIRMED]["n"] == 2 and rows[State.OUTCOME_CONFIRMED]["more"]
    assert rows[State.FAILED]["n"] == 1 and not rows[State.FAILED]["more"]
    body = response.content.decode()
    assert "2+" in body and "each counted up to 2 until the reconcile worker" in body


def test_before_the_first_count_pass_a_large_live_backlog_is_counted_only_up_to_a_bound(
    world, clients, monkeypatch
):
    """No page load counts the whole live backlog either: above LIVE_EXACT live attempts and
    before any pass has counted them, each live state is counted up to LIVE_EXACT ("at least"),
    and the tables by tenant and tool and the chart wait for the pass."""
    cache.clear()
    monkeypatch.setattr(counts, "LIVE_EXACT", 2)
    for _ in range(3):
        review.assign(make_unknown(world), user=world.operator, owner=None)
    review.assign(make_unknown(world), user=world.operator, owner=world.operator)
    make_review(world)
    assert not TerminalCountPass.objects.exists()
    sql = _overview_queries(clients.viewer)
    attempt_table = Attempt._meta.db_table
    live_counts = [
        q
        for q in sql
        if attempt_table in q
        and "COUNT(" in q.upper()
        and any(f"'{s}'" in q for s in counts.LIVE_STATES)
        and '"owner_id" = ' not in q  # a person's own work is always counted (partial index)
        and "awaiting_approval" not in q  # "awaiting me": from its own small index
    ]
    unbounded = [q for q in live_counts if not re.search(r"LIMIT \d+\) subquery$", q)]
    assert live_counts and not unbounded, unbounded
    response = clients.viewer.get("/")
    ctx = response.context
    rows = {row["state"]: row for row in ctx["state_rows"]}
    assert (rows[State.UNKNOWN]["n"], rows[State.UNKNOWN]["more"]) == (2, True)
    assert (rows[State.MANUAL_REVIEW]["n"], rows[State.MANUAL_REVIEW]["more"]) == (1, False)
    assert (ctx["unassigned_unknown"], ctx["unassigned_more"]) == (2, True)
    assert ctx["tenant_rows"] == [] and ctx["tool_rows"] == [] and ctx["chart"] is None
    body = response.content.decode()
    assert 'data-testid="count-unknown">2+<' in body and 'data-testid="chart-waits"' in body
    assert "each state counted up to 2 until the reconcile worker" in body
    # Once the pass has run, the same backlog is shown whole, by tenant, tool and day.
    counts.refresh()
    ctx = clients.viewer.get("/").context
    assert (ctx["unknown_total"], ctx["unknown_more"], ctx["review_total"]) == (4, False, 1)
    assert [r["tenant"] for r in ctx["tenant_rows"]] == ["acme"] and ctx["chart"]["bars"]
