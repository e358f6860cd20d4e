"""Protocol section 7, invariant 12: one provider effect (tool, provider request id) confirms at
most one attempt. A second attempt that claims it, by the reconciler's lookup, the agent's
confirm or its provider-request call, goes to MANUAL_REVIEW with an owner, and both attempts
carry an event naming the other (issue 39, item 8: a lookup answer naming another attempt's id,
with a matching args hash, confirmed three attempts on one id)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from attempts import ledger
from attempts.ledger import EFFECT_CLAIMED, EFFECT_CONTESTED
from attempts.models import Attempt, AttemptEvent, ProviderEffect, State, Tool
from reconciliation.reconciler import Reconciler
from tests.conftest import agent_intent
from tests.http_handler import QuietHandler
from tests.reconciliation.conftest import make_due, unknown

ARGS = {"n": 1, "to": "a@example.test"}
EFFECT = "effect-1"


class _OneEffect(QuietHandler):
    """A provider whose lookup answers every key with the same effect, whose payload hash
    matches the attempts' (they were recorded with the same arguments)."""

    args_hash = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.reply(200, json.dumps({"id": EFFECT, "args_hash": self.args_hash}).encode())


@pytest.fixture
def one_effect_provider(world) -> Iterator[type[_OneEffect]]:
    """A real HTTP provider on 127.0.0.1 that every tool of the world looks up."""
    handler = type("Handler", (_OneEffect,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    for tool in Tool.objects.all():
        tool.dispatch_url = f"{base}/tools/{tool.name}/send"
        tool.lookup_url = f"{base}/tools/{tool.name}/lookup"
        tool.timeout_seconds = 2.0
        tool.save()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _events(attempt: Attempt, action: str) -> list[AttemptEvent]:
    return list(AttemptEvent.objects.filter(attempt=attempt, action=action).order_by("id"))


def _assert_linked(winner: Attempt, loser: Attempt) -> None:
    """The loser waits for a person, owned, without the effect's id, its event naming the
    winner; the winner's history names the loser."""
    loser.refresh_from_db()
    assert loser.state == State.MANUAL_REVIEW
    assert loser.review_reason == EFFECT_CLAIMED
    assert loser.owner_id is not None
    assert loser.provider_request_id == ""
    moved = _events(loser, "attempt.manual_review")[-1]
    assert moved.details[EFFECT_CLAIMED]["claimed_by"] == winner.attempt_id
    assert moved.details[EFFECT_CLAIMED]["provider_request_id"] == EFFECT
    contested = [e.details["effect_contested"] for e in _events(winner, EFFECT_CONTESTED)]
    assert loser.attempt_id in [c["contested_by"] for c in contested]


def test_a_lookup_naming_another_attempts_effect_confirms_one_attempt_only(
    world, one_effect_provider
) -> None:
    attempts = [unknown(world, "update_crm", f"crm:acme:effect:{n}", ARGS) for n in range(3)]
    one_effect_provider.args_hash = attempts[0].args_hash
    for attempt in attempts:
        make_due(attempt)
    Reconciler(worker_id="test-worker", concurrency=4).run_pass()
    for attempt in attempts:
        attempt.refresh_from_db()
    confirmed = [a for a in attempts if a.state == State.OUTCOME_CONFIRMED]
    assert len(confirmed) == 1, [(a.attempt_id, a.state) for a in attempts]
    winner = confirmed[0]
    assert winner.provider_request_id == EFFECT
    for loser in attempts:
        if loser is not winner:
            _assert_linked(winner, loser)
    assert list(ProviderEffect.objects.values_list("provider_request_id", "attempt_id")) == [
        (EFFECT, winner.attempt_id)
    ]
    # A second pass changes nothing: the losers wait for a person.
    Reconciler(worker_id="test-worker", concurrency=4).run_pass()
    assert Attempt.objects.filter(state=State.OUTCOME_CONFIRMED).count() == 1


def _sent(world, key: str) -> Attempt:
    attempt, created = agent_intent(world, key, tool="update_crm", args=ARGS, task="task-1")
    assert created
    attempt, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed
    return attempt


def test_an_agents_confirm_of_a_claimed_effect_sends_its_attempt_to_review(world) -> None:
    first = _sent(world, "crm:acme:confirm:1")
    ledger.confirm(first, result_ref="receipt-1", provider_request_id=EFFECT, actor=world.agent)
    second = _sent(world, "crm:acme:confirm:2")
    with pytest.raises(ledger.StateConflict) as refused:
        ledger.confirm(
            second, result_ref="receipt-1", provider_request_id=EFFECT, actor=world.agent
        )
    assert refused.value.code == EFFECT_CLAIMED
    _assert_linked(first, second)
    first.refresh_from_db()
    assert first.state == State.OUTCOME_CONFIRMED


def test_an_agents_provider_request_call_naming_a_claimed_effect_sends_it_to_review(
    world,
) -> None:
    first = _sent(world, "crm:acme:attach:1")
    ledger.attach_provider_request(first, EFFECT, actor=world.agent)
    second = _sent(world, "crm:acme:attach:2")
    with pytest.raises(ledger.StateConflict) as refused:
        ledger.attach_provider_request(second, EFFECT, actor=world.agent)
    assert refused.value.code == EFFECT_CLAIMED
    _assert_linked(first, second)
    # The first keeps its effect and is confirmed as usual.
    ledger.confirm(first, result_ref="receipt-1", actor=world.agent)
    assert ledger.get_attempt(first.attempt_id).state == State.OUTCOME_CONFIRMED


def test_the_same_id_under_another_tool_is_another_effect(world) -> None:
    first = _sent(world, "crm:acme:tools:1")
    ledger.attach_provider_request(first, EFFECT, actor=world.agent)
    attempt, _ = agent_intent(
        world, "ticket:acme:tools:1", tool="open_ticket", args=ARGS, task="task-1"
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=world.agent)
    confirmed = ledger.confirm(
        attempt, result_ref="receipt-2", provider_request_id=EFFECT, actor=world.agent
    )
    assert confirmed.state == State.OUTCOME_CONFIRMED


def test_a_confirm_by_a_receipt_naming_a_claimed_effect_sends_its_attempt_to_review(
    world,
) -> None:
    """Confirmed without a provider request id, the receipt names the effect (docs/api.md)."""
    first = _sent(world, "crm:acme:receipt:1")
    ledger.confirm(first, result_ref="r-1", provider_request_id=EFFECT, actor=world.agent)
    second = _sent(world, "crm:acme:receipt:2")
    with pytest.raises(ledger.StateConflict) as refused:
        ledger.confirm(second, result_ref=f"receipt:{EFFECT}", actor=world.agent)
    assert refused.value.code == EFFECT_CLAIMED
    _assert_linked(first, second)


def test_a_reviewer_cannot_confirm_an_attempt_by_another_attempts_effect(world) -> None:
    from attempts import review

    first = _sent(world, "crm:acme:review:1")
    ledger.confirm(first, result_ref="r-1", provider_request_id=EFFECT, actor=world.agent)
    second = _sent(world, "crm:acme:review:2")
    second = ledger.mark_unknown(second, reason="timeout", actor=world.agent)
    with pytest.raises(ledger.StateConflict) as refused:
        review.review_confirm(
            second, user=world.reviewer, result_ref=f"lookup:{EFFECT}", evidence="saw it"
        )
    assert refused.value.code == EFFECT_CLAIMED
    assert ledger.get_attempt(second.attempt_id).state == State.UNKNOWN
    # Evidence of an effect of its own is a reviewer's to accept.
    confirmed = review.review_confirm(
        second, user=world.reviewer, result_ref="ticket-77", evidence="its own effect"
    )
    assert confirmed.state == State.OUTCOME_CONFIRMED
