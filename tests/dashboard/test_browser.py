"""Browser tests: headless Chromium (Debian's package) driven by Playwright against a live
server on 127.0.0.1. An operator's day: log in, filter the UNKNOWN queue, take an attempt, read
its hash and request id, approve a linked retry, mark an outcome, lose a race politely, and
bulk-take from the queue. Screenshots are kept under var/artifacts/screenshots/."""

from __future__ import annotations

import os

import pytest

# The live server listens on 127.0.0.1. (DJANGO_ALLOW_ASYNC_UNSAFE is set only while a browser
# test runs, see the fixture: set for the whole session it would leak into the environment of
# every subprocess other tests start, e.g. `check --deploy`, which rightly refuses it.)
os.environ.setdefault("DJANGO_LIVE_TEST_SERVER_ADDRESS", "127.0.0.1")

from attempts.models import Attempt, State  # noqa: E402
from tests.conftest import make_world  # noqa: E402
from tests.dashboard.conftest import Tab, make_review, make_unknown  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_day_in_the_browser(live_server, browser, settings):
    world = make_world()
    tickets = [make_unknown(world, tool="open_ticket") for _ in range(3)]
    card = make_unknown(world, tool="charge_card", provider_request_id="ch_3PqR7zKx")
    make_unknown(world, tenant="globex", tool="charge_card")
    retry_me = make_review(world, tool="open_ticket", reason="not_found")
    confirm_me = make_review(world, tool="update_crm", reason="payload_mismatch")
    raced = make_review(world, tool="open_ticket", reason="max_age")

    me = Tab(browser, live_server.url)
    page = me.page

    # 1. Anonymous: the login page, never data.
    me.goto("/queues/unknown/")
    assert "/login/" in page.url
    me.shot("01-login")
    me.login("reviewer")
    assert page.url.endswith("/queues/unknown/")

    me.goto("/")
    assert page.inner_text("[data-testid=count-unknown]") == "4"
    me.shot("02-overview")

    # 2. Filter the UNKNOWN queue (htmx swaps the table and pushes the filters into the URL).
    me.goto("/queues/unknown/")
    me.shot("03-unknown-queue")
    page.select_option("select[name=tool]", "charge_card")
    page.wait_for_url("**tool=charge_card**")
    page.wait_for_function(
        "document.querySelectorAll('#queue-table tbody tr[data-attempt]').length === 1"
    )
    rows = page.locator("#queue-table tbody tr[data-attempt]")
    assert rows.first.get_attribute("data-attempt") == card.attempt_id
    assert "globex" not in page.inner_text("#queue-table")
    me.shot("04-unknown-filtered")

    # 3. Take it, then read its hash and provider request id.
    page.click(f"a[href='/attempts/{card.attempt_id}/']")
    page.wait_for_selector("[data-testid=take]")
    page.click("[data-testid=take]")
    page.wait_for_selector("text=You own this attempt now.")
    assert page.inner_text("[data-testid=owner]") == "reviewer"
    assert page.inner_text("[data-testid=args-hash]") == card.args_hash
    assert page.inner_text("[data-testid=provider-request-id]") == "ch_3PqR7zKx"
    assert Attempt.objects.get(pk=card.pk).owner == world.reviewer
    me.shot("05-detail-taken")

    # 4. Approve a linked retry, after reading exactly what will be sent.
    me.goto(f"/attempts/{retry_me.attempt_id}/")
    page.click("[data-testid=approve-link]")
    page.wait_for_selector("[data-testid=preview]")
    assert page.inner_text("[data-testid=preview-key]") == retry_me.idempotency_key + "~r1"
    assert page.inner_text("[data-testid=preview-tenant]") == "acme"
    me.shot("06-approve-preview")
    page.click("[data-testid=approve]")
    page.wait_for_selector("text=Linked retry approved")
    child = Attempt.objects.get(parent=retry_me)
    assert page.url.endswith(f"/attempts/{child.attempt_id}/")
    assert child.state == State.INTENT_RECORDED
    me.shot("07-linked-retry-created")

    # 5. Mark an outcome, with evidence.
    me.goto(f"/attempts/{confirm_me.attempt_id}/")
    page.click("text=Mark confirmed…")
    page.fill("input[name=result_ref]", "crm-rev-88412")
    page.fill("textarea[name=evidence]", "CRM audit log shows revision 88412 at 09:14 UTC")
    me.shot("08-mark-confirmed-form")
    page.click("text=Mark OUTCOME_CONFIRMED")
    page.wait_for_selector("text=Marked OUTCOME_CONFIRMED.")
    assert page.inner_text("[data-testid=state]") == "OUTCOME_CONFIRMED"
    assert Attempt.objects.get(pk=confirm_me.pk).result_ref == "crm-rev-88412"
    me.shot("09-confirmed")

    # 6. Two reviewers at once: the second sees a clear message, in place.
    other = Tab(browser, live_server.url)
    other.login("reviewer2")
    for name, s in (("reviewer", me), ("reviewer2", other)):
        s.goto(f"/attempts/{raced.attempt_id}/")
        s.page.click("text=Mark failed…")
        s.page.fill(
            "form[action$='/fail/'] textarea[name=reason]", f"{name}: provider has no record"
        )
    me.page.click("form[action$='/fail/'] button[type=submit]")
    me.page.wait_for_selector("text=Marked FAILED.")
    other.page.click("form[action$='/fail/'] button[type=submit]")
    other.page.wait_for_selector("#action-feedback .feedback.error")
    assert "someone else changed this attempt" in other.page.inner_text("#action-feedback").lower()
    other.shot("10-race-lost")
    assert Attempt.objects.get(pk=raced.pk).events.last().actor == "reviewer"

    # 7. Bulk-take from the queue.
    me.goto("/queues/unknown/?tool=open_ticket")
    for t in tickets[:2]:
        page.check(f"tr[data-attempt='{t.attempt_id}'] input.bulk-pick")
    assert page.inner_text("[data-bulk-count]") == "2 selected"
    me.shot("11-bulk-selected")
    page.click("button[name=action][value=take]")
    page.wait_for_selector("text=Took 2 attempts.")
    assert {Attempt.objects.get(pk=t.pk).owner_id for t in tickets[:2]} == {world.reviewer.pk}
    me.shot("12-bulk-taken")

    csp = [e for e in me.errors + other.errors if "Content Security Policy" in e or "Refused" in e]
    assert not csp, csp
    assert not [e for e in me.errors + other.errors if "409" not in e], me.errors + other.errors
