"""The admin: configuration is editable (tools, grants, ownership rules, tenants and
memberships); attempts and history are read-only, and staff see only their tenants."""

from __future__ import annotations

from django.contrib.auth.models import Permission

from attempts.models import Tool
from tests.dashboard.conftest import login, make_review, make_unknown


def test_superuser_configures_tools_grants_rules_tenants(world):
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    client = login(world.admin)
    for path in (
        "/admin/",
        "/admin/attempts/tool/",
        "/admin/attempts/tool/add/",
        "/admin/attempts/grant/",
        "/admin/attempts/grant/add/",
        "/admin/attempts/ownershiprule/",
        "/admin/attempts/tenant/acme/change/",
        "/admin/attempts/membership/",
        "/admin/auth/user/",
    ):
        assert client.get(path).status_code == 200, path
    response = client.post(
        "/admin/attempts/tool/add/",
        {
            "name": "refund_payment",
            "effect_class": "reconcilable",
            "critical": "on",
            "adapter": "http",
            "timeout_seconds": "5",
            "active": "on",
        },
    )
    assert response.status_code == 302
    assert Tool.objects.get(name="refund_payment").critical
    page = client.get(f"/admin/auth/user/{world.viewer.pk}/change/").content.decode()
    assert "tenant membership" in page.lower() and "acme" in page


def test_attempts_and_history_are_read_only(world):
    attempt = make_review(world)
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    client = login(world.admin)
    page = client.get(f"/admin/attempts/attempt/{attempt.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'name="_save"' not in body and attempt.idempotency_key in body
    assert client.get("/admin/attempts/attempt/add/").status_code == 403
    assert client.post(f"/admin/attempts/attempt/{attempt.pk}/delete/").status_code == 403
    event = attempt.events.first()
    assert client.get(f"/admin/attempts/attemptevent/{event.pk}/change/").status_code == 200
    assert client.post(f"/admin/attempts/attemptevent/{event.pk}/delete/").status_code == 403
    before = attempt.state
    client.post(f"/admin/attempts/attempt/{attempt.pk}/change/", {"state": "FAILED"})
    attempt.refresh_from_db()
    assert attempt.state == before


def test_staff_see_only_their_tenants_attempts_in_the_admin(world):
    mine = make_unknown(world)
    theirs = make_unknown(world, tenant="globex")
    world.operator.is_staff = True
    world.operator.save()
    world.operator.user_permissions.add(
        Permission.objects.get(codename="view_attempt"),
        Permission.objects.get(codename="view_attemptevent"),
    )
    client = login(world.operator)
    body = client.get("/admin/attempts/attempt/").content.decode()
    assert mine.attempt_id in body and theirs.attempt_id not in body
    assert client.get(f"/admin/attempts/attempt/{theirs.pk}/change/").status_code == 302
    events = client.get("/admin/attempts/attemptevent/").content.decode()
    assert theirs.attempt_id not in events


def _superuser(world):
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    return login(world.admin)


def test_unticking_critical_is_recorded_with_who_and_shown_on_the_attempt(world):
    """Authority and review settings changed in the admin land in the tamper-evident history,
    with the person who changed them, and on the detail page of the attempts they affect."""
    from attempts.models import ConfigEvent, Grant, OwnershipRule

    attempt = make_review(world, tool="charge_card")  # critical: four eyes
    client = _superuser(world)
    tool = Tool.objects.get(name=attempt.tool_name)
    assert tool.critical
    response = client.post(
        f"/admin/attempts/tool/{tool.name}/change/",
        {
            "description": tool.description,
            "effect_class": tool.effect_class,
            "adapter": "http",
            "timeout_seconds": "10",
            "active": "on",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    assert not Tool.objects.get(name=tool.name).critical
    [change] = ConfigEvent.objects.filter(subject=f"tool:{tool.name}", action="changed")
    assert (change.actor, change.actor_kind, change.action) == ("admin", "user", "changed")
    assert change.before == {"critical": True} and change.after == {"critical": False}

    grant = Grant.objects.get(tenant="acme", tool=tool)
    response = client.post(
        f"/admin/attempts/grant/{grant.pk}/change/",
        {
            "tenant": "acme",
            "tool": tool.name,
            "policy_version": "v2",
            "allowed_scopes": '["charge_card:write"]',
            "active": "on",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    grant_change = ConfigEvent.objects.get(subject=f"grant:acme/{tool.name}", action="changed")
    assert grant_change.after["policy_version"] == "v2"

    rule = OwnershipRule.objects.get(tenant_pattern="acme")
    response = client.post(f"/admin/attempts/ownershiprule/{rule.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert (
        ConfigEvent.objects.filter(subject=f"ownership_rule:{rule.pk}").last().action == "deleted"
    )

    reviewer = login(world.reviewer)
    page = reviewer.get(f"/attempts/{attempt.attempt_id}/").content.decode()
    assert f"tool:{tool.name} changed" in page
    assert "critical=false" in page
    assert f"grant:acme/{tool.name} changed" in page
    assert f"ownership_rule:{rule.pk} deleted" in page


def test_load_tools_records_its_changes(world, tmp_path):
    import io
    import json

    from django.core.management import call_command

    from attempts.models import ConfigEvent

    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"name": "update_crm", "effect_class": "reconcilable"}]))
    call_command("load_tools", str(path), "--actor", "ops-alice", stdout=io.StringIO())
    [change] = ConfigEvent.objects.filter(subject="tool:update_crm", action="changed")
    assert change.actor == "ops-alice"
    assert "reconcilable" in json.dumps(change.after)
