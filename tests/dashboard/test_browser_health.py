"""Browser test: the overview's health band and the reason on a held attempt (issue 40).

The demo provider with the demo's ticket outage, a real reconcile pass, then a viewer in
headless Chromium: the band names the held provider and the tools it holds, its link opens the
queue whose WHY column says why, and the held attempt's page says what happens next."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_LIVE_TEST_SERVER_ADDRESS", "127.0.0.1")

from attempts.models import Attempt  # noqa: E402
from reconciliation.reconciler import Reconciler  # noqa: E402
from tests.conftest import make_world  # noqa: E402
from tests.dashboard.conftest import Tab  # noqa: E402
from tests.reconciliation.conftest import DemoProvider, make_due, unknown  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SAID = "demo: the ticket provider is down on purpose"


def test_the_health_band_and_the_reason_on_a_held_attempt(
    live_server, browser, settings, tmp_path: Path
) -> None:
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 120}
    world = make_world()
    demo = DemoProvider(tmp_path)
    try:
        demo.ticket_incident()
        tickets = [make_due(unknown(world, "open_ticket", f"b:{i}", {"i": i})) for i in range(6)]
        reconciler = Reconciler(worker_id="browser", concurrency=4)
        reconciler.run_once()
        reconciler._told_at = -1e9
        reconciler.run_once()
    finally:
        demo.stop()
    held = next(t for t in tickets if t.events.filter(action="attempt.provider_deferred").exists())

    me = Tab(browser, live_server.url)
    page = me.page
    me.login("viewer")
    me.goto("/")
    band = page.locator("[data-testid=health-band]")
    band.wait_for()
    text = band.inner_text()
    assert "Reconcile worker: last heartbeat" in text and "Reconcile lag" in text
    assert "Provider held" in text and SAID in text
    me.shot("health-band")

    # The band's tool link opens the queue of that tool, whose WHY column says why.
    band.locator("[data-testid=band-provider-tool]", has_text="open_ticket").first.click()
    page.wait_for_url("**tool=open_ticket**")
    whys = page.locator("[data-testid=why]").all_inner_texts()
    assert any("Held by the provider" in why for why in whys), whys
    me.shot("health-queue-why")

    me.goto(f"/attempts/{held.attempt_id}/")
    reason = page.locator("[data-testid=provider-degraded]")
    reason.wait_for()
    said = reason.inner_text()
    assert "What happens next" in said and SAID in said and "next probe" in said
    me.shot("health-held-attempt")
    assert not me.errors, me.errors
    assert Attempt.objects.filter(pk=held.pk).exists()
