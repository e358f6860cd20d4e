"""Protocol section 4 (the safe order) and invariant 8 (key reuse is refused), through the
in-process write-ahead API."""

import pytest

from attempts import ledger
from attempts.ledger import (
    IdempotencyConflict,
    InvalidIntent,
    NotGranted,
    ProviderLostResponse,
    ProviderRefused,
    ProviderTimeout,
    SendResult,
    StateConflict,
)
from attempts.models import Attempt, AttemptEvent, Grant, State
from tests.conftest import CONFIRMED_IN_ORDER


def record(world, key="inv:acme:2026-11-30:send", args=None, **overrides):
    params = {
        "tenant": "acme",
        "task_id": "task-42",
        "tool_name": "send_invoice_email",
        "idempotency_key": key,
        "args": args if args is not None else {"to": "ap@acme.test", "invoice": "INV-7"},
        "actor": world.agent,
    }
    params.update(overrides)
    return ledger.record_intent(**params)


def snapshot():
    return (
        list(Attempt.objects.order_by("id").values()),
        AttemptEvent.objects.count(),
    )


def test_recording_an_intent_stores_every_protocol_field(world):
    attempt, created = record(world)
    assert created
    stored = Attempt.objects.get(pk=attempt.pk)
    assert stored.state == State.INTENT_RECORDED
    assert stored.attempt_id.startswith("att_") and len(stored.attempt_id) == 30
    assert stored.args == {"invoice": "INV-7", "to": "ap@acme.test"}
    assert len(stored.args_hash) == 64
    assert stored.policy_version == "v1"
    assert stored.credential_scope == ["send_invoice_email:read", "send_invoice_email:write"]
    event = stored.events.get()
    assert event.action == "attempt.created" and event.to_state == State.INTENT_RECORDED
    assert event.details["args_hash"] == stored.args_hash
    assert event.details["idempotency_key"] == stored.idempotency_key


def test_same_key_same_args_returns_the_existing_attempt_whatever_its_state(world):
    first, _ = record(world)
    ledger.claim_dispatch(first, actor=world.agent)
    ledger.confirm(first, result_ref="receipt-1", actor=world.agent)
    before = snapshot()
    again, created = record(world, args={"invoice": "INV-7", "to": "ap@acme.test"})
    assert not created
    assert again.pk == first.pk and again.state == State.OUTCOME_CONFIRMED
    assert snapshot() == before


@pytest.mark.parametrize(
    "change",
    [
        {"args": {"to": "ap@acme.test", "invoice": "INV-8"}},
        {"tenant": "globex"},
        {"tool_name": "update_crm"},
    ],
    ids=["other-args", "other-tenant", "other-tool"],
)
def test_key_reuse_with_anything_else_is_refused_and_overwrites_nothing(world, change):
    first, _ = record(world)
    before = snapshot()
    with pytest.raises(IdempotencyConflict) as exc:
        record(world, **change)
    assert exc.value.existing.pk == first.pk
    assert "nothing was changed" in str(exc.value)
    assert snapshot() == before


def test_key_reuse_is_refused_on_the_safe_order_path_too(world):
    record(world)
    before = snapshot()
    sent = []
    with pytest.raises(IdempotencyConflict):
        ledger.run_tool_call(
            tenant="acme",
            task_id="t",
            tool_name="send_invoice_email",
            idempotency_key="inv:acme:2026-11-30:send",
            args={"to": "someone-else@acme.test"},
            send=lambda attempt: sent.append(attempt) or SendResult("p", "r"),
            actor=world.agent,
        )
    assert sent == []
    assert snapshot() == before


@pytest.mark.parametrize(
    ("overrides", "error", "code"),
    [
        ({"tool_name": "launch_rockets"}, NotGranted, "unknown_tool"),
        ({"tenant": "initech"}, NotGranted, "tenant_not_granted"),
        ({"args": ["not", "an", "object"]}, InvalidIntent, "args_not_object"),
        ({"args": {"blob": "x" * 70_000}}, InvalidIntent, "args_too_large"),
        ({"idempotency_key": ""}, InvalidIntent, "invalid_field"),
        ({"idempotency_key": 12}, InvalidIntent, "invalid_field"),
        ({"task_id": None}, InvalidIntent, "invalid_field"),
        ({"credential_scope": "admin"}, InvalidIntent, "invalid_field"),
        ({"credential_scope": ["root"]}, NotGranted, "scope_not_granted"),
        ({"policy_version": "v0"}, NotGranted, "policy_version_mismatch"),
    ],
)
def test_bad_intents_are_refused_with_a_code_and_store_nothing(world, overrides, error, code):
    with pytest.raises(error) as exc:
        record(world, **overrides)
    assert exc.value.code == code
    assert Attempt.objects.count() == 0 and AttemptEvent.objects.count() == 0


def test_inactive_grant_refuses_new_intents(world):
    Grant.objects.filter(tenant="acme", tool="send_invoice_email").update(active=False)
    with pytest.raises(NotGranted) as exc:
        record(world)
    assert exc.value.code == "tool_not_granted"


def test_only_one_claim_wins(world):
    attempt, _ = record(world)
    _, first = ledger.claim_dispatch(attempt, actor=world.agent)
    current, second = ledger.claim_dispatch(attempt.attempt_id, actor=world.agent)
    assert (first, second) == (True, False)
    assert current.state == State.DISPATCHED and current.send_count == 1


def test_unknown_is_not_claimable_by_an_agent(world):
    attempt, _ = record(world)
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    current, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert not claimed and current.state == State.UNKNOWN


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"policy_version": "v2"}, "policy version changed from 'v1' to 'v2'"),
        (
            {"allowed_scopes": ["send_invoice_email:read"]},
            "scopes no longer granted: send_invoice_email:write",
        ),
        ({"active": False}, "grant revoked or inactive"),
    ],
)
def test_claim_refuses_when_authority_changed(world, change, why):
    attempt, _ = record(world)
    Grant.objects.filter(tenant="acme", tool="send_invoice_email").update(**change)
    before = snapshot()
    with pytest.raises(StateConflict) as exc:
        ledger.claim_dispatch(attempt, actor=world.agent)
    assert exc.value.code == "authority_changed"
    assert str(exc.value) == f"authority changed since the intent was recorded: {why}"
    assert snapshot() == before


@pytest.mark.parametrize(
    "scopes",
    [
        ["send_invoice_email:read", "send_invoice_email:write"],
        ["send_invoice_email:write", "send_invoice_email:read", "send_invoice_email:delete"],
    ],
)
def test_claim_goes_ahead_while_the_grant_covers_the_attempt(world, scopes):
    """The claim's compare-and-set checks the grant itself: a wider grant still covers it."""
    attempt, _ = record(world)
    Grant.objects.filter(tenant="acme", tool="send_invoice_email").update(allowed_scopes=scopes)
    current, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed and Attempt.objects.get(pk=attempt.pk).state == State.DISPATCHED


def test_a_claim_is_one_statement_on_postgresql(world):
    """The grant check is part of the compare-and-set: no read of the grant before it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    attempt, _ = record(world)
    with CaptureQueriesContext(connection) as queries:
        ledger.claim_dispatch(attempt, actor=world.agent)
    writes = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in writes if sql.lstrip().upper().startswith("SELECT")]
    if connection.vendor == "postgresql":
        assert len(writes) == 1


def test_provider_request_id_is_kept_and_never_replaced(world):
    attempt, _ = record(world)
    with pytest.raises(StateConflict):  # nothing was sent yet
        ledger.attach_provider_request(attempt, "req-1", actor=world.agent)
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.attach_provider_request(attempt, "req-1", actor=world.agent)
    events = AttemptEvent.objects.count()
    ledger.attach_provider_request(attempt, "req-1", actor=world.agent)
    assert AttemptEvent.objects.count() == events
    with pytest.raises(StateConflict) as exc:
        ledger.attach_provider_request(attempt, "req-2", actor=world.agent)
    assert exc.value.code == "provider_request_conflict"
    assert Attempt.objects.get(pk=attempt.pk).provider_request_id == "req-1"


def test_confirming_twice_with_the_same_result_writes_nothing_new(world):
    attempt, _ = record(world)
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.confirm(attempt, result_ref="rcpt-1", provider_request_id="req-1", actor=world.agent)
    before = snapshot()
    ledger.confirm(attempt, result_ref="rcpt-1", actor=world.agent)
    assert snapshot() == before
    with pytest.raises(StateConflict):
        ledger.confirm(attempt, result_ref="rcpt-2", actor=world.agent)
    assert snapshot() == before


def test_confirm_from_an_intent_is_refused(world):
    attempt, _ = record(world)
    with pytest.raises(StateConflict):
        ledger.confirm(attempt, result_ref="r", actor=world.agent)
    assert Attempt.objects.get(pk=attempt.pk).state == State.INTENT_RECORDED


def test_fail_paths(world):
    attempt, _ = record(world)
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.fail(attempt, reason="429 from provider", retryable=True, actor=world.agent)
    assert attempt.state == State.FAILED_RETRYABLE
    ledger.fail(attempt, reason="429 from provider", retryable=True, actor=world.agent)
    _, claimed = ledger.claim_dispatch(attempt, actor=world.agent)
    assert claimed
    stored = Attempt.objects.get(pk=attempt.pk)
    assert stored.send_count == 2
    ledger.fail(stored, reason="invalid address", retryable=False, actor=world.agent)
    with pytest.raises(StateConflict):
        ledger.fail(stored, reason="again", retryable=True, actor=world.agent)


def test_abandoned_intent_fails_but_cannot_be_retryable(world):
    attempt, _ = record(world)
    with pytest.raises(StateConflict):
        ledger.fail(attempt, reason="x", retryable=True, actor=world.agent)
    ledger.fail(attempt, reason="task cancelled", retryable=False, actor=world.agent)
    assert Attempt.objects.get(pk=attempt.pk).state == State.FAILED


def test_mark_unknown_only_from_dispatched_and_repeatable(world):
    attempt, _ = record(world)
    with pytest.raises(StateConflict):
        ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    before = snapshot()
    ledger.mark_unknown(attempt, reason="timeout again", actor=world.agent)
    assert snapshot() == before
    assert Attempt.objects.get(pk=attempt.pk).owner == world.triage


# --- the safe order --------------------------------------------------------------------------


def call(world, send, key="crm:acme:42:update"):
    return ledger.run_tool_call(
        tenant="acme",
        task_id="task-9",
        tool_name="update_crm",
        idempotency_key=key,
        args={"contact": 42, "stage": "won"},
        send=send,
        actor=world.agent,
    )


def test_safe_order_records_and_claims_before_sending(world):
    seen = []

    def send(attempt):
        stored = Attempt.objects.get(pk=attempt.pk)
        seen.append(stored.state)
        return SendResult(provider_request_id="req-9", result_ref="crm-rev-3")

    outcome = call(world, send)
    assert seen == [State.DISPATCHED]
    assert outcome.sent and outcome.attempt.state == State.OUTCOME_CONFIRMED
    actions = list(outcome.attempt.events.values_list("action", flat=True))
    assert actions == CONFIRMED_IN_ORDER


def test_a_200_without_a_receipt_is_not_confirmation(world):
    outcome = call(world, lambda attempt: SendResult(provider_request_id="req-1"))
    assert outcome.attempt.state == State.DISPATCHED
    assert outcome.attempt.provider_request_id == "req-1"


@pytest.mark.parametrize(
    "error", [ProviderTimeout("no answer in 10s"), ProviderLostResponse("reset"), TimeoutError()]
)
def test_timeouts_and_lost_answers_become_unknown(world, error):
    def send(attempt):
        raise error

    outcome = call(world, send)
    assert outcome.sent and outcome.attempt.state == State.UNKNOWN
    assert Attempt.objects.get(pk=outcome.attempt.pk).state == State.UNKNOWN


def test_refusals_become_failures(world):
    def refuse(attempt):
        raise ProviderRefused("mailbox does not exist", retryable=False)

    assert call(world, refuse).attempt.state == State.FAILED

    def busy(attempt):
        raise ProviderRefused("rate limited", retryable=True)

    assert call(world, busy, key="other").attempt.state == State.FAILED_RETRYABLE


def test_an_unexpected_error_after_the_claim_is_unknown_and_propagates(world):
    def broken(attempt):
        raise KeyError("bug in the agent")

    with pytest.raises(KeyError):
        call(world, broken)
    assert Attempt.objects.get().state == State.UNKNOWN


def test_a_second_call_for_the_same_effect_does_not_send(world):
    calls = []

    def send(attempt):
        calls.append(attempt.attempt_id)
        return SendResult("req", "rcpt")

    call(world, send)
    outcome = call(world, send)
    assert len(calls) == 1 and not outcome.sent
    assert outcome.attempt.state == State.OUTCOME_CONFIRMED


def test_a_stale_copy_in_hand_is_decided_again_on_the_truth(world):
    attempt, _ = record(world)
    stale = Attempt.objects.get(pk=attempt.pk)
    ledger.claim_dispatch(attempt, actor=world.agent)
    current, claimed = ledger.claim_dispatch(stale, actor=world.agent)
    assert not claimed and current.state == State.DISPATCHED
    assert stale.state == State.DISPATCHED  # the caller's copy now reads the truth
    ledger.mark_unknown(attempt, reason="timeout", actor=world.agent)
    with pytest.raises(StateConflict):
        ledger.fail(stale, reason="refused", retryable=False, actor=world.agent)
    assert Attempt.objects.get(pk=attempt.pk).state == State.UNKNOWN


def test_text_checks_refuse_every_ascii_control_character_and_nothing_else():
    """Printable ASCII takes a shortcut past the per-character check: it must judge the same."""
    from attempts.ledger import text_problem

    for code in range(128):
        text = f"ab{chr(code)}c"
        problem = text_problem(text)
        if code < 0x20 or code == 0x7F:
            assert problem == f"contains the control character U+{code:04X} at position 2"
        else:
            assert problem == ""
    assert text_problem("line\nbreak\ttab", multiline=True) == ""
    assert text_problem("caf\u00e9 \u00a0") == "" and text_problem("x\u0085").startswith(
        "contains the control character U+0085"
    )
    assert text_problem("x\ud800") == "contains a lone surrogate U+D800 at position 1"
