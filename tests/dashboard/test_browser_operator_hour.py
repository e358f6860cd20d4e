"""An operator's hour in a real browser (Playwright driving Debian's Chromium against a live
server): the rough edges found in a whole shift, each seen as a person sees it. After approving,
"All held" offers no second Approve; the printable report is offered only to whoever may open
it; approval-policy changes are in the configuration history for a reviewer; held work has no
Unassign; bulk results say their outcome once; the audit page links the verifier and the
log's page, which gives the key to copy."""

from __future__ import annotations

import pytest

from attempts import config_history, review
from attempts.models import ApprovalPolicy
from attempts.states import Actor
from tests.conftest import agent_intent, make_world
from tests.dashboard.conftest import Tab, csp_errors, make_unknown

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _held(world, n: int):
    attempt, _ = agent_intent(
        world, f"charge:acme:hour-{n}", tool="charge_card",
        args={"amount_cents": 150000 + n, "currency": "EUR"}, task=f"hour-{n}",
    )  # fmt: skip
    return attempt


def test_the_rough_edges_of_an_operators_hour(live_server, browser):
    world = make_world()
    with config_history.acting(Actor.user(world.admin), "hold large charges"):
        ApprovalPolicy.objects.create(
            name="big-charges", tool_id="charge_card",
            condition="args.amount_cents > 100000", approvals_needed=2,
        )  # fmt: skip
    first, second, third = (_held(world, n) for n in (1, 2, 3))
    unknown = make_unknown(world)
    me = Tab(browser, live_server.url)
    me.login("reviewer")

    # 1. Approved once by me: "All held" says my approval counts and offers no Approve.
    review.approve_held(first, user=world.reviewer)
    me.goto("/approvals/?tab=all")
    row = me.page.locator(f"[data-testid=held-item][data-attempt='{first.attempt_id}']")
    row.locator("[data-row-toggle]").click()
    assert row.locator("[data-testid=approve]").count() == 0
    assert "another approver must approve" in row.inner_text()
    assert row.locator("[data-testid=reject]").is_visible()

    # 6. Bulk results: each outcome said once.
    me.page.check(f"[data-testid=held-item][data-attempt='{second.attempt_id}'] [data-testid=pick]")
    me.page.fill("[data-testid=bulk-comment]", "not ours")
    me.page.click("[data-testid=bulk-reject]")
    result = me.page.locator("[data-testid=bulk-result]").first
    result.wait_for()
    text = result.inner_text()
    assert text.count("rejected") == 1 and "FAILED" in text, text

    # 3. The configuration history shows the approval policy to a reviewer, by its kind.
    me.goto("/audit/config/?kind=approval_policy")
    assert "approval_policy:big-charges" in me.page.inner_text("main")
    assert me.page.locator("select[name=kind] option[value=approval_policy]").count() == 1

    # 9. The audit page links the standalone verifier and the log's page.
    me.goto("/audit/")
    me.page.click("[data-testid=log-page-link]")
    me.page.wait_for_selector("[data-testid=log-keys]")
    assert (
        me.page.locator("[data-testid=verifier-script]")
        .get_attribute("href")
        .endswith("/audit/verify_export.py")
    )

    # 2. The printable report: a reviewer has the link; a viewer and an operator do not.
    me.goto(f"/attempts/{unknown.attempt_id}/")
    assert me.page.locator("[data-testid=report-link]").count() == 1
    for name in ("viewer", "operator"):
        other = Tab(browser, live_server.url)
        other.login(name)
        other.goto(f"/attempts/{unknown.attempt_id}/")
        assert other.page.locator("[data-testid=report-link]").count() == 0, name
        # 7. Held work is reassigned, never unassigned: no Unassign on a held attempt.
        other.goto(f"/attempts/{third.attempt_id}/")
        assert other.page.locator("form[action$='/unassign/']").count() == 0, name
    assert not csp_errors(me)
