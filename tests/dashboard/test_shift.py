"""An operator's shift, server side: open forms survive background work and keep what was typed
when a real conflict refuses them; what waits for my approval; SLA ages and acknowledgement;
bulk decisions; the diff of linked attempts; error pages and navigation by role; owners who can
act; my settings and time zone."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.utils import timezone

from attempts import review
from attempts.models import Attempt, LoginThrottle, PersonSettings, SlaPolicy, State
from tests.dashboard.conftest import (
    make_awaiting,
    make_review,
    make_unknown,
)


def worker_lookup(attempt: Attempt) -> None:
    """What the reconciler records when a lookup cannot decide: the attempt stays UNKNOWN, its
    lookup count and version go up."""
    from attempts import states
    from attempts.locking import write_transaction
    from tests.dashboard.conftest import WORKER

    current = Attempt.objects.get(pk=attempt.pk)
    with write_transaction():
        states.move(
            current,
            None,
            actor=WORKER,
            action="attempt.lookup",
            reason="lookup unavailable: staying UNKNOWN",
            details={"answer": "unavailable"},
            increments={"lookup_count": 1},
        )


def _form_seen(client, attempt: Attempt) -> dict[str, str]:
    """The hidden fields the attempt page rendered into its forms."""
    context = client.get(f"/attempts/{attempt.attempt_id}/").context
    return {"expected_version": context["attempt"].version, "seen_event": context["last_event_id"]}


def test_a_lookup_that_stays_unknown_does_not_refuse_an_open_form(world, clients):
    attempt = make_unknown(world)
    seen = _form_seen(clients.reviewer, attempt)
    worker_lookup(attempt)  # the worker, while the form is open
    assert Attempt.objects.get(pk=attempt.pk).version != seen["expected_version"]
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/confirm/",
        {**seen, "result_ref": "rcpt-7", "evidence": "provider dashboard"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.content
    assert Attempt.objects.get(pk=attempt.pk).state == State.OUTCOME_CONFIRMED


def test_a_form_without_what_it_saw_is_still_strict(world, clients):
    attempt = make_unknown(world)
    version = attempt.version
    worker_lookup(attempt)
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/fail/",
        {"expected_version": version, "reason": "never arrived"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409
    assert Attempt.objects.get(pk=attempt.pk).state == State.UNKNOWN


def test_a_real_conflict_brings_the_form_back_with_what_was_typed(world, clients):
    attempt = make_review(world)
    seen = _form_seen(clients.reviewer, attempt)
    review.assign(attempt, user=world.operator, owner=world.reviewer2)  # a decision meanwhile
    response = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/confirm/",
        {**seen, "result_ref": "crm-rev-1", "evidence": "audit log line 42"},
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert response.status_code == 409
    assert 'value="crm-rev-1"' in body and "audit log line 42</textarea>" in body
    assert "operator changed its owner" in body
    fresh = Attempt.objects.get(pk=attempt.pk)
    assert f'name="expected_version" value="{fresh.version}"' in body
    assert fresh.state == State.MANUAL_REVIEW
    # Submitting the returned form now works: the person saw the change.
    fields = {"expected_version": fresh.version, "seen_event": fresh.last_event_id()}
    again = clients.reviewer.post(
        f"/attempts/{attempt.attempt_id}/confirm/",
        {**fields, "result_ref": "crm-rev-1", "evidence": "audit log line 42"},
        headers={"HX-Request": "true"},
    )
    assert again.status_code == 200
    # Without htmx, the whole page comes back with the form open and filled in.
    other = make_review(world)
    seen = _form_seen(clients.reviewer, other)
    review.assign(other, user=world.operator, owner=world.reviewer2)
    page = clients.reviewer.post(
        f"/attempts/{other.attempt_id}/fail/", {**seen, "reason": "provider has no record"}
    )
    assert page.status_code == 409
    assert "provider has no record</textarea>" in page.content.decode()


def test_the_detail_page_refreshes_its_live_part_only(world, clients):
    attempt = make_unknown(world)
    page = clients.reviewer.get(f"/attempts/{attempt.attempt_id}/")
    since = page.context["last_event_id"]
    assert f'hx-get="/attempts/{attempt.attempt_id}/?since={since}"' in page.content.decode()
    review.assign(attempt, user=world.operator, owner=world.reviewer2)
    poll = clients.reviewer.get(
        f"/attempts/{attempt.attempt_id}/?since={since}", headers={"HX-Request": "true"}
    )
    body = poll.content.decode()
    assert body.lstrip().startswith('<div class="detail-main" id="attempt-live"')
    assert "<form" not in body  # open forms are never replaced
    assert "Changed since you opened this page: operator changed its owner" in body
    assert 'id="attempt-status" class="head-state" hx-swap-oob="true"' in body


def test_awaiting_my_approval_filter_badge_and_count(world, clients):
    linked = make_awaiting(world)
    half = make_review(world, tool="charge_card")  # critical: two reviewers
    review.approve_linked_retry(half, user=world.reviewer)
    plain = make_review(world)
    for who, expected in (
        ("reviewer", {linked.attempt_id}),
        ("reviewer2", {linked.attempt_id, half.attempt_id}),
    ):
        client = getattr(clients, who)
        response = client.get("/queues/review/?awaiting=me")
        assert {r["attempt_id"] for r in response.context["page"].rows} == expected
        assert plain.attempt_id not in response.content.decode()
        assert response.content.decode().count('data-testid="awaits-me"') == len(expected)
        overview = client.get("/")
        assert overview.context["awaiting_me"] == len(expected)
    # Operators approve nothing: nothing awaits them.
    assert clients.operator.get("/").context["awaiting_me"] == 0


def test_sla_ages_are_coloured_and_acknowledged_without_taking(world, clients):
    SlaPolicy.objects.create(
        tool_id="open_ticket",
        unknown_warn_after=dt.timedelta(minutes=10),
        unknown_breach_after=dt.timedelta(hours=1),
    )
    warn, breach, fine = (make_unknown(world) for _ in range(3))
    now = timezone.now()
    Attempt.objects.filter(pk=warn.pk).update(created_at=now - dt.timedelta(minutes=20))
    Attempt.objects.filter(pk=breach.pk).update(created_at=now - dt.timedelta(hours=2))
    rows = {
        r["attempt_id"]: r["sla"]
        for r in clients.operator.get("/queues/unknown/").context["page"].rows
    }
    assert rows == {warn.attempt_id: "warn", breach.attempt_id: "breach", fine.attempt_id: ""}
    response = clients.operator.post(
        f"/attempts/{breach.attempt_id}/acknowledge/",
        {"comment": "provider outage"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    assert Attempt.objects.get(pk=breach.pk).owner == world.triage  # not taken
    page = clients.operator.get(f"/attempts/{breach.attempt_id}/").content.decode()
    assert "acknowledged by operator" in page and "SLA breached" in page
    assert clients.viewer.post(f"/attempts/{warn.attempt_id}/acknowledge/").status_code == 302


def test_prefix_search_and_owner_by_person(world, clients):
    target = make_unknown(world, provider_request_id="prv_2e63bbed91", key="acme:invoice:77")
    review.assign(target, user=world.operator, owner=world.reviewer2)
    make_unknown(world)
    for term in ("prv_2e63bbed", "acme:invoice", target.args_hash[:5]):
        rows = clients.viewer.get("/queues/all/", {"q": term}).context["page"].rows
        assert [r["attempt_id"] for r in rows] == [target.attempt_id], term
    mine = clients.viewer.get("/queues/unknown/?owner=reviewer2").context["page"].rows
    assert [r["attempt_id"] for r in mine] == [target.attempt_id]
    assert clients.viewer.get("/queues/unknown/?owner=outsider").status_code == 400
    page = clients.viewer.get("/queues/all/?size=25")
    assert page.context["page"].total == 2 and page.context["page"].total_exact


def test_bulk_confirm_fail_and_note_check_role_and_version_per_attempt(world, clients):
    a, b, c = (make_review(world) for _ in range(3))
    picks = [f"{x.attempt_id}:{x.version}:{x.last_event_id()}" for x in (a, b, c)]
    review.assign(c, user=world.operator, owner=world.reviewer2)  # c changed meanwhile
    worker_lookup(b)  # b only looked up: no conflict
    response = clients.reviewer.post(
        "/queues/bulk/",
        {
            "action": "fail",
            "attempt": picks,
            "reason": "provider confirms none of these",
            "next": "/queues/review/",
        },
        follow=True,
    )
    body = response.content.decode()
    assert "Marked FAILED 2 attempts." in body and "1 not changed" in body
    states = {x.pk: Attempt.objects.get(pk=x.pk).state for x in (a, b, c)}
    assert states == {a.pk: State.FAILED, b.pk: State.FAILED, c.pk: State.MANUAL_REVIEW}
    # Operators may note but not decide.
    d = make_review(world)
    pick = [f"{d.attempt_id}:{d.version}"]
    clients.operator.post(
        "/queues/bulk/",
        {"action": "confirm", "attempt": pick, "result_ref": "r", "evidence": "e"},
    )
    assert Attempt.objects.get(pk=d.pk).state == State.MANUAL_REVIEW
    clients.operator.post("/queues/bulk/", {"action": "note", "attempt": pick, "text": "seen"})
    assert Attempt.objects.get(pk=d.pk).events.last().reason == "seen"
    # Evidence is required: nothing changes without it.
    clients.reviewer.post(
        "/queues/bulk/", {"action": "confirm", "attempt": pick, "result_ref": "r"}
    )
    assert Attempt.objects.get(pk=d.pk).state == State.MANUAL_REVIEW


def test_linked_attempts_show_what_differs(world, clients):
    from attempts.models import Grant

    original = make_unknown(world, tool="open_ticket")
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(
        policy_version="v2", allowed_scopes=["open_ticket:write"]
    )
    from attempts import linked
    from tests.dashboard.conftest import WORKER

    child = linked.create_linked_attempt(original, actor=WORKER, reason="policy changed")
    for url in (f"/attempts/{child.attempt_id}/", f"/attempts/{child.attempt_id}/approve/"):
        diff = clients.reviewer.get(url).context["diff"]
        fields = {row["field"]: (row["before"], row["after"]) for row in diff["rows"]}
        assert fields["Policy version"] == ("v1", "v2"), url
        assert fields["Idempotency key"] == (original.idempotency_key, child.idempotency_key)
        assert "Args hash" not in fields  # same arguments


def test_owners_must_be_able_to_act(world, clients):
    attempt = make_unknown(world)
    page = clients.operator.get(f"/attempts/{attempt.attempt_id}/")
    assert "viewer" not in page.context["assignees"]
    assert '<option value="">choose a person…</option>' in page.content.decode()
    response = clients.operator.post(
        f"/attempts/{attempt.attempt_id}/assign/",
        {"owner": "viewer", "expected_version": attempt.version},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 403
    assert "cannot act on attempts" in response.content.decode()
    assert Attempt.objects.get(pk=attempt.pk).owner == world.triage


def test_error_pages_are_inside_the_layout_with_the_reason(world, clients, caplog):
    with caplog.at_level(logging.INFO):
        response = clients.operator.get("/audit/")
    body = response.content.decode()
    assert response.status_code == 403
    assert '<nav aria-label="Main">' in body and "audit reports are for reviewers" in body.lower()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback for an ordinary 403
    missing = clients.operator.get("/attempts/att_nope/")
    assert missing.status_code == 404
    assert '<nav aria-label="Main">' in missing.content.decode()
    assert "No such attempt" in missing.content.decode()


def test_navigation_shows_only_what_the_role_may_open(world, clients):
    assert 'data-testid="nav-audit"' not in clients.operator.get("/").content.decode()
    assert 'data-testid="nav-audit"' in clients.reviewer.get("/").content.decode()


def test_my_settings_and_time_zone(world, clients):
    attempt = make_unknown(world)
    response = clients.operator.post(
        "/settings/",
        {"time_zone": "Asia/Tokyo", "email": "on", "kinds": ["assigned"], "digest_hour": "7"},
    )
    assert response.status_code == 302
    prefs = PersonSettings.objects.get(user=world.operator)
    assert (prefs.time_zone, prefs.email, prefs.chat, prefs.kinds, prefs.digest_hour) == (
        "Asia/Tokyo",
        True,
        False,
        ["assigned"],
        7,
    )
    page = clients.operator.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert "JST" in page
    assert clients.operator.post("/settings/", {"time_zone": "Mars/Olympus"}).status_code == 400
    assert "UTC" in clients.viewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()


@pytest.mark.django_db
def test_admin_shows_who_is_locked_out(client, world):
    for _ in range(6):
        client.post("/login/", {"username": "operator", "password": "wrong"})
    row = LoginThrottle.objects.get(username="operator", address="127.0.0.1")
    assert row.address == "127.0.0.1" and row.locked_until is not None
    admin = login_admin(world)
    page = admin.get("/admin/attempts/loginthrottle/").content.decode()
    assert "operator" in page and "127.0.0.1" in page


def login_admin(world):
    from django.test import Client

    world.admin.is_staff = True
    world.admin.is_superuser = True
    world.admin.save()
    client = Client()
    client.force_login(world.admin)
    return client
