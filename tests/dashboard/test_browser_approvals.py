"""Browser tests of approval before dispatch (Playwright driving Debian's Chromium against a
live server): the inbox from the overview, approve by two people (four eyes on a critical
tool), reject with a reason, an approval that expires before the claim bringing the item back,
edit-and-approve with its diff and the second approver, and bulk approve / reject with a result
per item; no CSP errors on the way, and axe-core finds nothing serious."""

from __future__ import annotations

import pytest
from django.utils import timezone

from attempts import ledger
from attempts.models import Approval, ApprovalPolicy, Attempt, AttemptEvent, State
from attempts.states import Actor
from tests.conftest import agent_intent, clock_ahead, make_world
from tests.dashboard.conftest import AXE, SHOTS, Tab, csp_errors

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
        attempt, _ = agent_intent(
            world,
            f"charge:acme:order-{n}",
            tool="charge_card",
            args={"amount_cents": 150000 * n, "currency": "EUR"},
            task=f"order-{n}",
        )
        assert attempt.state == State.AWAITING_APPROVAL
        held.append(attempt)
    return world, held


def inbox(browser, base: str, username: str) -> Tab:
    """A tab of ``username``'s, signed in, on the approvals inbox."""
    tab = Tab(browser, base)
    tab.login(username)
    tab.goto("/approvals/")
    return tab


def item(tab: Tab, attempt: Attempt) -> str:
    return f"[data-testid=held-item][data-attempt='{attempt.attempt_id}']"


def opened(tab: Tab, attempt: Attempt):
    """The held item's row group with its folded details (arguments, decision) opened."""
    card = tab.page.locator(item(tab, attempt))
    card.wait_for()
    if card.locator("[data-row-details]").get_attribute("hidden") is not None:
        card.locator("[data-row-toggle]").click()
    return card


def test_inbox_approve_by_two_people_and_reject(live_server, browser):
    world, (first, second) = held_world()
    me = Tab(browser, live_server.url)
    me.login("reviewer")
    me.goto("/")
    assert me.page.inner_text("[data-testid=count-held]") == "2"
    me.page.click("[data-testid=tile-held]")
    me.page.wait_for_selector(item(me, first))
    card = opened(me, first)
    assert "amount_cents = 150000" in card.inner_text()
    assert "args.amount_cents > 100000" in card.inner_text()
    assert '"currency": "EUR"' in card.locator("[data-testid=args]").inner_text()
    card.locator("input[name=comment]").fill("known customer")
    card.locator("[data-testid=approve]").click()
    me.page.wait_for_selector("text=it needs another person's approval")
    assert me.page.locator(item(me, first)).count() == 0  # no longer awaiting me
    assert Attempt.objects.get(pk=first.pk).state == State.AWAITING_APPROVAL

    other = inbox(browser, live_server.url, "reviewer2")
    card = opened(other, first)
    assert "1 of 2 approvals (reviewer)" in card.inner_text()
    card.locator("[data-testid=approve]").click()
    other.page.wait_for_selector("text=enough approvals, it may be sent now")
    assert Attempt.objects.get(pk=first.pk).state == State.INTENT_RECORDED
    assert first.events.get(action="attempt.approval", actor="reviewer").reason == "known customer"

    card = opened(other, second)
    card.locator("input[name=reason]").fill("order was cancelled")
    card.locator("[data-testid=reject]").click()
    other.page.wait_for_selector("text=it will not be sent")
    rejected = Attempt.objects.get(pk=second.pk)
    assert (rejected.state, rejected.review_reason) == (State.FAILED, "approval_rejected")
    assert other.page.locator("[data-testid=inbox-empty]").count() == 1
    other.shot("approvals-inbox-empty")
    assert not csp_errors(me, other)


def test_an_expired_approval_sends_the_item_back_and_the_maximum_wait_ends_it(live_server, browser):
    me = Tab(browser, live_server.url)
    # Held, and approved once, fifty minutes ago (an approval counts for an hour): the clock
    # moves, no approval row is edited (they are append-only).
    with clock_ahead(-50 * 60):
        world, (first, second) = held_world()
        me.login("reviewer")
        me.goto("/approvals/")
        opened(me, first).locator("[data-testid=approve]").click()
        me.page.wait_for_selector("text=it needs another person's approval")
    other = inbox(browser, live_server.url, "reviewer2")
    opened(other, first).locator("[data-testid=approve]").click()
    other.page.wait_for_selector("text=enough approvals")
    # Twenty minutes on, reviewer's approval has expired before the agent claims: void, and
    # the item is back.
    with clock_ahead(20 * 60):
        _, claimed = ledger.claim_dispatch(first.attempt_id, actor=world.agent)
        assert not claimed
        me.goto("/approvals/")
        card = opened(me, first)
        assert "1 of 2 approvals (reviewer2)" in card.inner_text()
        assert "no longer counting: reviewer" in card.inner_text()
        me.shot("approvals-void")
        # The second waits past its maximum: the worker's sweep fails it, and it leaves the inbox.
        Attempt.objects.filter(pk=second.pk).update(next_check_at=timezone.now())
        assert ledger.expire_waits(actor=Actor.worker("w1")) >= 1
        me.goto("/approvals/?tab=all")
        assert me.page.locator(item(me, second)).count() == 0
    assert Attempt.objects.get(pk=second.pk).review_reason == "approval_expired"
    assert not csp_errors(me, other)


def test_edit_and_approve_shows_the_diff_and_still_needs_a_second_person(live_server, browser):
    world, (first, second) = held_world()
    me = inbox(browser, live_server.url, "reviewer")
    opened(me, first).locator("[data-testid=edit-link]").click()
    editor = me.page.locator("[data-testid=args-editor]")
    editor.wait_for()
    status = me.page.locator("[data-json-status]")
    preview = me.page.locator("[data-testid=edit-preview]")
    # The editor says at once when what is typed is not a JSON object, and will not submit it.
    editor.fill('{"amount_cents": 90000,')
    assert "Not valid JSON" in status.inner_text() and preview.is_disabled()
    assert editor.get_attribute("aria-invalid") == "true"
    editor.fill("[1, 2]")
    assert "must be a JSON object" in status.inner_text() and preview.is_disabled()
    editor.fill('{"amount_cents": 90000, "currency": "EUR"}')
    assert status.inner_text() == "Valid JSON object." and preview.is_enabled()
    me.page.fill("textarea[name=comment]", "customer asked for 900.00")
    preview.click()
    # What differs, before anything is recorded.
    diff = me.page.locator("[data-testid=edit-confirm] [data-testid=diff]")
    diff.wait_for()
    assert "args.amount_cents" in diff.inner_text()
    assert "150000" in diff.inner_text() and "90000" in diff.inner_text()
    assert "charge:acme:order-1~r1" in me.page.inner_text("[data-testid=preview-key]")
    assert "Yours is 1 of 2" in me.page.inner_text("[data-testid=preview-needs]")
    assert Attempt.objects.get(pk=first.pk).state == State.AWAITING_APPROVAL
    me.shot("approvals-edit-diff")
    me.page.click("[data-testid=edit-confirm-button]")
    me.page.wait_for_selector("text=another person must approve it before it is sent")
    first.refresh_from_db()
    child = Attempt.objects.get(parent=first)
    assert first.state == State.RECONCILED and child.state == State.AWAITING_APPROVAL
    assert child.args == {"amount_cents": 90000, "currency": "EUR"}
    assert me.page.url.endswith(f"/attempts/{child.attempt_id}/")
    assert child.events.get(action="attempt.approval").reason == "customer asked for 900.00"
    # Not in the editor's own inbox: a different person must approve.
    me.goto("/approvals/")
    assert me.page.locator(item(me, child)).count() == 0

    other = inbox(browser, live_server.url, "reviewer2")
    card = opened(other, child)
    assert "Corrected by reviewer" in card.inner_text()
    assert "1 of 2 approvals (reviewer)" in card.inner_text()
    assert "90000" in card.locator("[data-testid=diff]").inner_text()
    other.shot("approvals-second-approver")
    card.locator("[data-testid=approve]").click()
    other.page.wait_for_selector("text=enough approvals, it may be sent now")
    assert Attempt.objects.get(pk=child.pk).state == State.INTENT_RECORDED
    assert not csp_errors(me, other)


def test_bulk_approve_and_reject_with_a_result_each(live_server, browser):
    world, (first, second) = held_world()
    me = inbox(browser, live_server.url, "reviewer")
    approve = me.page.locator("[data-testid=bulk-approve]")
    assert approve.is_disabled()  # nothing selected yet
    me.page.check(f"{item(me, first)} [data-testid=pick]")
    me.page.check(f"{item(me, second)} [data-testid=pick]")
    assert me.page.inner_text("[data-bulk-count]") == "2 selected" and approve.is_enabled()
    me.page.fill("[data-testid=bulk-comment]", "weekly batch")
    approve.click()
    me.page.wait_for_selector("[data-testid=bulk-results]")
    rows = me.page.locator("[data-testid=bulk-result]")
    assert rows.count() == 2
    assert {rows.nth(i).get_attribute("data-outcome") for i in range(2)} == {"recorded"}
    approvals = AttemptEvent.objects.filter(action="attempt.approval")  # a comment is its reason
    assert set(approvals.values_list("reason", flat=True)) == {"weekly batch"}
    me.shot("approvals-bulk-results")

    other = inbox(browser, live_server.url, "reviewer2")
    other.page.check("[data-select-all]")
    assert other.page.inner_text("[data-bulk-count]") == "2 selected"
    other.page.click("[data-testid=bulk-reject]")  # no reason: refused, nothing changed
    other.page.wait_for_selector("text=reason must not be empty")
    assert set(Attempt.objects.values_list("state", flat=True)) == {State.AWAITING_APPROVAL}
    # The refusal keeps the selection: the reviewer narrows it and gives the reason.
    assert other.page.inner_text("[data-bulk-count]") == "2 selected"
    other.page.uncheck(f"{item(other, second)} [data-testid=pick]")
    other.page.check(f"{item(other, first)} [data-testid=pick]")
    other.page.fill("[data-testid=bulk-comment]", "duplicate order")
    other.page.click("[data-testid=bulk-reject]")
    other.page.wait_for_selector("[data-testid=bulk-results]")
    assert other.page.locator("[data-testid=bulk-result]").get_attribute("data-outcome") == (
        "rejected"
    )
    assert Attempt.objects.get(pk=first.pk).state == State.FAILED
    assert Attempt.objects.get(pk=second.pk).state == State.AWAITING_APPROVAL
    assert not csp_errors(me, other)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_axe_finds_nothing_serious_in_the_inbox(live_server, browser, dark):
    if not AXE.exists():
        pytest.skip("axe-core is not installed (scripts/setup runs npm ci)")
    held_world()
    tab = Tab(browser, live_server.url, dark=dark)
    tab.login("reviewer")
    found = {}
    for path in ("/approvals/", "/approvals/?tab=group", "/approvals/?tab=all", "/"):
        tab.goto(path)
        if violations := tab.axe():
            found[path] = violations
    # The editor, its invalid state, the diff before confirming, and bulk results.
    first = Attempt.objects.filter(state=State.AWAITING_APPROVAL).order_by("id").first()
    tab.goto(f"/approvals/{first.attempt_id}/edit/")
    tab.page.fill("[data-testid=args-editor]", "{")
    if violations := tab.axe():
        found["edit (invalid)"] = violations
    tab.page.fill("[data-testid=args-editor]", '{"amount_cents": 1}')
    tab.page.click("[data-testid=edit-preview]")
    tab.page.wait_for_selector("[data-testid=edit-confirm]")
    if violations := tab.axe():
        found["edit (diff)"] = violations
    tab.goto("/approvals/")
    tab.page.check("[data-select-all]")
    tab.page.click("[data-testid=bulk-approve]")
    tab.page.wait_for_selector("[data-testid=bulk-results]")
    if violations := tab.axe():
        found["bulk results"] = violations
    assert not found, found


def test_the_inbox_is_a_keyboard_work_queue_of_compact_rows(live_server, browser):
    """Fifty held calls fit a 1,280 x 800 window ten rows or more above the fold, the amount
    shown as money; from the overview the oldest is approved in four key presses (i, j, a,
    Enter); no page is wider than its window at 390, 1,280 or 1,366."""
    from attempts.models import Tool

    world = make_world()
    Tool.objects.filter(name="charge_card").update(
        amount_arg="amount_cents", currency_arg="currency"
    )
    ApprovalPolicy.objects.create(
        name="big-charges", tool_id="charge_card", condition="args.amount_cents > 100000",
        approvals_needed=2,
    )  # fmt: skip
    held = [
        agent_intent(
            world, f"charge:acme:q-{n:02d}", tool="charge_card",
            args={"amount_cents": 115982 + n, "currency": "EUR"}, task=f"q-{n}",
        )[0]
        for n in range(50)
    ]  # fmt: skip
    me = Tab(browser, live_server.url, viewport={"width": 1280, "height": 800})
    me.login("reviewer")
    me.goto("/")
    me.page.keyboard.press("i")
    me.page.wait_for_selector("[data-testid=held-item]")
    assert me.page.url.endswith("/approvals/")
    above = me.page.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=held-item] tr[data-row]'))"
        ".filter(r => r.getBoundingClientRect().bottom <= window.innerHeight).length"
    )
    me.shot("inbox-1280")
    assert above >= 10, above
    assert "€1,159.82" in me.page.inner_text(item(me, held[0]))
    assert me.no_sideways_scroll()
    me.page.keyboard.press("j")
    me.page.keyboard.press("a")
    me.page.keyboard.press("Enter")
    me.page.wait_for_selector("text=it needs another person's approval")
    assert Approval.objects.filter(attempt=held[0], approver=world.reviewer).exists()
    assert not Approval.objects.exclude(attempt=held[0]).exists()
    for width in (390, 1366):
        tab = Tab(browser, live_server.url, viewport={"width": width, "height": 800})
        tab.login("reviewer")
        tab.goto("/approvals/?tab=all")
        assert tab.no_sideways_scroll(), width
        if width == 390:
            tab.page.screenshot(path=str(SHOTS / "shift-inbox-390.png"))  # the first screen
    assert not csp_errors(me)
