"""Authority (grants checked at intent and re-checked before a recovery send; linked attempts
never widen it) and owners (every attempt needing attention gets one when it arrives there)."""

from __future__ import annotations

import pytest

from attempts import authority, ledger
from attempts.models import Attempt, Grant, OwnershipRule, State
from reconciliation.reconciler import Reconciler
from tests.reconciliation.conftest import intent, make_due, unknown


def grant(tool: str = "update_crm", tenant: str = "acme") -> Grant:
    return Grant.objects.get(tenant_id=tenant, tool_id=tool)


# ------------------------------------------------------------------------------ authority


def test_intent_is_checked_against_the_grant(world) -> None:
    common = dict(tenant="acme", task_id="t", tool_name="update_crm", args={}, actor=world.agent)
    with pytest.raises(ledger.NotGranted, match="policy version"):
        ledger.record_intent(idempotency_key="k1", policy_version="v0", **common)
    with pytest.raises(ledger.NotGranted, match="scopes not granted: admin"):
        ledger.record_intent(idempotency_key="k2", credential_scope=["admin"], **common)
    g = grant()
    g.active = False
    g.save()
    with pytest.raises(ledger.NotGranted):
        ledger.record_intent(idempotency_key="k3", **common)
    assert not Attempt.objects.exists()


@pytest.mark.parametrize(
    ("change", "holds", "why"),
    [
        ({}, True, ""),
        ({"policy_version": "v2"}, False, "policy version changed"),
        ({"allowed_scopes": ["update_crm:read"]}, False, "scopes no longer granted"),
        ({"active": False}, False, "revoked"),
        ({"allowed_scopes": ["update_crm:read", "update_crm:write", "extra"]}, True, ""),
    ],
)
def test_authority_holds_only_while_the_grant_covers_the_attempt(world, change, holds, why):
    attempt = intent(world, "update_crm", "c:auth")
    Grant.objects.filter(pk=grant().pk).update(**change)
    holds_now, reason = authority.authority_holds(attempt)
    assert holds_now is holds
    assert why in reason
    assert bool(reason) is not holds


def test_linked_authority_is_never_wider_than_original_or_grant(world) -> None:
    attempt = intent(world, "update_crm", "c:narrow")
    assert attempt.credential_scope == ["update_crm:read", "update_crm:write"]
    Grant.objects.filter(pk=grant().pk).update(
        policy_version="v9", allowed_scopes=["update_crm:write", "update_crm:delete"]
    )
    linked = authority.linked_authority(attempt)
    assert linked.policy_version == "v9"
    assert linked.scopes == ["update_crm:write"]  # not :delete (never had it), not :read (gone)


def test_recovery_rechecks_authority_before_sending_a_stale_intent(world, demo) -> None:
    demo.configure_tools()
    attempt = make_due(intent(world, "update_crm", "c:recheck"))
    Grant.objects.filter(pk=grant().pk).update(allowed_scopes=["update_crm:write"])

    Reconciler(worker_id="t").run_pass()

    attempt.refresh_from_db()
    assert attempt.state == State.RECONCILED
    child = attempt.children.get()
    assert child.credential_scope == ["update_crm:write"]
    assert child.tenant_id == "acme"
    assert demo.summary()["total"] == 0


def test_a_linked_attempt_stays_in_its_tenant(world, demo) -> None:
    demo.configure_tools()
    attempt = make_due(intent(world, "update_crm", "g:1", tenant="globex"))
    Grant.objects.filter(pk=grant(tenant="globex").pk).update(policy_version="v2")
    Reconciler(worker_id="t").run_pass()
    child = Attempt.objects.get(parent=attempt)
    assert child.tenant_id == "globex"
    assert child.owner == world.outsider  # globex's owner, not acme's


# ------------------------------------------------------------------------------ owners


def test_unknown_gets_an_owner_from_the_first_matching_rule(world) -> None:
    OwnershipRule.objects.create(
        owner=world.reviewer, tenant_pattern="acme", tool_pattern="charge_*", priority=5
    )
    card = unknown(world, "charge_card", "p:1")
    crm = unknown(world, "update_crm", "c:1")
    assert card.owner == world.reviewer  # priority 5 beats the acme-wide rule (10)
    assert crm.owner == world.triage


def test_default_owner_when_no_rule_matches(world, settings) -> None:
    OwnershipRule.objects.all().delete()
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": "admin"}
    assert unknown(world, "update_crm", "c:default").owner == world.admin


def test_manual_review_from_recovery_always_has_an_owner(world, demo, settings) -> None:
    demo.configure_tools()
    OwnershipRule.objects.all().delete()
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": ""}
    attempt = make_due(unknown(world, "open_ticket", "t:noowner"))
    assert attempt.owner is None  # nobody is configured when it went UNKNOWN
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": "reviewer2"}

    Reconciler(worker_id="t").run_pass()

    attempt.refresh_from_db()
    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.owner == world.reviewer2


def test_an_ownership_rule_never_routes_work_to_someone_who_cannot_act(world) -> None:
    """A rule naming a viewer, or someone outside the tenant, is passed over (its owner lost
    the role after the rule was made): the next rule that names someone who may own it wins."""
    OwnershipRule.objects.create(owner=world.viewer, tenant_pattern="acme", priority=1)
    OwnershipRule.objects.create(owner=world.outsider, tenant_pattern="*", priority=2)
    assert unknown(world, "update_crm", "c:viewer-rule").owner == world.triage


def test_the_default_owner_gets_work_only_where_they_may_own_it(world, settings) -> None:
    OwnershipRule.objects.all().delete()
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": "viewer"}
    assert unknown(world, "update_crm", "c:viewer-default").owner is None
    settings.LEDGER = {**settings.LEDGER, "DEFAULT_OWNER": "outsider"}  # admin of globex only
    assert unknown(world, "update_crm", "c:outsider-default").owner is None


def test_who_may_own_is_one_rule_for_assign_and_the_offered_people(world) -> None:
    from attempts import owners, review

    offered = owners.owner_names(["acme"])
    assert "viewer" not in offered and "outsider" not in offered
    assert {"operator", "triage", "reviewer", "reviewer2", "admin"} <= set(offered)
    attempt = unknown(world, "update_crm", "c:assign")
    for person in (world.viewer, world.outsider):
        assert not owners.may_own(person, "acme")
        with pytest.raises(review.NotAllowed, match="an owner needs the operator role"):
            review.assign(attempt, user=world.admin, owner=person)
