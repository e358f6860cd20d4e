"""Protocol section 7, invariants 11 and 12, through the agent API (issue 39, items 7 and 8).

11: a key takes effect at most once for the life of the ledger: after its attempt is archived,
the same key with the same arguments is answered with the archived outcome (200, marked
``archived``), other arguments get 409 ``idempotency_conflict``, and nothing can be dispatched.
12: one provider effect confirms at most one attempt: a second confirm naming it is 409
``effect_claimed`` and its attempt waits in MANUAL_REVIEW, both attempts naming each other."""

from __future__ import annotations

import pytest

from attempts import ledger
from attempts.models import Attempt, AttemptEvent, RetentionRule, State
from tests.api.conftest import intent_body
from tests.api.test_openapi import resolve_ref, validate
from tests.archive.conftest import age, key_file  # noqa: F401 (a fixture)
from tests.archive.test_retention import _run
from tests.attempts.audit_helpers import seal_all


def _confirmed(api, key: str, provider_id: str, **overrides) -> str:
    attempt_id = api.intent(key, **overrides).body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{attempt_id}/dispatch").status == 200
    answer = api.post(
        f"attempts/{attempt_id}/confirm",
        {"result_ref": f"receipt:{provider_id}", "provider_request_id": provider_id},
    )
    assert answer.status == 200, answer.body
    return attempt_id


def _archive(tmp_path, tool: str = "open_ticket"):
    age(list(Attempt.objects.all()), 40)
    seal_all()
    RetentionRule.objects.create(tenant_id="acme", tool_id=tool, archive_after_days=30)
    result = _run(tmp_path)
    assert result.removed >= 1
    return result


@pytest.mark.usefixtures("key_file")
def test_a_key_replayed_after_archiving_answers_the_archived_outcome(api, tokens, tmp_path) -> None:
    attempt_id = _confirmed(api, "ticket:acme:archived", "tk_1")
    result = _archive(tmp_path)
    assert not Attempt.objects.filter(attempt_id=attempt_id).exists()

    again = api.intent("ticket:acme:archived")
    assert again.status == 200, again.body
    assert again.body["created"] is False
    assert again.body["archived"]["archive"] == result.name
    shown = again.body["attempt"]
    assert shown["attempt_id"] == attempt_id
    assert (shown["state"], shown["result_ref"]) == (State.OUTCOME_CONFIRMED, "receipt:tk_1")
    assert shown["provider_request_id"] == "tk_1"
    assert shown["args_hash"] == api_args_hash()
    validate(again.body, resolve_ref("#/components/schemas/ArchivedAttemptEnvelope"))
    with pytest.raises(AssertionError):  # never mistaken for a live attempt
        validate(again.body, resolve_ref("#/components/schemas/AttemptEnvelope"))
    # Nothing was recorded, and nothing can be claimed or sent.
    assert Attempt.objects.count() == 0
    assert api.post(f"attempts/{attempt_id}/dispatch").status == 404

    other = api.intent("ticket:acme:archived", args={"title": "Another printer"})
    assert other.status == 409 and other.body["error"]["code"] == "idempotency_conflict"
    other_tenant = api.intent("ticket:acme:archived", tenant="globex", token=tokens.globex)
    assert other_tenant.status == 409
    assert "attempt_id" not in other_tenant.body["error"]
    assert Attempt.objects.count() == 0


def api_args_hash() -> str:
    from attempts.canonical import normalize_args

    return normalize_args(intent_body()["args"]).args_hash


@pytest.mark.usefixtures("key_file")
def test_the_safe_order_does_not_send_a_key_whose_attempt_was_archived(
    api, world, tmp_path
) -> None:
    _confirmed(api, "ticket:acme:in-process", "tk_2")
    _archive(tmp_path)
    sent = []
    outcome = ledger.run_tool_call(
        tenant="acme",
        task_id="task-1",
        tool_name="open_ticket",
        idempotency_key="ticket:acme:in-process",
        args=intent_body()["args"],
        send=lambda attempt: sent.append(attempt) or ledger.SendResult("tk_3", "receipt"),
        actor=world.agent,
    )
    assert (outcome.sent, sent) == (False, [])
    assert outcome.attempt.archived is not None
    assert outcome.attempt.state == State.OUTCOME_CONFIRMED
    assert Attempt.objects.count() == 0


def test_a_second_confirm_of_one_provider_effect_is_refused_and_reviewed(api) -> None:
    first = _confirmed(api, "ticket:acme:effect:1", "tk_shared")
    second = api.intent("ticket:acme:effect:2").body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{second}/dispatch").status == 200
    answer = api.post(
        f"attempts/{second}/confirm",
        {"result_ref": "receipt:tk_shared", "provider_request_id": "tk_shared"},
    )
    assert answer.status == 409, answer.body
    assert answer.body["error"]["code"] == "effect_claimed"
    shown = api.get(f"attempts/{second}").body["attempt"]
    assert (shown["state"], shown["review_reason"]) == (State.MANUAL_REVIEW, "effect_claimed")
    assert shown["owner"] is not None and shown["provider_request_id"] is None
    assert api.get(f"attempts/{first}").body["attempt"]["state"] == State.OUTCOME_CONFIRMED
    names = AttemptEvent.objects.filter(attempt__attempt_id=first, action=ledger.EFFECT_CONTESTED)
    assert [e.details["effect_contested"]["contested_by"] for e in names] == [second]


@pytest.mark.parametrize("path", ["provider-request", "confirm"])
def test_claiming_an_effect_twice_through_either_call_is_refused(api, path) -> None:
    _confirmed(api, f"ticket:acme:{path}:1", "tk_twice")
    second = api.intent(f"ticket:acme:{path}:2").body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{second}/dispatch").status == 200
    body = {"provider_request_id": "tk_twice"}
    if path == "confirm":
        body["result_ref"] = "r"
    answer = api.post(f"attempts/{second}/{path}", body)
    assert (answer.status, answer.body["error"]["code"]) == (409, "effect_claimed")
