"""Browser tests of an operator's shift (Playwright driving Debian's Chromium against a live
server): an open form survives the worker's lookups and keeps what was typed through a real
conflict; what awaits my approval; notices reaching a real SMTP server and webhook; an SLA
breach escalated and acknowledged; prefix search from the keyboard; bulk resolve; the diff of
linked attempts; and axe-core on every page, light and dark, and each light page at a
phone's 390 px, where none scrolls sideways."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest
from django.utils import timezone

from attempts import linked, notify, review
from attempts.models import Attempt, Grant, Notification, State
from tests.conftest import PYTHON, REPO, child_env, make_world, no_digests
from tests.dashboard.conftest import (
    AXE,
    PHONE,
    WORKER,
    Tab,
    csp_errors,
    escalating_sla,
    make_awaiting,
    make_review,
    make_unknown,
)
from tests.dashboard.test_shift import worker_lookup
from tests.notify_servers import MailSink, Webhook

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_open_form_survives_the_worker_and_keeps_typing_through_a_conflict(
    live_server, browser, monkeypatch
):
    from attempts.views import detail

    monkeypatch.setattr(detail, "DETAIL_POLL_SECONDS", 1)
    world = make_world()
    quiet = make_unknown(world)
    contested = make_review(world)
    me = Tab(browser, live_server.url)
    me.login("reviewer")

    # 1. The worker looks the attempt up (UNKNOWN stays UNKNOWN) while the form is open.
    me.goto(f"/attempts/{quiet.attempt_id}/")
    me.page.click("text=Mark confirmed…")
    me.page.fill("input[name=result_ref]", "rcpt-2291")
    me.page.fill("textarea[name=evidence]", "provider dashboard, 09:14")
    worker_lookup(quiet)
    worker_lookup(quiet)
    me.page.wait_for_selector("text=looked up 2×")  # the live part refreshed, the form did not
    assert me.page.input_value("input[name=result_ref]") == "rcpt-2291"
    me.page.click("text=Mark OUTCOME_CONFIRMED")
    me.page.wait_for_selector("text=Marked OUTCOME_CONFIRMED.")
    assert Attempt.objects.get(pk=quiet.pk).result_ref == "rcpt-2291"

    # 2. Someone reassigns the attempt while the form is open: a real conflict.
    me.goto(f"/attempts/{contested.attempt_id}/")
    me.page.click("text=Mark failed…")
    me.page.fill("form[action$='/fail/'] textarea[name=reason]", "provider has no record")
    review.assign(contested, user=world.operator, owner=world.reviewer2)
    me.page.wait_for_selector("[data-testid=changed-since-open]")
    me.page.click("form[action$='/fail/'] button[type=submit]")
    me.page.wait_for_selector("[data-testid=conflict]")
    assert "operator changed its owner" in me.page.inner_text("[data-testid=conflict]")
    assert me.page.input_value("form[action$='/fail/'] textarea[name=reason]") == (
        "provider has no record"
    )
    assert Attempt.objects.get(pk=contested.pk).state == State.MANUAL_REVIEW
    me.shot("shift-01-conflict-kept-typing")
    me.page.click("form[action$='/fail/'] button[type=submit]")  # seen it; decide again
    me.page.wait_for_selector("text=Marked FAILED.")
    assert Attempt.objects.get(pk=contested.pk).state == State.FAILED
    assert not csp_errors(me)


def test_awaiting_my_approval_from_the_overview(live_server, browser):
    world = make_world()
    half = make_review(world, tool="charge_card")
    review.approve_linked_retry(half, user=world.reviewer)
    make_review(world)
    me = Tab(browser, live_server.url)
    me.login("reviewer2")
    me.goto("/")
    assert me.page.inner_text("[data-testid=count-awaiting]") == "1"
    me.page.click("a.tile-approval")
    me.page.wait_for_selector("[data-testid=awaits-me]")
    rows = me.page.locator("#queue-table tr[data-attempt]")
    assert rows.count() == 1 and rows.first.get_attribute("data-attempt") == half.attempt_id
    me.shot("shift-02-awaiting-my-approval")


def test_a_notice_reaches_a_real_mailbox_and_chat(live_server, browser):
    world = make_world()
    no_digests()
    attempt = make_unknown(world)
    with MailSink() as mail, Webhook() as hook:
        env = child_env(
            LEDGERWEB_EMAIL_HOST="127.0.0.1",
            LEDGERWEB_EMAIL_PORT=str(mail.port),
            LEDGERWEB_CHAT_WEBHOOK_URL=hook.url,
        )
        worker = [PYTHON, "manage.py", "reconcile", "--once", "--worker-id", "notifier"]
        subprocess.run(worker, cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
        me = Tab(browser, live_server.url)
        me.login("operator")
        me.goto(f"/attempts/{attempt.attempt_id}/")
        me.page.select_option("select[name=owner]", "reviewer2")
        me.page.click("form[action$='/assign/'] button[type=submit]")
        me.page.wait_for_selector("text=Assigned to reviewer2.")
        subprocess.run(worker, cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    assert [m["to"] for m in mail.messages] == ["reviewer2@example.test"]
    assert "operator assigned" in mail.messages[0]["subject"]
    assert [p["text"].split()[0] for p in hook.posts] == ["@reviewer2"]
    assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


def test_an_sla_breach_is_coloured_escalated_and_acknowledged(live_server, browser, settings):
    world = make_world()
    settings.NOTIFY = {**settings.NOTIFY, "EMAIL": True}
    escalating_sla(world)
    late = make_unknown(world)
    Attempt.objects.filter(pk=late.pk).update(created_at=timezone.now() - dt.timedelta(hours=2))
    assert notify.escalate_slas() == 1
    # The policy's person and the attempt's owner hear of it.
    assert {n.recipient for n in Notification.objects.all()} == {world.admin, world.triage}
    me = Tab(browser, live_server.url)
    me.login("operator")
    me.goto("/queues/unknown/")
    cell = me.page.locator(f"tr[data-attempt='{late.attempt_id}'] td[data-sla]")
    assert cell.get_attribute("data-sla") == "breach"
    assert "SLA breached" in cell.inner_text()
    me.shot("shift-03-sla-breach")
    me.page.click(f"a[href='/attempts/{late.attempt_id}/']")
    me.page.fill("form.ack input[name=comment]", "provider outage, watching")
    me.page.click("[data-testid=acknowledge]")
    me.page.wait_for_selector("[data-testid=sla-ack]")
    assert "acknowledged by operator" in me.page.inner_text("[data-testid=sla-ack]")
    assert Attempt.objects.get(pk=late.pk).owner == world.triage  # acknowledging is not taking


def test_prefix_search_from_the_keyboard_and_j_k(live_server, browser):
    world = make_world()
    target = make_unknown(world, provider_request_id="prv_2e63bbed91")
    for _ in range(3):
        make_unknown(world)
    me = Tab(browser, live_server.url)
    me.login("viewer")
    me.goto("/queues/all/")
    me.page.keyboard.press("j")
    me.page.keyboard.press("j")
    assert me.page.locator("tr[data-row].selected").count() == 1
    me.page.keyboard.press("/")
    me.page.keyboard.type("prv_2e63bbed")
    me.page.keyboard.press("Enter")
    me.page.wait_for_url("**q=prv_2e63bbed**")
    me.page.wait_for_function(
        "document.querySelectorAll('#queue-table tr[data-attempt]').length === 1"
    )
    assert me.page.get_attribute("#queue-table tr[data-attempt]", "data-attempt") == (
        target.attempt_id
    )
    me.page.locator("h1").click()  # out of the search box: keys are shortcuts again
    me.page.keyboard.press("?")
    assert me.page.is_visible("#shortcuts")
    me.shot("shift-04-prefix-search")


def test_bulk_resolve(live_server, browser):
    world = make_world()
    picked = [make_review(world) for _ in range(2)]
    left = make_review(world)
    me = Tab(browser, live_server.url)
    me.login("reviewer")
    me.goto("/queues/review/")
    for attempt in picked:
        me.page.check(f"tr[data-attempt='{attempt.attempt_id}'] input.bulk-pick")
    me.page.click("text=Note, confirm or fail selected…")
    me.page.fill("#bulk textarea[name=reason]", "provider confirms neither was created")
    me.page.click("button[name=action][value=fail]")
    me.page.wait_for_selector("text=Marked FAILED 2 attempts.")
    states = {a.pk: Attempt.objects.get(pk=a.pk).state for a in [*picked, left]}
    assert states == {picked[0].pk: "FAILED", picked[1].pk: "FAILED", left.pk: "MANUAL_REVIEW"}
    me.shot("shift-05-bulk-failed")


def test_the_diff_of_linked_attempts(live_server, browser):
    world = make_world()
    original = make_unknown(world)
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(policy_version="v2")
    child = linked.create_linked_attempt(original, actor=WORKER, reason="policy changed")
    me = Tab(browser, live_server.url)
    me.login("reviewer")
    for path in (f"/attempts/{child.attempt_id}/", f"/attempts/{child.attempt_id}/approve/"):
        me.goto(path)
        text = me.page.inner_text("[data-testid=diff]")
        assert "Policy version" in text and "v1" in text and "v2" in text, path
    me.shot("shift-06-diff")


def _every_page(world) -> list[tuple[str, str]]:
    """(who, path) for every dashboard page, error pages included."""
    unknown = make_unknown(world, provider_request_id="prv_" + "x" * 60)
    review_item = make_review(world)
    awaiting = make_awaiting(world)
    review.add_note(review_item, user=world.operator, text="called the provider")
    return [
        ("", "/login/"),
        ("reviewer", "/"),
        ("reviewer", "/queues/unknown/"),
        ("reviewer", "/queues/review/"),
        ("reviewer", "/queues/stale/"),
        ("reviewer", "/queues/all/?q=zz"),
        ("reviewer", f"/attempts/{unknown.attempt_id}/"),
        ("reviewer", f"/attempts/{review_item.attempt_id}/"),
        ("reviewer", f"/attempts/{awaiting.attempt_id}/"),
        ("reviewer", f"/attempts/{awaiting.attempt_id}/approve/"),
        ("reviewer", "/settings/"),
        ("reviewer", "/approvals/"),
        ("reviewer", "/approvals/?tab=all"),
        ("reviewer", "/audit/"),
        ("reviewer", "/audit/config/"),
        ("reviewer", "/audit/log/"),
        ("reviewer", f"/audit/report/{review_item.attempt_id}/"),
        ("operator", "/audit/"),  # 403
        ("reviewer", "/attempts/att_missing/"),  # 404
        ("reviewer", "/queues/unknown/?age=3y"),  # 400
    ]


LAPTOP = {"width": 1280, "height": 800}


def _tabs(browser, base: str, pages, *, dark: bool) -> dict[str, Tab]:
    """A logged-in tab at a laptop's width for each person the pages are seen as."""
    tabs: dict[str, Tab] = {}
    for who, _ in pages:
        if who not in tabs:
            tabs[who] = Tab(browser, base, viewport=LAPTOP, dark=dark)
            if who:
                tabs[who].login(who)
    return tabs


def test_every_page_in_light_passes_axe_at_a_laptop_and_a_phone_and_fits_the_phone(
    live_server, browser
):
    """axe-core on every page at 1,280 px and, the same page made 390 px wide, at a phone's
    width (no script reads the window's width: only the style sheet's media queries change),
    where no page scrolls sideways; the shortcuts dialog too."""
    if not AXE.exists():
        pytest.skip("axe-core is not installed (scripts/setup runs npm ci)")
    world = make_world()
    pages = _every_page(world)
    tabs = _tabs(browser, live_server.url, pages, dark=False)
    found, wide = {}, []
    for who, path in pages:
        tab = tabs[who]
        tab.page.set_viewport_size(LAPTOP)
        tab.goto(path)
        if violations := tab.axe():
            found[path] = violations
        tab.page.set_viewport_size(PHONE)
        if violations := tab.axe():
            found[f"{path} (phone)"] = violations
        if not tab.no_sideways_scroll():
            wide.append(path)
    tab = tabs["reviewer"]
    tab.page.set_viewport_size(LAPTOP)
    tab.goto("/")
    tab.page.keyboard.press("?")
    if violations := tab.axe():
        found["shortcuts dialog"] = violations
    tab.page.set_viewport_size(PHONE)
    if violations := tab.axe():
        found["shortcuts dialog (phone)"] = violations
    tab.goto(pages[7][1])
    tab.shot("shift-07-phone-detail")
    width = tab.page.evaluate(
        "Math.min(...[...document.querySelectorAll('table.history td:last-child')]"
        ".map(td => td.getBoundingClientRect().width))"
    )
    assert width > 200  # the history's details column keeps its width on a phone
    assert not found, found
    assert not wide, wide


def test_every_page_in_dark_passes_axe(live_server, browser):
    if not AXE.exists():
        pytest.skip("axe-core is not installed (scripts/setup runs npm ci)")
    world = make_world()
    pages = _every_page(world)
    tabs = _tabs(browser, live_server.url, pages, dark=True)
    found = {}
    for who, path in pages:
        tabs[who].goto(path)
        if violations := tabs[who].axe():
            found[path] = violations
    tab = tabs["reviewer"]
    tab.goto("/")
    tab.page.keyboard.press("?")
    if violations := tab.axe():
        found["shortcuts dialog"] = violations
    assert not found, found
