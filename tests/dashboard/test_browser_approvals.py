"""Browser tests of approval before dispatch (Playwright driving Debian's Chromium against a
live server): the inbox from the overview, approve by two people (four eyes on a critical
tool), reject with a reason, and an approval that expires before the claim bringing the item
back; no CSP errors on the way."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from attempts import ledger
from attempts.models import Approval, ApprovalPolicy, Attempt, State
from attempts.states import Actor
from tests.conftest import make_world
from tests.dashboard.test_browser_shift import AXE, Tab, _csp_errors

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def held_world():
    world = make_world()
    ApprovalPolicy.objects.create(
        name="big-charges",
        tool_id="charge_card",
        condition="args.amount_cents > 100000",
        approvals_needed=2,
    )
    held = []
    for n in (1, 2):
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id=f"order-{n}",
            tool_name="charge_card",
            idempotency_key=f"charge:acme:order-{n}",
            args={"amount_cents": 150000 * n, "currency": "EUR"},
            actor=world.agent,
        )
        assert attempt.state == State.AWAITING_APPROVAL
        held.append(attempt)
    return world, held


def item(tab: Tab, attempt: Attempt) -> str:
    return f"[data-testid=held-item][data-attempt='{attempt.attempt_id}']"


def test_inbox_approve_by_two_people_and_reject(live_server, browser):
    world, (first, second) = held_world()
    me = Tab(browser, live_server.url)
    me.login("reviewer")
    me.goto("/")
    assert me.page.inner_text("[data-testid=count-held]") == "2"
    me.page.click("[data-testid=tile-held]")
    me.page.wait_for_selector(item(me, first))
    card = me.page.locator(item(me, first))
    assert "amount_cents = 150000" in card.inner_text()
    assert "args.amount_cents > 100000" in card.inner_text()
    assert '"currency": "EUR"' in card.locator("[data-testid=args]").inner_text()
    card.locator("input[name=comment]").fill("known customer")
    card.locator("[data-testid=approve]").click()
    me.page.wait_for_selector("text=it needs another person's approval")
    assert me.page.locator(item(me, first)).count() == 0  # no longer awaiting me
    assert Attempt.objects.get(pk=first.pk).state == State.AWAITING_APPROVAL

    other = Tab(browser, live_server.url)
    other.login("reviewer2")
    other.goto("/approvals/")
    card = other.page.locator(item(other, first))
    assert "1 of 2 approvals (reviewer)" in card.inner_text()
    card.locator("[data-testid=approve]").click()
    other.page.wait_for_selector("text=enough approvals, it may be sent now")
    assert Attempt.objects.get(pk=first.pk).state == State.INTENT_RECORDED
    assert Approval.objects.get(attempt=first, approver=world.reviewer).comment == "known customer"

    card = other.page.locator(item(other, second))
    card.locator("input[name=reason]").fill("order was cancelled")
    card.locator("[data-testid=reject]").click()
    other.page.wait_for_selector("text=it will not be sent")
    rejected = Attempt.objects.get(pk=second.pk)
    assert (rejected.state, rejected.review_reason) == (State.FAILED, "approval_rejected")
    assert other.page.locator("[data-testid=inbox-empty]").count() == 1
    other.shot("approvals-inbox-empty")
    assert not _csp_errors(me, other)


def test_an_expired_approval_sends_the_item_back_and_the_maximum_wait_ends_it(live_server, browser):
    world, (first, second) = held_world()
    me = Tab(browser, live_server.url)
    me.login("reviewer")
    me.goto("/approvals/")
    me.page.locator(item(me, first)).locator("[data-testid=approve]").click()
    me.page.wait_for_selector("text=it needs another person's approval")
    other = Tab(browser, live_server.url)
    other.login("reviewer2")
    other.goto("/approvals/")
    other.page.locator(item(other, first)).locator("[data-testid=approve]").click()
    other.page.wait_for_selector("text=enough approvals")
    # reviewer's approval expires before the agent claims: void, and the item is back.
    Approval.objects.filter(approver=world.reviewer).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    _, claimed = ledger.claim_dispatch(first.attempt_id, actor=world.agent)
    assert not claimed
    me.goto("/approvals/")
    card = me.page.locator(item(me, first))
    assert "1 of 2 approvals (reviewer2)" in card.inner_text()
    assert "no longer counting: reviewer" in card.inner_text()
    me.shot("approvals-void")
    # The second one waits past its maximum: the worker's sweep fails it, and it leaves the inbox.
    Attempt.objects.filter(pk=second.pk).update(next_check_at=timezone.now())
    assert ledger.expire_waits(actor=Actor.worker("w1")) >= 1
    me.goto("/approvals/?tab=all")
    assert me.page.locator(item(me, second)).count() == 0
    assert Attempt.objects.get(pk=second.pk).review_reason == "approval_expired"
    assert not _csp_errors(me, other)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_axe_finds_nothing_serious_in_the_inbox(live_server, browser, dark):
    if not AXE.exists():
        pytest.skip("axe-core is not installed (scripts/setup runs npm ci)")
    held_world()
    tab = Tab(browser, live_server.url, dark=dark, axe=True)
    tab.login("reviewer")
    found = {}
    for path in ("/approvals/", "/approvals/?tab=group", "/approvals/?tab=all", "/"):
        tab.goto(path)
        if violations := tab.axe():
            found[path] = violations
    assert not found, found
