"""Approval policies as configuration (docs/config.md, protocol section 11): plan shows what a
new condition would have held, apply records each change in the verified history, a bad
condition or too few approvals on a critical tool is refused at its line and changes nothing,
dump round-trips, and the admin saves through the history too."""

from __future__ import annotations

import textwrap

import pytest
from django.test import Client

from attempts.config_history import save_with_history
from attempts.models import ActorKind, ApprovalPolicy, ConfigEvent, State
from attempts.states import Actor
from reconciliation import config
from tests.conftest import agent_intent

pytestmark = pytest.mark.django_db

POLICY = textwrap.dedent(
    """\
    version = 1

    [[approval_policies]]
    name = "large-charges"
    tool = "charge_card"
    condition = "args.amount_cents > 100000"
    approvals_needed = 2
    approval_ttl_seconds = 600
    """
)


def _apply(text: str):
    return config.apply(config.read("ledger.toml", text), actor=Actor(ActorKind.USER, "ops"))


def _charge(world, key, amount):
    attempt, _ = agent_intent(world, key, tool="charge_card", args={"amount_cents": amount})
    return attempt


def test_plan_shows_which_recent_attempts_the_condition_would_have_held(world):
    big = _charge(world, "c1", 250000)
    _charge(world, "c2", 500)
    result = config.plan(config.read("ledger.toml", POLICY))
    assert [c.describe() for c in result.changes] == ["+ approval policy large-charges"]
    [note] = result.notes
    assert "would have held 1 of the last 2 charge_card attempts" in note
    assert big.attempt_id in note
    assert any(line.startswith("note: ") for line in result.lines())
    assert not ApprovalPolicy.objects.exists()


def test_apply_records_the_policy_in_the_history_and_it_holds_calls(world):
    _apply(POLICY)
    found = ApprovalPolicy.objects.get()
    assert (found.tool_id, found.approvals_needed, found.approval_ttl_seconds) == (
        "charge_card",
        2,
        600,
    )
    # Recorded by the model, as from every path (attempts/config_history.py).
    event = ConfigEvent.objects.filter(subject="approval_policy:large-charges").get()
    assert event.action == "created"
    assert event.after["condition"] == "args.amount_cents > 100000"
    assert _charge(world, "c1", 250000).state == State.AWAITING_APPROVAL
    # Applying again changes nothing; dump applies to nothing new.
    assert _apply(POLICY).changes == []
    assert _apply(config.dump()).changes == []


def test_a_changed_rule_is_a_new_version(world):
    _apply(POLICY)
    result = _apply(POLICY.replace("100000", "50000"))
    assert [c.describe() for c in result.changes] == [
        "~ approval policy large-charges: condition 'args.amount_cents > 100000' -> "
        "'args.amount_cents > 50000'"
    ]
    assert ApprovalPolicy.objects.get().version == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("> 100000", "> "), "not valid CEL"),
        (("approvals_needed = 2", "approvals_needed = 1"), "critical"),
        (("args.amount_cents", "body.amount_cents"), "may use args"),
        (('tool = "charge_card"', 'tool = "charge_kard"'), "unknown tool 'charge_kard'"),
    ],
)
def test_a_bad_policy_is_refused_at_its_line_and_changes_nothing(world, change, message):
    with pytest.raises(config.ConfigError) as exc:
        _apply(POLICY.replace(*change))
    assert message in str(exc.value)
    assert "ledger.toml:" in str(exc.value)
    assert not ApprovalPolicy.objects.exists()
    assert not ConfigEvent.objects.filter(subject__startswith="approval_policy:").exists()


def test_removing_a_policy_that_holds_work_is_refused(world):
    _apply(POLICY)
    _charge(world, "c1", 250000)
    removal = 'version = 1\n[[approval_policies]]\nname = "large-charges"\nremove = true\n'
    with pytest.raises(config.ConfigError) as exc:
        _apply(removal)
    assert "set active = false" in str(exc.value)
    assert ApprovalPolicy.objects.exists()


def test_the_demo_configuration_ships_the_large_charge_policy(world):
    from pathlib import Path

    text = Path("reconciliation/demo.toml").read_text().replace("{provider}", "http://127.0.0.1:9")
    document = config.read("demo.toml", text)
    [entry] = document.entries("approval_policies")
    assert entry["tool"] == "charge_card" and entry["condition"] == "args.amount_cents > 100000"
    assert entry["approver_role"] == "reviewer"


def test_admin_changes_go_through_the_history(world):
    found = ApprovalPolicy(name="p", tool_id="update_crm", condition="args.id > 3")
    save_with_history(found, actor=Actor.user(world.admin))
    found.condition = "args.id > 4"
    save_with_history(found, actor=Actor.user(world.admin))
    events = list(ConfigEvent.objects.filter(subject="approval_policy:p").order_by("seq"))
    assert [e.action for e in events] == ["created", "changed"]
    assert events[1].after == {"condition": "args.id > 4", "version": 2}


def test_the_admin_lists_and_edits_policies(world):
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    client = Client()
    client.force_login(world.admin)
    form = {
        "name": "crm",
        "tool": "update_crm",
        "tenants": "[]",
        "approvals_needed": "1",
        "approver_role": "reviewer",
        "approver_group": "",
        "approval_ttl": "01:00:00",
        "max_wait": "1 00:00:00",
        "active": "on",
    }
    response = client.post(
        "/admin/attempts/approvalpolicy/add/", {**form, "condition": "args.id >"}
    )
    assert response.status_code == 200 and b"not valid CEL" in response.content
    assert not ApprovalPolicy.objects.exists()
    response = client.post(
        "/admin/attempts/approvalpolicy/add/", {**form, "condition": "args.id > 3"}
    )
    assert response.status_code == 302
    assert ConfigEvent.objects.filter(subject="approval_policy:crm", action="created").exists()
