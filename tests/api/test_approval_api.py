"""Protocol sections 9 and 11 over HTTP: a held intent is 202 AWAITING_APPROVAL, its dispatch
is 409 ``awaiting_approval``, ``GET ?wait=N`` long-polls without holding anything and answers
as soon as a person decides; where no policy matches, 201 and 200 are unchanged."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from django.db import connection

from attempts import review
from attempts.models import ApprovalPolicy, Attempt, State
from tests.api.conftest import Api, Tokens, intent_body, ledger_snapshot
from tests.conftest import World


@pytest.fixture
def held_tickets(world: World) -> ApprovalPolicy:
    return ApprovalPolicy.objects.create(
        name="urgent-tickets", tool_id="open_ticket", condition="args.priority >= 2"
    )


def test_a_held_intent_is_202_awaiting_approval_and_its_replay_200(api: Api, held_tickets):
    first = api.intent("k:held")
    assert first.status == 202
    attempt = first.body["attempt"]
    assert attempt["state"] == "AWAITING_APPROVAL" and first.body["created"] is True
    assert attempt["approval_policy"] == "urgent-tickets"
    assert attempt["owner"] == "triage"
    again = api.intent("k:held")
    assert (again.status, again.body["attempt"]["attempt_id"]) == (200, attempt["attempt_id"])
    # No match: 201 as always.
    plain = api.intent("k:plain", args={"title": "t", "priority": 1})
    assert plain.status == 201 and plain.body["attempt"]["state"] == "INTENT_RECORDED"
    assert plain.body["attempt"]["approval_policy"] is None


def test_dispatch_of_a_held_attempt_is_409_awaiting_approval_and_changes_nothing(
    api: Api, held_tickets
):
    attempt_id = api.intent("k:held").body["attempt"]["attempt_id"]
    before = ledger_snapshot()
    answer = api.post(f"attempts/{attempt_id}/dispatch")
    assert answer.status == 409
    assert answer.body["error"]["code"] == "awaiting_approval"
    assert answer.body["attempt"]["state"] == "AWAITING_APPROVAL"
    assert ledger_snapshot() == before


def test_approved_the_agent_dispatches_as_usual(api: Api, world: World, held_tickets):
    attempt_id = api.intent("k:held").body["attempt"]["attempt_id"]
    review.approve_held(attempt_id, user=world.reviewer)
    assert api.get(f"attempts/{attempt_id}").body["attempt"]["state"] == "INTENT_RECORDED"
    answer = api.post(f"attempts/{attempt_id}/dispatch")
    assert answer.status == 200 and answer.body["dispatch"] is True


def test_rejected_the_agent_sees_failed_and_may_not_send(api: Api, world: World, held_tickets):
    attempt_id = api.intent("k:held").body["attempt"]["attempt_id"]
    review.reject_held(attempt_id, user=world.reviewer, reason="not urgent")
    body = api.get(f"attempts/{attempt_id}?wait=5").body["attempt"]
    assert (body["state"], body["review_reason"]) == ("FAILED", "approval_rejected")
    assert api.post(f"attempts/{attempt_id}/dispatch").body["error"]["code"] == "not_dispatchable"


@pytest.mark.parametrize("query", ["wait=-1", "wait=26", "wait=1.5", "wait=x", "other=1"])
def test_a_bad_wait_is_422(api: Api, held_tickets, query):
    attempt_id = api.intent("k:held").body["attempt"]["attempt_id"]
    answer = api.get(f"attempts/{attempt_id}?{query}")
    assert answer.status == 422 and answer.body["error"]["code"] == "invalid_field"


def test_wait_returns_after_the_bound_when_nobody_decides(api: Api, held_tickets, settings):
    attempt_id = api.intent("k:held").body["attempt"]["attempt_id"]
    started = time.monotonic()
    answer = api.get(f"attempts/{attempt_id}?wait=1")
    assert 0.9 <= time.monotonic() - started < 3
    # Asking for longer than this deployment allows waits its maximum only.
    settings.LEDGER = {**settings.LEDGER, "APPROVAL_WAIT_MAX": 1}
    started = time.monotonic()
    assert api.get(f"attempts/{attempt_id}?wait=25").status == 200
    assert 0.9 <= time.monotonic() - started < 3
    assert answer.body["attempt"]["state"] == "AWAITING_APPROVAL"
    # Only a held attempt waits.
    plain = api.intent("k:plain", args={"title": "t", "priority": 1}).body["attempt"]
    started = time.monotonic()
    api.get(f"attempts/{plain['attempt_id']}?wait=5")
    assert time.monotonic() - started < 1


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_answers_soon_after_the_approval_and_holds_no_transaction(
    gunicorn: str, tokens: Tokens, world: World
):
    ApprovalPolicy.objects.create(name="urgent-tickets", tool_id="open_ticket")
    request = urllib.request.Request(  # noqa: S310 (our own server on 127.0.0.1)
        f"{gunicorn}/api/v1/attempts",
        data=json.dumps(intent_body("k:poll")).encode(),
        headers={"Authorization": f"Bearer {tokens.acme}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert response.status == 202
        attempt_id = json.loads(response.read())["attempt"]["attempt_id"]
    answer: dict = {}

    def poll() -> None:
        started = time.monotonic()
        get = urllib.request.Request(  # noqa: S310
            f"{gunicorn}/api/v1/attempts/{attempt_id}?wait=15",
            headers={"Authorization": f"Bearer {tokens.acme}"},
        )
        with urllib.request.urlopen(get, timeout=30) as response:  # noqa: S310
            answer.update(json.loads(response.read()), took=time.monotonic() - started)

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(1.0)
    # While the agent waits, an approval commits: the waiting request holds no lock or snapshot.
    review.approve_held(attempt_id, user=world.reviewer)
    connection.close()
    waiter.join(timeout=20)
    assert answer["attempt"]["state"] == State.INTENT_RECORDED
    assert 1.0 <= answer["took"] < 4
    assert Attempt.objects.get(attempt_id=attempt_id).state == State.INTENT_RECORDED
