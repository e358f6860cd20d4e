"""Hostile input and faults never stop recovery (issue 13).

Keys in any script reach the provider faithfully through the generic HTTP provider and the demo
provider (real processes on 127.0.0.1); control characters are refused at intake; an attempt
whose handling raises goes to a person while the pass settles its neighbours; the worker process
itself survives it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from attempts import ledger
from attempts.models import Attempt, AttemptEvent, State, Tool
from reconciliation.providers import base
from reconciliation.providers.http import wire_key
from reconciliation.reconciler import Reconciler
from tests.conftest import child_env, manage
from tests.reconciliation.conftest import dispatched, intent, make_due, unknown

ARGS = {"n": 1, "to": "a@example.test"}
HERE = "tests.reconciliation.test_hostile_input"

KEYS = [
    "mail:alpha:請求書-42:send",
    "crm:مرحبا:фактура:42",
    "emoji:\U0001f680:astral",
    "combining:e\u0301:nfd",
    "percent:100%:a%20b",
    "percent:100%:a b",
    "plain ascii key:with inner spaces",
    "長" * 255,  # the length limit, three UTF-8 bytes each
    "\U0001f680" * 255,  # the length limit, four UTF-8 bytes each
]


def reconcile() -> Any:
    return Reconciler(worker_id="test-worker", concurrency=4).run_pass()


def reload(attempt: Attempt) -> Attempt:
    return Attempt.objects.get(pk=attempt.pk)


# ------------------------------------------------------------------------------ keys


def test_wire_keys_are_ascii_and_never_collide() -> None:
    wires = {}
    for key in [*KEYS, "a%b", "a%25b", "a b", "a%20b", " lead", "tail "]:
        wire, encoded = wire_key(key)
        wire.encode("ascii")
        assert "\n" not in wire and "\r" not in wire
        assert encoded == ("%" in wire)
        assert wire not in wires, f"{key!r} and {wires.get(wire)!r} travel as the same key"
        wires[wire] = key


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k[:24])
def test_a_stale_intent_reaches_the_provider_with_its_exact_key(wired, demo, key: str) -> None:
    """Sent by recovery through the generic HTTP provider, stored by the provider under the
    agent's exact key, and confirmed by a lookup that finds it under that key."""
    tool = "update_crm"
    attempt = make_due(intent(wired, tool, key, ARGS))

    summary = reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED, list(
        attempt.events.values_list("reason", flat=True)
    )
    [effect] = [e for e in demo.effects(tool=tool) if e["ledger_attempt_id"] == attempt.attempt_id]
    assert effect["idempotency_key"] == key
    assert attempt.provider_request_id == effect["id"]
    assert summary.outcomes["confirmed"] == 1


@pytest.mark.parametrize("key", KEYS[:3] + KEYS[-2:], ids=lambda k: k[:24])
def test_an_unknown_attempt_is_found_under_its_exact_key(wired, demo, key: str) -> None:
    attempt = make_due(unknown(wired, "open_ticket", key, ARGS))
    effect = demo.inject("open_ticket", key, ARGS)

    reconcile()

    attempt = reload(attempt)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.provider_request_id == effect["id"]
    assert demo.summary()["total"] == 1  # found, nothing sent again


def test_the_poisoned_keys_of_the_report_no_longer_stop_a_pass(wired, demo) -> None:
    """The issue's key, and a key with a newline recorded before intake refused them (written
    straight into the table), are sent and confirmed; a neighbour is settled in the same pass."""
    poisoned = make_due(dispatched(wired, "update_crm", "legacy-key", ARGS))
    Attempt.objects.filter(pk=poisoned.pk).update(idempotency_key="legacy\nkey\x01")
    japanese = make_due(unknown(wired, "update_crm", "mail:alpha:請求書-42:send", ARGS))
    neighbour = make_due(unknown(wired, "open_ticket", "t:neighbour", ARGS))
    demo.inject("open_ticket", "t:neighbour", ARGS)

    reconcile()

    assert reload(neighbour).state == State.OUTCOME_CONFIRMED
    assert reload(japanese).state == State.OUTCOME_CONFIRMED
    assert reload(poisoned).state == State.OUTCOME_CONFIRMED
    keys = {e["idempotency_key"] for e in demo.effects(tool="update_crm")}
    assert keys == {"legacy\nkey\x01", "mail:alpha:請求書-42:send"}


@pytest.mark.parametrize(
    "bad",
    ["line\nbreak", "nul\x00", "tab\tinside", "del\x7f", "c1\x85next", "esc\x1b[31m", "end\x1f"],
    ids=repr,
)
@pytest.mark.parametrize("field", ["idempotency_key", "task_id", "policy_version"])
def test_control_characters_are_refused_at_intake(world, bad: str, field: str) -> None:
    fields = {
        "tenant": "acme",
        "task_id": "task-1",
        "tool_name": "update_crm",
        "idempotency_key": "k:ok",
        "args": ARGS,
        "actor": world.agent,
        field: bad,
    }
    with pytest.raises(ledger.InvalidIntent, match="control character"):
        ledger.record_intent(**fields)
    assert not Attempt.objects.exists()


def test_a_lone_surrogate_is_refused_at_intake(world) -> None:
    with pytest.raises(ledger.InvalidIntent, match="lone surrogate"):
        intent(world, "update_crm", "bad:\ud800")
    assert not Attempt.objects.exists()


def test_reasons_may_span_lines_but_not_carry_other_control_characters(world) -> None:
    attempt = dispatched(world, "update_crm", "k:reason")
    with pytest.raises(ledger.InvalidIntent, match="control character"):
        ledger.mark_unknown(attempt, reason="bell\x07", actor=world.agent)
    ledger.mark_unknown(attempt, reason="timed out\nafter 30 s", actor=world.agent)
    assert reload(attempt).state == State.UNKNOWN


# ------------------------------------------------------------------------------ quarantine


class ExplodingAdapter(base.Adapter):
    """A provider adapter with a bug: it raises instead of answering."""

    def send(self, call: base.Call) -> base.SendAnswer:
        raise UnicodeEncodeError("latin-1", call.idempotency_key, 0, 1, "ordinal not in range")

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        raise ValueError(f"Invalid header value {call.idempotency_key!r}")


class _UnrecordableAnswer(base.LookupAnswer):
    def as_details(self) -> dict[str, Any]:
        raise RuntimeError("this answer cannot be recorded")


class UnrecordableAdapter(base.Adapter):
    """Answers FOUND with an answer whose recording raises (a bug on the apply side)."""

    def send(self, call: base.Call) -> base.SendAnswer:
        return base.SendAnswer(base.SendStatus.ACCEPTED, provider_request_id="x")

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        return _UnrecordableAnswer(base.LookupStatus.FOUND, provider_request_id="x", args_hash="y")


class BrokenCheckAdapter(ExplodingAdapter):
    def check(self) -> list[str]:
        raise KeyError("configuration")


@pytest.fixture
def buggy_adapters(settings):
    settings.LEDGER = {
        **settings.LEDGER,
        "ADAPTERS": {
            **settings.LEDGER["ADAPTERS"],
            "exploding": f"{HERE}.ExplodingAdapter",
            "unrecordable": f"{HERE}.UnrecordableAdapter",
            "broken-check": f"{HERE}.BrokenCheckAdapter",
        },
    }


def _quarantined(attempt: Attempt, world) -> AttemptEvent:
    attempt = reload(attempt)
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.review_reason == "worker_error"
    assert attempt.owner == world.triage
    assert (attempt.lease_owner, attempt.lease_until, attempt.next_check_at) == ("", None, None)
    event = attempt.events.last()
    assert event.to_state == State.MANUAL_REVIEW
    assert event.actor_kind == "worker"
    return event


@pytest.mark.parametrize("state", ["INTENT_RECORDED", "UNKNOWN"])
def test_an_adapter_that_raises_quarantines_its_attempt_and_the_pass_goes_on(
    wired, demo, buggy_adapters, state: str
) -> None:
    Tool.objects.filter(name="update_crm").update(adapter="exploding")
    make = intent if state == "INTENT_RECORDED" else unknown
    bad = make_due(make(wired, "update_crm", "c:explodes", ARGS))
    neighbour = make_due(unknown(wired, "open_ticket", "t:fine", ARGS))
    demo.inject("open_ticket", "t:fine", ARGS)

    summary = reconcile()

    event = _quarantined(bad, wired)
    error = "UnicodeEncodeError" if state == "INTENT_RECORDED" else "ValueError"
    assert error in event.reason
    assert event.details["error"]["type"] == error
    assert reload(neighbour).state == State.OUTCOME_CONFIRMED
    assert summary.outcomes["quarantined"] == 1
    reconcile()  # resting with a person: nothing more happens to it
    assert reload(bad).state == State.MANUAL_REVIEW


def test_an_error_while_recording_an_answer_quarantines_only_that_attempt(
    wired, demo, buggy_adapters
) -> None:
    """The failing step ran without a savepoint: the group is written again attempt by attempt,
    so the neighbour answered in the same group is still confirmed."""
    Tool.objects.filter(name="update_crm").update(adapter="unrecordable")
    bad = make_due(unknown(wired, "update_crm", "c:unrecordable", ARGS))
    neighbours = [make_due(unknown(wired, "open_ticket", f"t:n{i}", ARGS)) for i in range(3)]
    for i in range(3):
        demo.inject("open_ticket", f"t:n{i}", ARGS)

    reconcile()

    assert "this answer cannot be recorded" in _quarantined(bad, wired).reason
    assert [reload(n).state for n in neighbours] == [State.OUTCOME_CONFIRMED] * 3
    assert all(
        reload(n).events.filter(action="attempt.outcome_confirmed").count() == 1 for n in neighbours
    )


def test_an_adapter_whose_check_raises_makes_its_tool_unusable_not_the_pass(
    wired, demo, buggy_adapters
) -> None:
    Tool.objects.filter(name="update_crm").update(adapter="broken-check")
    blocked = make_due(unknown(wired, "update_crm", "c:check", ARGS))
    neighbour = make_due(unknown(wired, "open_ticket", "t:fine", ARGS))
    demo.inject("open_ticket", "t:fine", ARGS)

    summary = reconcile()

    assert reload(blocked).events.last().action == "attempt.recovery_blocked"
    assert "adapter failed: KeyError" in reload(blocked).events.last().reason
    assert reload(neighbour).state == State.OUTCOME_CONFIRMED
    assert summary.outcomes["blocked"] == 1


@pytest.mark.django_db(transaction=True)
def test_the_worker_process_survives_and_exits_zero(wired, demo) -> None:
    """``reconcile --once`` in its own process, with an adapter that raises: exit status 0, the
    attempt quarantined, its neighbour confirmed."""
    Tool.objects.filter(name="update_crm").update(adapter="exploding")
    bad = make_due(unknown(wired, "update_crm", "mail:alpha:請求書-42:send", ARGS))
    neighbour = make_due(unknown(wired, "open_ticket", "t:fine", ARGS))
    demo.inject("open_ticket", "t:fine", ARGS)

    done = manage(
        "reconcile",
        "--once",
        "--json",
        env=child_env(LEDGERWEB_ADAPTERS=f"exploding={HERE}.ExplodingAdapter"),
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["quarantined"] == 1
    _quarantined(bad, wired)
    assert reload(neighbour).state == State.OUTCOME_CONFIRMED
