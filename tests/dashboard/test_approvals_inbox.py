"""The approvals inbox (docs/approvals.md): held attempts by tab, oldest first, with the
arguments, the policy and the condition's values; approve and reject are POSTs with CSRF and
the policy's role; the overview counts held work."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from attempts.models import ApprovalPolicy, Attempt, SsoIdentity, State
from tests.dashboard.approvals_helpers import held_intent, hold_big_charges, login


@pytest.fixture
def held(world):
    hold_big_charges()
    return [
        held_intent(world, f"charge:acme:{n}", {"amount_cents": 200000 + n, "card_number": "4242"})
        for n in (1, 2)
    ]


def card(attempt) -> str:
    return f'data-attempt="{attempt.attempt_id}"'


def test_the_inbox_shows_what_held_each_item_oldest_first(world, held):
    Attempt.objects.filter(pk=held[0].pk).update(
        created_at=held[0].created_at - dt.timedelta(hours=9)
    )
    page = login(world, "reviewer").get("/approvals/").content.decode()
    assert page.index(card(held[0])) < page.index(card(held[1]))
    assert "big-charges" in page and "args.amount_cents &gt; 100000" in page
    assert "amount_cents = 200001" in page
    assert "4242" not in page  # secret fields stay redacted
    assert 'data-sla="breach"' in page
    assert "0 of 2 approvals" in page


def test_tabs_me_group_all(world, held):
    reviewer = login(world, "reviewer")
    assert card(held[0]) in reviewer.get("/approvals/?tab=me").content.decode()
    operator = login(world, "operator")
    assert card(held[0]) not in operator.get("/approvals/?tab=me").content.decode()
    assert card(held[0]) in operator.get("/approvals/?tab=all").content.decode()
    assert "Nothing held for a group" in reviewer.get("/approvals/?tab=group").content.decode()
    ApprovalPolicy.objects.filter(name="big-charges").update(approver_group="payments")
    SsoIdentity.objects.create(user=world.reviewer, subject="s", last_login_groups=["payments"])
    assert card(held[0]) in reviewer.get("/approvals/?tab=group").content.decode()
    outsider = login(world, "outsider")
    assert card(held[0]) not in outsider.get("/approvals/?tab=all").content.decode()
    assert reviewer.get("/approvals/?tab=nope").status_code == 400


def _form(attempt, **extra):
    return {"expected_version": attempt.version, "seen_event": attempt.last_event_id(), **extra}


def test_approve_twice_by_two_people_releases_it_and_it_leaves_my_inbox(world, held):
    attempt = held[0]
    reviewer = login(world, "reviewer")
    answer = reviewer.post(
        f"/approvals/{attempt.attempt_id}/approve/", _form(attempt, comment="ok")
    )
    assert answer.status_code == 302
    attempt.refresh_from_db()
    assert attempt.state == State.AWAITING_APPROVAL
    assert card(attempt) not in reviewer.get("/approvals/?tab=me").content.decode()
    second = login(world, "reviewer2")
    second.post(f"/approvals/{attempt.attempt_id}/approve/", _form(attempt))
    attempt.refresh_from_db()
    assert attempt.state == State.INTENT_RECORDED


def test_reject_needs_a_reason_and_the_role(world, held):
    attempt = held[0]
    operator = login(world, "operator")
    operator.post(f"/approvals/{attempt.attempt_id}/reject/", _form(attempt, reason="no"))
    assert Attempt.objects.get(pk=attempt.pk).state == State.AWAITING_APPROVAL
    reviewer = login(world, "reviewer")
    reviewer.post(f"/approvals/{attempt.attempt_id}/reject/", _form(attempt, reason=""))
    assert Attempt.objects.get(pk=attempt.pk).state == State.AWAITING_APPROVAL
    reviewer.post(f"/approvals/{attempt.attempt_id}/reject/", _form(attempt, reason="fraud"))
    attempt.refresh_from_db()
    assert (attempt.state, attempt.review_reason) == (State.FAILED, "approval_rejected")


def test_posts_need_csrf_and_login(world, held):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.reviewer)
    answer = client.post(f"/approvals/{held[0].attempt_id}/approve/", _form(held[0]))
    assert answer.status_code == 403
    anonymous = Client().get("/approvals/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    other = login(world, "outsider")
    assert (
        other.post(f"/approvals/{held[0].attempt_id}/approve/", _form(held[0])).status_code == 404
    )


def test_the_overview_counts_held_work(world, held):
    page = login(world, "reviewer").get("/").content.decode()
    assert 'data-testid="count-held">2<' in page
    assert "2 awaiting me" in page


def test_the_inbox_and_the_overview_count_held_work_no_further_than_the_cap(
    world, held, monkeypatch
):
    """The tabs and the overview's "awaiting me" read at most QUEUE_COUNT_CAP + 1 held rows:
    past the cap they say "N+" (docs/scaling.md: a whole count of a big backlog is slow)."""
    from attempts.models import attempts as models

    monkeypatch.setattr(models, "QUEUE_COUNT_CAP", 1)
    reviewer = login(world, "reviewer")
    page = reviewer.get("/approvals/?tab=me").content.decode()
    assert "Awaiting me (1+)" in page and "All held (1+)" in page
    assert "1+ awaiting me" in reviewer.get("/").content.decode()
    monkeypatch.setattr(models, "QUEUE_COUNT_CAP", 2)
    page = reviewer.get("/approvals/?tab=me").content.decode()
    assert "Awaiting me (2)" in page and "All held (2)" in page


def test_whoever_recorded_a_held_intent_never_has_it_awaiting_them(world, held):
    """Who recorded an intent is kept on the attempt (``recorded_by``, the creation event's
    actor) and the inbox's "me" tab tests that column."""
    recorder = held[0].events.order_by("id").first().actor
    assert Attempt.objects.get(pk=held[0].pk).recorded_by == recorder
    Attempt.objects.filter(pk=held[0].pk).update(recorded_by=world.reviewer.get_username())
    reviewer = Attempt.objects.held_for(world.reviewer, "me")
    assert list(reviewer.values_list("pk", flat=True)) == [held[1].pk]
    from attempts import review

    current = Attempt.objects.get(pk=held[0].pk)
    policy = ApprovalPolicy.objects.get(pk=current.approval_policy_id)
    allowed, why = review.may_decide_held(world.reviewer, current, policy)
    assert not allowed and why.startswith("whoever recorded an intent")


def test_awaiting_me_tests_the_policy_where_only_some_policies_are_mine(world, held):
    """Where this person may approve under every policy, "me" does not test the policy (so the
    planner reads the inbox's index in order); where only some are theirs, it still does."""
    ApprovalPolicy.objects.create(
        name="deploys", tool_id="deploy_service", approver_group="release-managers"
    )
    deploy = held_intent(world, "deploy:acme:1", {"service": "api"}, tool="deploy_service")
    mine = set(Attempt.objects.held_for(world.reviewer, "me").values_list("pk", flat=True))
    assert mine == {held[0].pk, held[1].pk}
    assert deploy.pk in set(
        Attempt.objects.held_for(world.reviewer, "all").values_list("pk", flat=True)
    )
    SsoIdentity.objects.create(
        user=world.reviewer, subject="s", last_login_groups=["release-managers"]
    )
    from attempts.models import read_people

    read_people([world.reviewer])
    mine = set(Attempt.objects.held_for(world.reviewer, "me").values_list("pk", flat=True))
    assert mine == {held[0].pk, held[1].pk, deploy.pk}


def test_migration_0014_fills_recorded_by_where_an_approval_check_reads_it(world, held):
    """Attempts older than the column: those a policy held (or linked ones) get their first
    event's actor; the rest stay NULL and ``review._recorded_by`` reads their history."""
    import importlib

    from django.apps import apps

    from attempts import review
    from tests.conftest import agent_intent

    plain, _ = agent_intent(world, "plain:1", tool="open_ticket", args={"title": "printer"})
    Attempt.objects.update(recorded_by=None)
    importlib.import_module("attempts.migrations.0014_recorded_by").fill(apps, None)
    recorder = held[0].events.order_by("id").first().actor
    assert set(
        Attempt.objects.filter(pk__in=[h.pk for h in held]).values_list("recorded_by", flat=True)
    ) == {recorder}
    plain.refresh_from_db()
    assert plain.recorded_by is None
    assert review._recorded_by(plain) == plain.events.order_by("id").first().actor


def _inbox_queries(client, tab: str) -> tuple[int, str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/approvals/?tab={tab}")
    assert page.status_code == 200
    return len(queries), page.content.decode()


def test_a_page_of_the_inbox_costs_the_same_queries_for_one_item_or_many(world, held):
    """Each item's first event, newest event, approvals, approvers' roles and the viewer's
    roles are read once for the page, not once per item."""
    from attempts import review

    review.approve_held(held[0], user=world.reviewer2, seen=None)
    operator = login(world, "operator")
    _inbox_queries(operator, "all")  # a first request reads what a session remembers after
    few, _ = _inbox_queries(operator, "all")
    for n in range(3, 9):
        attempt = held_intent(world, f"charge:acme:{n}", {"amount_cents": 200000 + n})
        review.approve_held(attempt, user=world.reviewer2, seen=None)
    many, page = _inbox_queries(operator, "all")
    assert page.count("data-attempt=") >= 8
    assert many == few, f"{few} queries for 2 items, {many} for 8"
    reviewer = login(world, "reviewer")
    few_me, page = _inbox_queries(reviewer, "me")
    assert "1 of 2 approvals" in page


def test_after_approving_all_held_offers_no_second_approval_of_mine(world, held):
    """One person counts once: the item I approved stays in "All held" without an Approve (or
    Edit and approve) for me, saying another approver must approve; I may still reject it."""
    attempt = held[0]
    reviewer = login(world, "reviewer")
    reviewer.post(f"/approvals/{attempt.attempt_id}/approve/", _form(attempt))
    page = reviewer.get("/approvals/?tab=all").content.decode()
    item = page[page.index(card(attempt)) : page.index(card(held[1]))]
    assert 'data-testid="approve"' not in item and 'data-testid="edit-link"' not in item
    assert 'data-testid="approved-by-me"' in item and "another approver" in item
    assert 'data-testid="reject"' in item
    other = page[page.index(card(held[1])) :]
    assert 'data-testid="approve"' in other


def test_the_inbox_is_a_work_queue_filtered_and_sorted_with_money_as_money(world, held):
    """Compact rows with the amount as money, filtered by tenant, tool, policy and an amount
    range in a currency's units, sorted by age or amount; bad filters are a clear 400."""
    from attempts.models import Tool

    Tool.objects.filter(name="charge_card").update(amount_arg="amount_cents", currency_arg="cur")
    big = held_intent(world, "charge:acme:big", {"amount_cents": 987654, "cur": "EUR"})
    yen = held_intent(world, "charge:acme:yen", {"amount_cents": 250000, "cur": "JPY"})
    reviewer = login(world, "reviewer")
    page = reviewer.get("/approvals/?tab=all", HTTP_ACCEPT_LANGUAGE="en-US").content.decode()
    assert "€9,876.54" in page and "¥250,000" in page
    assert 'data-minor="987654"' in page and "amount_cents = 987654" in page  # raw, one click
    # held[0] and held[1] carry no currency: shown raw in their arguments, never guessed.
    row = page[page.index(card(held[0])) : page.index(card(held[1]))]
    assert 'data-testid="money"' not in row and "amount_cents = 200001" in row
    german = reviewer.get("/approvals/?tab=all", HTTP_ACCEPT_LANGUAGE="de-DE").content.decode()
    assert "9.876,54\xa0€" in german

    def shown(query: str) -> list[str]:
        answer = reviewer.get("/approvals/?tab=all&" + query)
        assert answer.status_code == 200, answer.content[:300]
        return [item["attempt"].attempt_id for item in answer.context["items"]]

    assert shown("currency=EUR") == [big.attempt_id]
    assert shown("currency=eur&amount_min=9000&amount_max=9876.54") == [big.attempt_id]
    assert shown("currency=EUR&amount_min=9876.55") == []
    assert shown("currency=JPY&amount_max=250000") == [yen.attempt_id]
    assert shown("tool=update_crm") == []
    assert shown("policy=big-charges")[0] == held[0].attempt_id
    assert shown("sort=newest")[0] == yen.attempt_id
    assert shown("tenant=globex") == []
    for query, message in (
        ("sort=amount", "choose a currency"),
        ("amount_min=5", "choose a currency"),
        ("currency=XQQ", "not a currency"),
        ("currency=EUR&amount_min=lots", "must be a number"),
        ("sort=sideways", "sort by one of"),
    ):
        answer = reviewer.get("/approvals/?tab=all&" + query)
        assert answer.status_code == 400 and message in answer.content.decode().lower(), query


def test_the_navigation_counts_what_awaits_me(world, held):
    page = login(world, "reviewer").get("/").content.decode()
    assert 'data-testid="nav-approvals-count"' in page
    count = page[page.index('data-testid="nav-approvals-count"') :]
    assert ">2</span>" in count[:200]
    assert (
        'data-testid="nav-approvals-count"'
        not in login(world, "operator").get("/").content.decode()
    )


def test_a_queue_shows_a_declared_amount_as_money(world, held):
    from attempts.models import Tool

    Tool.objects.filter(name="charge_card").update(amount_arg="amount_cents", currency="KWD")
    page = login(world, "reviewer").get("/queues/all/").content.decode()
    assert "KWD\xa0200.001" in page or "KWD200.001" in page  # three minor units
    Tool.objects.filter(name="charge_card").update(amount_arg="", currency="")
    assert (
        'data-testid="money"' not in login(world, "reviewer").get("/queues/all/").content.decode()
    )
