# ruff: noqa: S608 -- the attacker writes raw SQL against constant table names
"""Every change of who may do what is in the history, from every path (the admin, configuration
files, commands, code), and a change that escapes it (SQL, a queryset update) is reported by
``verify_audit`` as ``[config-drift]``."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.forms.models import model_to_dict
from django.test import RequestFactory

from attempts import audit_verify, config_history
from attempts.models import (
    AgentToken,
    Approval,
    ApprovalPolicy,
    Archive,
    ArchivedAttempt,
    Attempt,
    AttemptEvent,
    ConfigEvent,
    Grant,
    LoginThrottle,
    Membership,
    Notification,
    NotificationRoute,
    OwnershipRule,
    RetentionRule,
    SlackIdentity,
    SlaPolicy,
    SsoGroupRole,
    SsoIdentity,
    Tenant,
    Tool,
)
from attempts.states import Actor
from attempts.verify_export import authority_digest_of
from reconciliation import config
from reconciliation.config.sections import SECTIONS
from tests.attempts.audit_helpers import drop_triggers, seal_all, sql

pytestmark = pytest.mark.django_db

# Admin-registered models whose rows decide nothing about who may do what, and why.
NOT_AUTHORITY = {
    Attempt: "read-only here; changed only by the state machine",
    AttemptEvent: "read-only, append-only history",
    Notification: "read-only outbox",
    LoginThrottle: "failed log-in counters (deleting one lifts a lock-out early)",
    Approval: "read-only; a person's decision on one held attempt, recorded by review.py",
    Archive: "read-only; written by `archive run`, recorded in the history as archive:<name>",
    ArchivedAttempt: "read-only; where a removed attempt went (its archive)",
}


def drift_problems() -> list[str]:
    return [str(p) for p in audit_verify.verify_django_database().problems]


def last_event() -> ConfigEvent:
    return ConfigEvent.objects.order_by("-seq").first()


def test_a_role_raised_by_sql_is_config_drift(world) -> None:
    seal_all()
    assert drift_problems() == []
    drop_triggers()
    sql(
        "UPDATE attempts_membership SET role = 'admin' WHERE user_id = %s AND tenant_id = 'acme'",
        [world.viewer.pk],
    )
    sql("UPDATE attempts_tool SET critical = %s WHERE name = 'charge_card'", [False])
    problems = drift_problems()
    assert any(
        p.startswith(
            "[config-drift] membership:acme/viewer: role is 'admin', history says 'viewer'"
        )
        for p in problems
    ), problems
    assert any("tool:charge_card: critical is False, history says True" in p for p in problems)
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit", stdout=io.StringIO())
    assert "[config-drift] membership:acme/viewer" in str(caught.value)


def test_rows_added_or_deleted_outside_the_history_are_drift(world) -> None:
    drop_triggers()
    sql("INSERT INTO attempts_tenant (slug, name, created_at) VALUES ('rogue', 'R', '2026-01-01')")
    sql("DELETE FROM attempts_ownershiprule WHERE tenant_pattern = 'globex'")
    problems = drift_problems()
    assert any("tenant:rogue: exists but the history never recorded it" in p for p in problems)
    assert any("ownership_rule:" in p and "it is gone" in p for p in problems)


def test_a_queryset_update_that_skips_the_signals_is_drift(world) -> None:
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(active=False)
    assert any("grant:acme/open_ticket: active is False" in p for p in drift_problems())


def test_the_digest_is_of_the_live_rows_and_matches_the_history(world) -> None:
    digest = config_history.authority_digest()
    assert len(digest) == 64
    assert digest == authority_digest_of(config_history.history_authority())
    drop_triggers()
    sql("UPDATE attempts_tenant SET name = 'Evil' WHERE slug = 'acme'")
    assert config_history.authority_digest() != digest
    assert authority_digest_of(config_history.history_authority()) == digest


def test_an_old_ledger_gets_a_baseline_and_no_drift(world) -> None:
    """A ledger from before these models were recorded: rows, no history of them."""
    drop_triggers()
    sql("DELETE FROM attempts_configevent")
    report = audit_verify.verify_django_database()
    assert report.ok, report.render()
    assert any("recorded a baseline" in note for note in report.notes)
    snapshots = ConfigEvent.objects.filter(action="snapshot", actor="baseline")
    assert snapshots.filter(subject="membership:acme/viewer").exists()
    # Only once: the next verification records nothing more.
    count = ConfigEvent.objects.count()
    assert audit_verify.verify_django_database().ok
    assert ConfigEvent.objects.count() == count
    sql("UPDATE attempts_membership SET role = 'admin' WHERE user_id = %s", [world.viewer.pk])
    assert any("membership:acme/viewer" in p for p in drift_problems())


# One change of a tracked field per declared kind, through the admin's own form.
ADMIN_CHANGES = {
    "tenant": (lambda w: Tenant.objects.get(slug="acme"), {"name": "Acme Renamed"}),
    "user": (lambda w: w.viewer, {"is_staff": True}),
    "group": (lambda w: Group.objects.create(name="auditors"), {"name": "auditors-2"}),
    "membership": (lambda w: Membership.objects.get(user=w.viewer), {"role": "operator"}),
    "sso_group": (
        lambda w: SsoGroupRole.objects.create(group="ops", tenant=w.acme, role="viewer"),
        {"role": "reviewer"},
    ),
    "sso_identity": (
        lambda w: SsoIdentity.objects.create(user=w.viewer, subject="idp-1"),
        {"subject": "idp-2"},
    ),
    "slack_identity": (
        lambda w: SlackIdentity.objects.create(team_id="T1", slack_user_id="U1", user=w.viewer),
        {"team_id": "T2"},
    ),
    "agent_token": (
        lambda w: AgentToken.issue("bot", ["acme"])[0],
        {"tenants": ["acme", "globex"]},
    ),
    "tool": (lambda w: Tool.objects.get(name="open_ticket"), {"critical": True}),
    "grant": (lambda w: Grant.objects.get(tenant="acme", tool="open_ticket"), {"active": False}),
    "ownership_rule": (lambda w: OwnershipRule.objects.get(tenant_pattern="acme"), {"priority": 5}),
    "sla_policy": (
        lambda w: SlaPolicy.objects.create(tool_id="open_ticket"),
        {"unknown_warn_after": dt.timedelta(minutes=30)},
    ),
    "approval_policy": (
        lambda w: ApprovalPolicy.objects.create(
            name="big-updates", tool_id="update_crm", condition="args.amount > 10"
        ),
        {"condition": "args.amount > 20", "tenants": '["acme"]'},
    ),
    "retention_rule": (
        lambda w: RetentionRule.objects.create(
            tenant=w.acme, tool_id="update_crm", archive_after_days=30
        ),
        {"archive_after_days": 90},
    ),
    "notification_route": (
        lambda w: NotificationRoute.objects.create(name="payments-oncall", tool_pattern="charge_*"),
        {"tenant_pattern": "acme"},
    ),
}


def test_every_admin_model_is_declared_and_every_admin_change_is_recorded(world) -> None:
    request = RequestFactory().post("/admin/")
    request.user = world.admin
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    kinds_seen = set()
    for model, model_admin in admin.site._registry.items():
        if model in NOT_AUTHORITY:
            continue
        authority = config_history.authority_for(model)
        assert authority is not None, (
            f"{model.__name__} is in the admin but not declared in config_history.AUTHORITIES "
            "(or listed here as deciding nothing, with the reason)"
        )
        assert authority.kind in ADMIN_CHANGES, f"add a change of {authority.kind} to this test"
        kinds_seen.add(authority.kind)
        make, change = ADMIN_CHANGES[authority.kind]
        obj = make(world)
        if not model_admin.has_change_permission(request, obj):
            continue  # shown read-only in the admin (changed through ledger_config)
        form_class = model_admin.get_form(request, obj, change=True)
        data = {**model_to_dict(obj), **change}
        data = {k: v for k, v in data.items() if v is not None}
        if model is User:
            data["date_joined_0"], data["date_joined_1"] = "2026-01-01", "00:00:00"
        form = form_class(data=data, instance=obj)
        assert form.is_valid(), (authority.kind, form.errors)
        seq = last_event().seq
        with config_history.acting(Actor.user(world.admin), "admin"):
            saved = form.save(commit=False)
            model_admin.save_model(request, saved, form, change=True)
            model_admin.save_related(request, form, [], change=True)
        recorded = ConfigEvent.objects.filter(seq__gt=seq)
        assert recorded.exists(), f"changing {authority.kind} in the admin wrote no event"
        assert {e.actor for e in recorded} == {world.admin.username}
    # Models declared but not in the admin still count: each kind has a change here.
    assert {a.kind for a in config_history.AUTHORITIES} <= set(ADMIN_CHANGES)
    assert config_history.drift() == []


# One new entry per configuration section.
NEW_ENTRIES = {
    "tenants": {"slug": "initech", "name": "Initech"},
    "tools": {"name": "send_fax", "effect_class": "manual"},
    "users": {"username": "rita", "roles": {"initech": "reviewer"}},
    "grants": {"tenant": "initech", "tool": "send_fax", "policy_version": "v1"},
    "ownership_rules": {"tenant": "initech", "tool": "*", "owner": "rita"},
    "sso_groups": {"group": "fax", "roles": {"initech": "viewer"}},
    "sla_policies": {"tool": "send_fax", "tenant": "initech", "review_breach_after": "8h"},
    "notification_routes": {"name": "fax-oncall", "tool": "send_fax", "notify": ["rita"]},
    "approval_policies": {"name": "fax-limit", "tool": "send_fax", "condition": "args.pages > 9"},
    "retention_rules": {"tenant": "initech", "tool": "send_fax", "archive_after_days": 365},
}


def test_every_config_section_records_its_changes(world) -> None:
    data = {"version": 1}
    for section in SECTIONS:
        assert section.name in NEW_ENTRIES, f"add an entry of [[{section.name}]] to this test"
        data[section.name] = [NEW_ENTRIES[section.name]]
    document = config.Document(path="walk.toml", data=data, text="")
    seq = last_event().seq
    config.apply(document, actor=Actor.user(world.admin))
    events = ConfigEvent.objects.filter(seq__gt=seq)
    assert {e.actor for e in events} == {world.admin.username}
    kinds = {e.subject.split(":", 1)[0] for e in events}
    for section in SECTIONS:
        assert section.subject_prefix in kinds, f"applying [[{section.name}]] wrote no event"
    assert config_history.drift() == []


def test_agent_tokens_are_recorded_without_their_secret(world) -> None:
    out = io.StringIO()
    call_command(
        "create_agent_token", "billing-bot", "--tenant", "acme", "--actor", "ops", stdout=out
    )
    raw = out.getvalue().splitlines()[1]
    token = AgentToken.objects.get(name="billing-bot")
    events = ConfigEvent.objects.filter(subject="agent_token:billing-bot")
    assert {e.actor for e in events} == {"ops"}
    text = json.dumps([[e.before, e.after, e.reason] for e in events])
    assert raw not in text and token.token_hash not in text
    assert events.last().after == {"tenants": ["acme"]}
    call_command("revoke_agent_token", "billing-bot", "--actor", "ops2", stdout=io.StringIO())
    revoked = ConfigEvent.objects.filter(subject="agent_token:billing-bot").last()
    assert (revoked.action, revoked.actor, revoked.after) == ("changed", "ops2", {"revoked": True})
    assert config_history.drift() == []


def test_people_flags_deactivation_and_passwords_are_recorded(world) -> None:
    with config_history.acting(Actor.user(world.admin), "test"):
        world.viewer.is_superuser = True
        world.viewer.save()
        world.operator.is_active = False
        world.operator.save()
        world.reviewer.set_password("another secret value")
        world.reviewer.save()
        world.reviewer.groups.add(Group.objects.create(name="staffers"))
    assert ConfigEvent.objects.filter(subject="user:viewer").last().after == {"superuser": True}
    assert ConfigEvent.objects.filter(subject="user:operator").last().after == {"active": False}
    changes = ConfigEvent.objects.filter(subject="user:reviewer").order_by("seq")
    assert [c.action for c in changes][-2:] == ["password.set", "changed"]
    assert changes.last().after == {"groups": ["staffers"]}
    assert world.reviewer.password not in json.dumps([c.after for c in changes])
    # A log-in (last_login only) records nothing.
    seq = last_event().seq
    world.viewer.last_login = dt.datetime.now(dt.UTC)
    world.viewer.save(update_fields=["last_login"])
    assert last_event().seq == seq
    assert config_history.drift() == []


def test_a_change_without_an_actor_is_recorded_as_unattributed(world) -> None:
    tenant = Tenant.objects.get(slug="globex")
    tenant.name = "Globex 2"
    tenant.save()
    event = last_event()
    assert (event.subject, event.actor_kind, event.actor) == (
        "tenant:globex",
        "system",
        "unattributed",
    )


def test_deleting_a_tenant_records_what_went_with_it(world) -> None:
    tenant = Tenant.objects.create(slug="tmp", name="Tmp")
    Membership.objects.create(user=world.viewer, tenant=tenant, role="viewer")
    seq = last_event().seq
    tenant.delete()
    gone = set(
        ConfigEvent.objects.filter(seq__gt=seq, action="deleted").values_list("subject", flat=True)
    )
    assert gone == {"tenant:tmp", "membership:tmp/viewer"}
    assert config_history.drift() == []


def _export(tmp_path, name: str = "audit.jsonl"):
    from attempts import verify_export

    path = tmp_path / name
    call_command("export_audit", "--format", "jsonl", "--out", str(path), stdout=io.StringIO())
    return path, verify_export


def test_the_config_history_is_exported_and_verified_offline(world, tmp_path) -> None:
    with config_history.acting(Actor.user(world.admin), "before the export"):
        tool = Tool.objects.get(name="open_ticket")
        tool.critical = True
        tool.save()
    seal_all()
    path, verify_export = _export(tmp_path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    config = [r for r in records if r["type"] == "config"]
    assert len(config) == ConfigEvent.objects.count()
    assert any(
        r["subject"] == "tool:open_ticket" and r["after"] == {"critical": True} for r in config
    )
    manifest = records[-1]
    assert manifest["authority_digest"] == config_history.authority_digest()
    assert verify_export.verify_file(path).ok

    # Editing a config line, or dropping one, is seen offline.
    edited = path.read_text().replace('"after": {"critical": true}', '"after": {"critical": false}')
    (tmp_path / "edited.jsonl").write_text(edited)
    kinds = {p.kind for p in verify_export.verify_file(tmp_path / "edited.jsonl").problems}
    assert "config" in kinds
    lines = path.read_text().splitlines()
    first_config = next(i for i, line in enumerate(lines) if '"type": "config"' in line)
    del lines[first_config + 1]
    (tmp_path / "cut.jsonl").write_text("\n".join(lines) + "\n")
    assert not verify_export.verify_file(tmp_path / "cut.jsonl").ok


def test_an_export_of_a_drifted_ledger_fails_offline_as_config_drift(world, tmp_path) -> None:
    drop_triggers()
    sql("UPDATE attempts_membership SET role = 'admin' WHERE user_id = %s", [world.viewer.pk])
    path, verify_export = _export(tmp_path)
    report = verify_export.verify_file(path)
    assert [p.kind for p in report.problems] == ["config-drift"], report.render()
