"""The erasure action in a real browser: an admin asks on the attempt page, a second admin
approves, the page then shows neither the arguments nor the notes; axe-core finds no serious
problem in the erasure card, and the page logs no error (CSP included)."""

from __future__ import annotations

import pytest

from attempts.models import Attempt
from attempts.verify_export import ERASED_ARGS
from tests.attempts.test_erasure import NOTE, SECRET, second_admin, settled_attempt
from tests.conftest import make_world
from tests.dashboard.conftest import Tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_two_admins_erase_an_attempt_from_its_page(live_server, browser):
    world = make_world()
    attempt = settled_attempt(world)
    second_admin(world)
    path = f"/attempts/{attempt.attempt_id}/"

    asker = Tab(browser, live_server.url)
    asker.login("admin")
    asker.goto(path)
    asker.page.click("[data-testid=erasure] summary")
    assert asker.axe() == []
    asker.page.fill("[data-testid=erasure] textarea[name=reason]", "data subject request DSR-40")
    asker.page.click("[data-testid=erasure] button[type=submit]")
    asker.page.wait_for_load_state("networkidle")
    assert "another admin must approve" in asker.page.content()
    assert asker.page.locator("[data-testid=erasure-approve]").count() == 0

    approver = Tab(browser, live_server.url)
    approver.login("admin2")
    approver.goto(path)
    assert "DSR-40" in approver.page.inner_text("[data-testid=erasure-pending]")
    assert approver.axe() == []
    approver.page.click("[data-testid=erasure-approve]")
    approver.page.wait_for_load_state("networkidle")
    body = approver.page.content()
    assert "Erased" in body and SECRET not in body and NOTE not in body
    assert "already erased" in approver.page.inner_text("[data-testid=erasure]")
    assert Attempt.objects.get(pk=attempt.pk).args == ERASED_ARGS
    assert asker.errors == [] and approver.errors == []
