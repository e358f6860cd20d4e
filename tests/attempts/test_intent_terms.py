"""A new intent is built from this process's guess of its grant's terms (``authority
.intent_terms``), which its INSERT checks in the same statement: a grant, tool or approval
policy changed since the guess, here or by another process, is never recorded under the old
terms; the intent is built again from a fresh read. An intent whose guess holds costs one
statement on PostgreSQL (the grant read is inside its INSERT)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from attempts import authority, ledger
from attempts.actors import Actor
from attempts.config_history import acting
from attempts.models import ApprovalPolicy, Attempt, Grant, State, Tool


def intent(world, key, **overrides):
    params = {
        "tenant": "acme",
        "task_id": "t",
        "tool_name": "update_crm",
        "idempotency_key": key,
        "args": {"customer": key},
        "actor": world.agent,
    }
    return ledger.record_intent(**(params | overrides))


def change(obj, **fields):
    """An admin's change made behind the process's back: the guess is not told."""
    with acting(Actor.system("test"), "terms change"):
        for name, value in fields.items():
            setattr(obj, name, value)
        obj.save()


@pytest.fixture
def guessed(world):
    """A first intent leaves this process a guess of update_crm's terms for acme."""
    intent(world, "warm")
    guess, is_guess = authority.intent_terms("acme", "update_crm", fresh=False)
    assert is_guess and guess.policy_version == "v1"
    return world


def test_a_changed_policy_version_is_recorded_not_the_guessed_one(guessed):
    change(Grant.objects.get(tenant="acme", tool="update_crm"), policy_version="v2")
    attempt, created = intent(guessed, "after-v2")
    assert created and attempt.policy_version == "v2"
    assert attempt.events.get().details["policy_version"] == "v2"
    assert Attempt.objects.get(pk=attempt.pk).policy_version == "v2"


def test_narrowed_scopes_are_recorded_not_the_guessed_ones(guessed):
    change(Grant.objects.get(tenant="acme", tool="update_crm"), allowed_scopes=["update_crm:read"])
    attempt, _ = intent(guessed, "after-narrowing")
    assert attempt.credential_scope == ["update_crm:read"]
    assert attempt.events.get().details["credential_scope"] == ["update_crm:read"]


def test_a_revoked_grant_refuses_the_intent_and_writes_nothing(guessed):
    before = Attempt.objects.count()
    change(Grant.objects.get(tenant="acme", tool="update_crm"), active=False)
    with pytest.raises(ledger.NotGranted) as refused:
        intent(guessed, "after-revoke")
    assert refused.value.code == "tool_not_granted"
    assert Attempt.objects.count() == before
    # The refusal read the grant: the stale guess is gone.
    assert authority.intent_terms("acme", "update_crm", fresh=False) == (None, False)


def test_a_deactivated_tool_refuses_the_intent(guessed):
    change(Tool.objects.get(name="update_crm"), active=False)
    with pytest.raises(ledger.NotGranted) as refused:
        intent(guessed, "after-tool-off")
    assert refused.value.code == "unknown_tool"


def test_an_approval_policy_activated_after_the_guess_holds_the_intent(guessed):
    with acting(Actor.system("test"), "a policy"):
        ApprovalPolicy.objects.create(name="crm", tool_id="update_crm", approvals_needed=1)
    attempt, _ = intent(guessed, "after-policy")
    assert attempt.state == State.AWAITING_APPROVAL
    assert attempt.approval_policy.name == "crm"


def test_a_guess_that_would_refuse_is_read_again(guessed):
    # The caller names the new version before this process has seen it: the guess (v1) would
    # refuse it as a mismatch; the fresh read agrees with the caller.
    change(Grant.objects.get(tenant="acme", tool="update_crm"), policy_version="v3")
    attempt, created = intent(guessed, "names-v3", policy_version="v3")
    assert created and attempt.policy_version == "v3"


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_an_intent_whose_guess_holds_is_one_statement(guessed):
    with CaptureQueriesContext(connection) as queries:
        intent(guessed, "one-statement")
    sent = [q["sql"] for q in queries.captured_queries]
    writes = [sql for sql in sent if not sql.startswith(("SAVEPOINT", "RELEASE"))]
    assert len(writes) == 1, sent
    assert writes[0].startswith("WITH ok AS (SELECT 1 WHERE EXISTS")
