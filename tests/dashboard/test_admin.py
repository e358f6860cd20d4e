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
