"""The overview: counts by state, tenant and tool, the oldest UNKNOWN, my open work and the
chart, all scoped to the user's tenants."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth.models import User
from django.core.cache import cache
from django.utils import timezone

from attempts import review
from attempts.models import Attempt, State
from tests.conftest import PASSWORD
from tests.dashboard.conftest import login, make_attempt, make_review, make_unknown


def test_counts_are_scoped_to_my_tenants(world, clients):
    cache.clear()
    make_unknown(world, tool="open_ticket")
    make_unknown(world, tool="charge_card")
    make_review(world, tool="charge_card")
    done = make_unknown(world)
    review.review_confirm(done, user=world.reviewer, result_ref="r", evidence="seen")
    for _ in range(3):
        make_unknown(world, tenant="globex")
    response = clients.viewer.get("/")
    ctx = response.context
    assert (ctx["unknown_total"], ctx["review_total"]) == (2, 1)
    states = {row["state"]: row["n"] for row in ctx["state_rows"]}
    assert states[State.UNKNOWN] == 2 and states[State.OUTCOME_CONFIRMED] == 1
    assert [r["tenant"] for r in ctx["tenant_rows"]] == ["acme"]
    tools = {r["tool"]: (r["unknown"], r["review"]) for r in ctx["tool_rows"]}
    assert tools == {"charge_card": (1, 1), "open_ticket": (1, 0)}
    outsider = clients.outsider.get("/").context
    assert (outsider["unknown_total"], outsider["review_total"]) == (3, 0)
    body = response.content.decode()
    assert 'data-testid="count-unknown">2<' in body and "<svg" in body


def test_oldest_unknown_my_work_and_unassigned(world, clients):
    old = make_unknown(world)
    Attempt.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(hours=5))
    mine = make_unknown(world)
    review.assign(mine, user=world.operator, owner=world.operator)
    loose = make_unknown(world)
    review.assign(loose, user=world.operator, owner=None)
    ctx = clients.operator.get("/").context
    assert ctx["oldest_unknown_age"] >= dt.timedelta(hours=5)
    assert [a["attempt_id"] for a in ctx["my_work"]] == [mine.attempt_id]
    assert ctx["my_counts"] == {"unknown": 1, "review": 0}
    assert ctx["unassigned_unknown"] == 1


def test_chart_counts_open_attention_work_by_day(world, clients):
    today = make_unknown(world)
    review = make_review(world)
    old = make_unknown(world)
    Attempt.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=3))
    ancient = make_unknown(world)
    Attempt.objects.filter(pk=ancient.pk).update(created_at=timezone.now() - dt.timedelta(days=40))
    make_attempt(world)  # not attention work
    bars = clients.viewer.get("/").context["chart"]["bars"]
    assert len(bars) == 14
    assert (bars[-1]["unknown"], bars[-1]["review"]) == (1, 1)
    assert bars[-4]["unknown"] == 1
    assert sum(b["unknown"] for b in bars) == 2  # the 40-day-old one is outside the window
    assert today and review


def test_htmx_refresh_gets_the_panels_fragment(world, clients):
    make_unknown(world)
    response = clients.viewer.get("/", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<div id="overview-panels"')


def test_a_person_without_memberships_sees_nothing(world):
    make_unknown(world)
    User.objects.create_user("nobody", "n@example.test", PASSWORD)
    client = login(User.objects.get(username="nobody"))
    ctx = client.get("/").context
    assert ctx["unknown_total"] == 0 and ctx["tenant_rows"] == []
    assert client.get("/queues/all/").context["page"].rows == []


def test_in_flight_counts_link_to_the_in_flight_work_only(world, clients):
    cache.clear()
    recorded = make_attempt(world)
    unknown = make_unknown(world)
    body = clients.viewer.get("/").content.decode()
    assert "/queues/inflight/?tenant=acme" in body and "/queues/inflight/?tool=open_ticket" in body
    listed = clients.viewer.get("/queues/inflight/", {"tool": "open_ticket"}).content.decode()
    assert recorded.attempt_id in listed and unknown.attempt_id not in listed
