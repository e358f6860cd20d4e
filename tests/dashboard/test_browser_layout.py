"""Layout and flow in a real browser with the data an operator really has: the attempt page's
"Configuration changes" table with long before/after values at a laptop's 1,280 px, the
overview's By tenant / By tool cards with many long names on a 390 px phone, axe-core's
scrollable-region rule where tables scroll sideways, the address after an approval, and the
"n" key from one decided attempt to the next."""

from __future__ import annotations

import pytest

from attempts.config_history import save_with_history
from attempts.models import Grant, Membership, Role, Tenant, Tool
from attempts.states import Actor
from tests.conftest import make_world
from tests.dashboard.conftest import AXE, PHONE, SHOTS, Tab, make_attempt, make_review, make_unknown

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAPTOP = {"width": 1280, "height": 800}


def _busy_world():
    """Attempts across many tenants and tools with long names, and config changes with long
    values that affect them."""
    world = make_world()
    for n in range(6):
        tenant = Tenant.objects.create(slug=f"north-america-enterprise-{n}", name=f"NA {n}")
        tool = Tool.objects.create(name=f"provision_customer_workspace_region_{n}")
        Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1")
        make_unknown(world, tenant=tenant.slug, tool=tool.name)
    tool = Tool.objects.get(name="open_ticket")
    tool.dispatch_url = "https://tickets.internal.example/api/v2/" + "very-long-path-segment/" * 8
    tool.lookup_url = tool.dispatch_url + "lookup?idempotency_key="
    save_with_history(tool, actor=Actor.user(world.admin), reason="moved the ticket service")
    unknown = make_unknown(world, provider_request_id="prv_" + "y" * 90)
    review_item = make_review(world)
    make_attempt(world)
    for tenant in Tenant.objects.exclude(slug__in=["acme", "globex"]):
        Membership.objects.create(user=world.reviewer, tenant=tenant, role=Role.REVIEWER)
    return world, unknown, review_item


def test_attempt_page_fits_a_laptop_with_long_configuration_changes(live_server, browser):
    _, unknown, review_item = _busy_world()
    tab = Tab(browser, live_server.url, viewport=LAPTOP)
    tab.login("reviewer")
    wide = []
    for attempt in (unknown, review_item):
        tab.goto(f"/attempts/{attempt.attempt_id}/")
        if not tab.no_sideways_scroll():
            wide.append(tab.page.evaluate("document.documentElement.scrollWidth"))
    tab.shot("layout-laptop-detail")
    assert not wide, f"the attempt page is wider than 1280 px: {wide}"


def test_overview_fits_a_phone_with_many_tenants_and_tools(live_server, browser):
    _busy_world()
    tab = Tab(browser, live_server.url, viewport=PHONE)
    tab.login("reviewer")
    tab.goto("/")
    tab.shot("layout-phone-overview")
    width = tab.page.evaluate("document.documentElement.scrollWidth")
    assert tab.no_sideways_scroll(), f"the overview is {width} px wide on a 390 px phone"


def test_sideways_scrolling_regions_take_the_keyboard_on_a_phone(live_server, browser):
    if not AXE.exists():
        pytest.skip("axe-core is not installed (scripts/setup runs npm ci)")
    _, unknown, review_item = _busy_world()
    tab = Tab(browser, live_server.url, viewport=PHONE)
    tab.login("reviewer")
    found = {}
    for path in (
        "/",
        f"/attempts/{unknown.attempt_id}/",
        f"/attempts/{review_item.attempt_id}/",
        f"/audit/report/{review_item.attempt_id}/",
    ):
        tab.goto(path)
        if violations := tab.axe():
            found[path] = violations
    assert not found, found


def test_after_an_approval_the_address_is_the_attempt_not_the_approve_form(live_server, browser):
    world = make_world()
    critical = make_review(world, tool="charge_card")  # two reviewers needed
    tab = Tab(browser, live_server.url)
    tab.login("reviewer")
    tab.goto(f"/attempts/{critical.attempt_id}/approve/")
    tab.page.click("[data-testid=approve]")
    tab.page.wait_for_selector("text=Your approval is recorded")
    assert tab.page.url.endswith(f"/attempts/{critical.attempt_id}/"), tab.page.url


def test_n_goes_from_a_decided_attempt_to_the_next_one_needing_attention(live_server, browser):
    world = make_world()
    first, second = make_unknown(world), make_unknown(world)
    tab = Tab(browser, live_server.url)
    tab.login("reviewer")
    tab.goto(f"/attempts/{first.attempt_id}/")
    tab.page.click("text=Mark failed…")
    tab.page.fill("textarea[name=reason]", "the provider says it never arrived")
    tab.page.click("button:has-text('Mark FAILED')")
    tab.page.wait_for_selector("[data-testid=state]:has-text('FAILED')")
    tab.page.keyboard.press("n")
    tab.page.wait_for_url(f"**/attempts/{second.attempt_id}/")
    assert not tab.errors, tab.errors


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE, {"width": 1366, "height": 768}], ids=str)
def test_an_attempts_decisions_come_first(live_server, browser, viewport):
    """The first decision is at most five Tab presses into the attempt's page (the page starts
    at its Actions, before the identifiers and their Copy buttons), above the identifiers on a
    phone, the cause is said in words, and the page is never wider than its window."""
    world, unknown, review_item = _busy_world()
    review_item.refresh_from_db()
    tab = Tab(browser, live_server.url, viewport=viewport)
    tab.login("reviewer")
    tab.goto(f"/attempts/{review_item.attempt_id}/")
    presses = 0
    while presses < 5:
        tab.page.keyboard.press("Tab")
        presses += 1
        focused = tab.page.evaluate(
            "(() => { const e = document.activeElement; return e && e.closest('#decide') ?"
            " (e.tagName + ':' + (e.textContent || '').trim()) : ''; })()"
        )
        if focused:
            break
    assert focused.startswith("SUMMARY:Mark confirmed") or focused.startswith("BUTTON"), focused
    if viewport is PHONE:
        decide = tab.page.locator("#decide").bounding_box()
        identity = tab.page.locator("#attempt-live").bounding_box()
        assert decide["y"] < identity["y"]
    tab.page.screenshot(path=str(SHOTS / f"layout-detail-{viewport['width']}.png"))
    if review_item.review_reason:
        assert tab.page.inner_text("[data-testid=review-why]").endswith(".")
    assert tab.no_sideways_scroll()


def test_the_overviews_tiles_fit_one_row_and_a_phones_queue_shows_rows_first(live_server, browser):
    """At 1,280 px the overview's tiles stand in one row (the sixth wrapped alone); on a phone
    the queue's filters fold behind one button, so the first row is on the first screen."""
    _busy_world()
    tab = Tab(browser, live_server.url, viewport=LAPTOP)
    tab.login("reviewer")
    tab.goto("/")
    tops = tab.page.evaluate(
        "Array.from(document.querySelectorAll('.tiles .tile')).map(t => t.getBoundingClientRect().top)"
    )
    assert len(tops) >= 6 and len(set(tops)) == 1, tops
    phone = Tab(browser, live_server.url, viewport=PHONE)
    phone.login("reviewer")
    phone.goto("/queues/all/")
    first = phone.page.locator("tr[data-row]").first.bounding_box()
    assert first["y"] < PHONE["height"], first
    phone.page.click("[data-filters-toggle]")
    assert phone.page.locator("select[name=tenant]").is_visible()
    assert phone.no_sideways_scroll()
