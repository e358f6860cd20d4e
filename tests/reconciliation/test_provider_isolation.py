"""One provider's trouble stays with that provider, and held work says why it waits (issue 40).

Bulkheads are keyed by endpoint and operation, not host: the demo's ticket and invoice lookups
answering 503 (its injected outage) hold no CRM or card call on the same host. Every held
attempt is told why once per cause, not once per pass, and stays due, so it is taken up as soon
as the hold ends. Real processes: the demo provider and, for the timing, a real worker."""

from __future__ import annotations

import signal
import time

import pytest
from django.test import Client
from django.utils import timezone

from attempts.models import Attempt, AttemptEvent, State, Tool
from reconciliation.reconciler import Reconciler
from tests.conftest import child_env, make_world, start_manage
from tests.reconciliation.conftest import (
    BadProvider,
    intent,
    make_due,
    make_stale,
    seconds_to_confirm,
    unknown,
)

OUTAGE = {
    "tools": {name: {"lookup_mode": "error_5xx"} for name in ("open_ticket", "send_invoice_email")}
}


def test_the_demo_outage_of_ticket_lookups_holds_no_send_or_lookup_of_another_tool_on_its_host(
    transactional_db, demo
) -> None:
    """The demo's five tools live on one host and port. With the ticket and invoice lookups
    down (their breakers open), a stale CRM intent and a card charge are sent and confirmed
    as fast as alone (1.5x, or a second's slack on a busy machine)."""
    world = make_world()
    demo.configure_tools(timeout=1.0)
    worker = start_manage(
        ["reconcile", "--interval", "0.2", "--worker-id", "isolation"],
        env=child_env(LEDGERWEB_STALE_AFTER="1", LEDGERWEB_PROVIDER_BREAKER_OPEN_SECONDS="60"),
    )
    try:
        alone = seconds_to_confirm(
            make_stale(intent(world, "update_crm", "alone", {"n": 0})), 15.0, worker
        )
        demo.control(**OUTAGE)
        down = [
            make_due(unknown(world, tool, f"down:{tool}:{i}", {"i": i}))
            for tool in ("open_ticket", "send_invoice_email")
            for i in range(12)
        ]
        deadline = time.monotonic() + 15
        while not AttemptEvent.objects.filter(
            attempt__in=down, action="attempt.provider_deferred"
        ).exists():
            assert time.monotonic() < deadline, "the outage never opened a breaker"
            time.sleep(0.05)
        limit = max(3.0, 1.5 * alone + 1.0)
        crm = seconds_to_confirm(
            make_stale(intent(world, "update_crm", "beside", {"n": 1})), limit, worker
        )
        card = seconds_to_confirm(
            make_stale(intent(world, "charge_card", "beside-card", {"amount": 5})), limit, worker
        )
        assert crm <= max(1.5 * alone, alone + 1.0), (alone, crm)
        assert card <= max(1.5 * alone, alone + 1.0), (alone, card)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=20)
    assert worker.returncode == 0


@pytest.fixture
def outage(world, demo):
    demo.configure_tools(timeout=1.0)
    demo.control(**OUTAGE)
    return demo


def test_held_work_is_told_why_once_per_cause_and_stays_due_in_its_order(
    world, outage, settings
) -> None:
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 60}
    tickets = [make_due(unknown(world, "open_ticket", f"t:{i}", {"i": i})) for i in range(10)]
    due_at = {a.pk: a.next_check_at for a in Attempt.objects.filter(pk__in=[t.pk for t in tickets])}
    reconciler = Reconciler(worker_id="w", concurrency=4)
    for _ in range(4):  # the first pass opens the breaker; the others find it open
        reconciler.run_pass()
        reconciler._told_at = -1e9  # look for untold work at every pass, not every 2 s
    told = AttemptEvent.objects.filter(attempt__in=tickets, action="attempt.provider_deferred")
    counts = {a.pk: told.filter(attempt=a).count() for a in tickets}
    looked_up = {a.pk for a in tickets if a.events.filter(action="attempt.lookup").exists()}
    for attempt in tickets:
        if attempt.pk in looked_up:
            continue
        # Held: told once, whatever the number of passes, with the breaker and the probe.
        assert counts[attempt.pk] == 1, counts
        details = told.get(attempt=attempt).details["provider_deferred"]
        assert details["bulkhead"].startswith("lookup ")
        assert "/tools/open_ticket/lookup" in details["bulkhead"]
        assert details["since"] and details["next_probe"]
        # 503: the demo's outage asks to wait (a default Retry-After), or the breaker opened.
        assert "circuit open" in details["why"] or "Retry-After" in details["why"]
        attempt.refresh_from_db()
        # Still due as it was: taken up in its turn when the breaker closes, not an hour on.
        assert (
            attempt.next_check_at <= due_at[attempt.pk] or attempt.next_check_at <= timezone.now()
        )
        assert attempt.lease_owner == ""
    assert len(looked_up) < len(tickets)
    # The page says, in words, what happens next and why.
    held = next(a for a in tickets if a.pk not in looked_up)
    client = Client()
    client.force_login(world.operator)
    page = client.get(f"/attempts/{held.attempt_id}/").content.decode()
    assert 'data-testid="provider-degraded"' in page
    assert "open_ticket/lookup" in page
    assert "circuit open" in page or "Retry-After" in page


def test_work_held_by_an_open_breaker_is_taken_up_when_it_closes(world, outage, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 1}
    tickets = [make_due(unknown(world, "open_ticket", f"t:{i}", {"i": i})) for i in range(8)]
    for ticket in tickets:
        outage.inject("open_ticket", ticket.idempotency_key, ticket.args)
    reconciler = Reconciler(worker_id="w", concurrency=4)
    reconciler.run_pass()
    assert AttemptEvent.objects.filter(
        attempt__in=tickets, action="attempt.provider_deferred"
    ).exists()
    outage.reset()  # the provider is back
    deadline = time.monotonic() + 20
    while (
        Attempt.objects.filter(pk__in=[t.pk for t in tickets])
        .exclude(state=State.OUTCOME_CONFIRMED)
        .exists()
    ):
        assert time.monotonic() < deadline, "held work was not taken up after the breaker closed"
        reconciler.run_pass()
        time.sleep(0.2)


def test_a_tool_without_its_key_is_told_once_and_used_at_the_first_pass_after_the_key_appears(
    world, settings
) -> None:
    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": ""}
    Tool.objects.filter(name="charge_card").update(
        adapter="stripe", dispatch_url="http://127.0.0.1:9", lookup_url="", timeout_seconds=0.5
    )
    attempt = make_due(unknown(world, "charge_card", "no-key", {"amount": 5, "currency": "eur"}))
    for _ in range(3):
        reconciler = Reconciler(worker_id="w")
        reconciler.run_pass()
    blocked = attempt.events.filter(action="attempt.recovery_blocked")
    assert blocked.count() == 1
    assert "LEDGERWEB_STRIPE_API_KEY" in blocked.get().reason
    attempt.refresh_from_db()
    assert attempt.next_check_at <= timezone.now()  # not parked for an hour
    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": "sk_test_appeared"}
    Reconciler(worker_id="w2").run_pass()
    latest = attempt.events.order_by("-id").first()
    assert latest.action != "attempt.recovery_blocked"
    assert attempt.events.filter(action="attempt.recovery_blocked").count() == 1


@pytest.mark.parametrize("bad_provider", ["trickle_close"], indirect=True)
def test_healthz_names_every_provider_whose_calls_run_past_their_deadline(
    world, bad_provider: BadProvider
) -> None:
    bad_provider.point("open_ticket", 0.5)
    make_due(unknown(world, "open_ticket", "slow", {"n": 1}))
    started = time.monotonic()
    Reconciler(worker_id="w").run_once()
    assert time.monotonic() - started < 5.0  # cut at its deadline, not when the provider stops
    body = Client().get("/healthz").json()
    assert body["status"] == "ok"
    key = f"lookup 127.0.0.1:{bad_provider.port}/lookup"
    assert key in body["providers_past_deadline"], body
    assert body["providers_past_deadline"][key]["tools"] == ["open_ticket"]


def test_the_queue_says_why_for_every_unknown_stale_or_held_row(world, outage, settings) -> None:
    from django.urls import reverse

    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 60}
    tickets = [make_due(unknown(world, "open_ticket", f"q:{i}", {"i": i})) for i in range(8)]
    reconciler = Reconciler(worker_id="w", concurrency=4)
    reconciler.run_pass()
    reconciler._told_at = -1e9
    reconciler.run_pass()
    stale = make_stale(intent(world, "update_crm", "stale-row", {"n": 1}))
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 2}
    client = Client()
    client.force_login(world.operator)
    page = client.get(reverse("queue", args=["unknown"]) + "?size=100").content.decode()
    held = [
        t
        for t in tickets
        if t.events.filter(action="attempt.provider_deferred").exists()
        and not t.events.filter(action="attempt.lookup").exists()
    ]
    assert held
    assert page.count('data-testid="why"') >= len(tickets)
    assert "Held by the provider" in page and "open_ticket/lookup" in page
    assert "recovery looks it up at the provider" in page
    page = client.get(reverse("queue", args=["stale"])).content.decode()
    assert stale.attempt_id in page
    assert "Stale: no word from its agent" in page


def test_the_overview_health_band_shows_whether_work_moves_with_links_to_its_queues(
    world, outage, settings
) -> None:
    """For every role: worker heartbeat age and reconcile lag, the providers that hold work
    with the tools they hold, approved-but-not-sent and stale counts, each a link."""
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 60, "STALE_AFTER": 2}
    for i in range(6):
        make_due(unknown(world, "open_ticket", f"b:{i}", {"i": i}))
    reconciler = Reconciler(worker_id="band", concurrency=4)
    reconciler.run_once()
    make_stale(intent(world, "update_crm", "band-stale", {"n": 1}))  # recorded after the pass
    # The held tickets have been due for a while: held on purpose, they are not lag.
    Attempt.objects.filter(tool_name="open_ticket", state=State.UNKNOWN).update(
        next_check_at=timezone.now() - timezone.timedelta(seconds=300)
    )
    for user in (world.viewer, world.operator, world.reviewer):
        client = Client()
        client.force_login(user)
        page = client.get("/").content.decode()
        assert 'data-testid="health-band"' in page, user
        assert "Reconcile worker: last heartbeat" in page
        assert "Reconcile lag:" in page
        assert "Stale in flight: 1" in page and 'href="/queues/stale/"' in page
        assert "Approved, not sent after the grace: 0" in page
        assert "Provider held:" in page and "/tools/open_ticket/lookup" in page
        assert 'data-testid="band-provider-tool">open_ticket</a>' in page
        # The held tickets are due but wait on purpose: they are not reconcile lag.
        assert "Reconcile lag: 0 s" in page


def test_the_demo_shows_its_injected_outage_as_what_it_is(world, demo, settings) -> None:
    """The demo's ticket incident (demo_agents.configure_provider) answers 503 with a message
    that says it is on purpose; the health band and the held attempt's page show it; the
    demo's other tools on the same host are not held."""
    settings.LEDGER = {**settings.LEDGER, "PROVIDER_BREAKER_OPEN_SECONDS": 60, "STALE_AFTER": 2}
    demo.ticket_incident()
    tickets = [make_due(unknown(world, "open_ticket", f"d:{i}", {"i": i})) for i in range(6)]
    crm = make_stale(intent(world, "update_crm", "demo-crm", {"n": 1}))
    reconciler = Reconciler(worker_id="demo", concurrency=4)
    reconciler.run_once()
    reconciler._told_at = -1e9
    reconciler.run_once()
    crm.refresh_from_db()
    assert crm.state == State.OUTCOME_CONFIRMED
    said = "demo: the ticket provider is down on purpose"
    client = Client()
    client.force_login(world.viewer)
    assert said in client.get("/").content.decode()
    held = next(t for t in tickets if t.events.filter(action="attempt.provider_deferred").exists())
    page = client.get(f"/attempts/{held.attempt_id}/").content.decode()
    assert said in page


def test_held_work_is_taken_up_oldest_first_and_a_full_batch_never_starves_a_probe(
    world,
) -> None:
    from reconciliation.providers.registry import Registry

    now = timezone.now()
    crm = [make_due(unknown(world, "update_crm", f"o:{i}", {"i": i})) for i in range(5)]
    # Recorded in one order, due in the reverse one: the claim follows the due time.
    for i, attempt in enumerate(crm):
        Attempt.objects.filter(pk=attempt.pk).update(
            next_check_at=now - timezone.timedelta(seconds=10 + 10 * i)
        )
    ticket = make_due(unknown(world, "open_ticket", "probe-me", {"n": 1}))
    reconciler = Reconciler(worker_id="w")
    adapter, _ = Registry.load().usable("open_ticket")
    breaker = reconciler.bulkheads.of(adapter, "lookup")
    breaker.state, breaker.failures, breaker.open_until = "open", 3, time.monotonic() - 1
    claimed = reconciler.claim(cutoff=now, limit=3, lease=timezone.timedelta(seconds=60))
    pks = {a.pk for a in claimed}
    assert ticket.pk in pks  # the probe, although the batch was full of older work
    assert pks - {ticket.pk} == {crm[4].pk, crm[3].pk}  # the oldest due, not the lowest ids


@pytest.mark.parametrize("bad_provider", ["ratelimit"], indirect=True)
def test_a_second_worker_does_not_call_a_provider_the_first_found_down(
    world, bad_provider: BadProvider
) -> None:
    """Breakers are shared through the heartbeats: the first worker's Retry-After hold (and
    open breaker) holds the second worker too, which makes no call before it ends."""
    bad_provider.point("open_ticket", 1.0)
    for i in range(4):
        make_due(unknown(world, "open_ticket", f"first:{i}", {"i": i}))
    Reconciler(worker_id="first", concurrency=4).run_once()
    hits = bad_provider.hits()
    assert hits >= 1
    for i in range(4):
        make_due(unknown(world, "open_ticket", f"second:{i}", {"i": i}))
    second = Reconciler(worker_id="second", concurrency=4)
    second.run_once()
    second.run_once()
    assert bad_provider.hits() == hits
    bulkhead = next(iter(second.bulkheads.providers.values()))
    assert bulkhead.shared_from == "first"
