"""Agent tokens: issued by manage.py and the admin, shown once, stored hashed, revocable."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command

from attempts.models import AgentToken
from tests.api.conftest import Api
from tests.conftest import PASSWORD


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_agent_token_prints_a_working_token_once(world, client) -> None:
    output = run("create_agent_token", "billing-bot", "--tenant", "acme", "--tenant", "globex")
    raw = re.search(r"^(lwt_\S+)$", output, re.M).group(1)
    token = AgentToken.objects.get(name="billing-bot")
    assert token.token_hash == AgentToken.hash_token(raw)
    assert raw not in str(AgentToken.objects.values().get())
    assert sorted(token.tenants.values_list("slug", flat=True)) == ["acme", "globex"]
    assert Api(client, raw).get("attempts").status == 200
    quiet = run("create_agent_token", "quiet-bot", "--tenant", "acme", "--quiet").strip()
    assert quiet.startswith("lwt_") and "\n" not in quiet


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bot", "--tenant", "nowhere"], "unknown tenant"),
        (["", "--tenant", "acme"], "NAME"),
    ],
)
def test_create_agent_token_refuses_bad_input(world, args, message) -> None:
    with pytest.raises(CommandError, match=message):
        run("create_agent_token", *args)
    assert not AgentToken.objects.exists()


def test_create_agent_token_refuses_a_taken_name(world) -> None:
    run("create_agent_token", "bot", "--tenant", "acme")
    with pytest.raises(CommandError, match="already exists"):
        run("create_agent_token", "bot", "--tenant", "acme")


def test_revoke_agent_token(world, client) -> None:
    raw = run("create_agent_token", "bot", "--tenant", "acme", "--quiet").strip()
    assert "Revoked" in run("revoke_agent_token", "bot")
    assert "already revoked" in run("revoke_agent_token", "bot")
    assert Api(client, raw).get("attempts").status == 401
    with pytest.raises(CommandError, match="no agent token"):
        run("revoke_agent_token", "nobody")


def test_admin_add_shows_the_token_once_and_stores_its_hash(world, client, settings) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    world.admin.is_staff = world.admin.is_superuser = True
    world.admin.save()
    client.login(username="admin", password=PASSWORD)
    response = client.post(
        "/admin/attempts/agenttoken/add/",
        {"name": "admin-bot", "tenants": ["acme"]},
        follow=True,
    )
    assert response.status_code == 200
    shown = re.search(r"(lwt_[A-Za-z0-9_-]+)", response.content.decode()).group(1)
    token = AgentToken.objects.get(name="admin-bot")
    assert token.token_hash == AgentToken.hash_token(shown)
    assert token.created_by == world.admin
    assert Api(client, shown).get("attempts").status == 200
    change = client.get(f"/admin/attempts/agenttoken/{token.pk}/change/").content.decode()
    assert shown not in change
    client.post(
        "/admin/attempts/agenttoken/",
        {"action": "revoke_tokens", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert Api(client, shown).get("attempts").status == 401


def test_a_token_without_tenants_authenticates_but_is_refused_every_tenant(world, client) -> None:
    _, raw = AgentToken.issue("lonely", [])
    api = Api(client, raw)
    assert api.get("attempts").body == {"attempts": [], "next_after": None}
    assert api.intent().status == 403
