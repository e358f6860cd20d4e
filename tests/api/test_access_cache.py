"""Remembered answers about who may do what (embedded SQLite): a change to a token, its tenants,
a grant or a tool made through the product reaches every worker at once, through the access
stamp; a change behind the product's back within MAX_AGE seconds. PostgreSQL remembers nothing."""

from __future__ import annotations

import subprocess

import pytest
from django.db import connection
from django.utils import timezone

from attempts import access_cache, ledger
from attempts.models import AgentToken, Grant, Tool
from attempts.states import Actor
from tests.conftest import PYTHON, REPO, child_env, make_world

AGENT = Actor.agent("cache-test")


@pytest.fixture
def issued(db):
    make_world()
    token, raw = AgentToken.issue("cache-bot", ["acme"])
    return token, raw


def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("answers are remembered on the embedded SQLite database only")


def remembered(raw: str):
    return access_cache.identity_if_remembered(AgentToken.hash_token(raw))


def intent(key: str, tool: str = "open_ticket"):
    return ledger.record_intent(
        tenant="acme", task_id="t", tool_name=tool, idempotency_key=key, args={}, actor=AGENT
    )


def test_a_live_identity_is_remembered_and_an_unknown_one_is_not(issued) -> None:
    sqlite_only()
    _, raw = issued
    first = AgentToken.authenticate(raw)
    assert first is not None and first.tenant_slugs == {"acme"}
    assert remembered(raw) is first
    assert AgentToken.authenticate(raw) is first
    assert AgentToken.authenticate(raw + "x") is None
    assert remembered(raw + "x") is None


@pytest.mark.parametrize("how", ["revoke", "queryset_update", "save", "delete"])
def test_revoking_through_the_product_is_seen_at_once(issued, how) -> None:
    token, raw = issued
    assert AgentToken.authenticate(raw) is not None
    if how == "revoke":
        token.revoke()
    elif how == "queryset_update":  # what the admin's bulk action does
        AgentToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    elif how == "save":
        token.revoked_at = timezone.now()
        token.save()
    else:
        token.delete()
    assert AgentToken.authenticate(raw) is None


def test_a_tenant_change_is_seen_at_once(issued) -> None:
    token, raw = issued
    assert AgentToken.authenticate(raw).tenant_slugs == {"acme"}
    token.tenants.add("globex")
    assert AgentToken.authenticate(raw).tenant_slugs == {"acme", "globex"}
    token.tenants.remove("acme")
    assert AgentToken.authenticate(raw).tenant_slugs == {"globex"}


def test_recording_use_keeps_what_is_remembered(issued) -> None:
    sqlite_only()
    token, raw = issued
    first = AgentToken.authenticate(raw)
    token.touch()  # last_used_at only
    AgentToken.objects.filter(pk=token.pk).record_use(last_used_at=None)
    assert AgentToken.authenticate(raw) is first


def test_a_change_behind_the_products_back_waits_for_max_age(issued, monkeypatch) -> None:
    sqlite_only()
    token, raw = issued
    assert AgentToken.authenticate(raw) is not None
    with connection.cursor() as cursor:  # no signal, no stamp: typed into the database
        cursor.execute(
            f"UPDATE {AgentToken._meta.db_table} SET revoked_at = %s WHERE id = %s",  # noqa: S608
            [timezone.now(), token.pk],
        )
    assert AgentToken.authenticate(raw) is not None  # trusted until MAX_AGE
    monkeypatch.setattr(access_cache, "MAX_AGE", 0.0)
    assert AgentToken.authenticate(raw) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda: Grant.objects.filter(tenant="acme", tool="open_ticket").update(active=False),
        lambda: Grant.objects.get(tenant="acme", tool="open_ticket").delete(),
        lambda: Tool.objects.filter(name="open_ticket").update(active=False),
        lambda: _save(Tool.objects.get(name="open_ticket"), active=False),
        lambda: _save(Grant.objects.get(tenant="acme", tool="open_ticket"), active=False),
    ],
    ids=["grant_update", "grant_delete", "tool_update", "tool_save", "grant_save"],
)
def test_a_grant_or_tool_change_refuses_the_next_intent(issued, change) -> None:
    intent("cache:before")
    if connection.vendor == "sqlite":
        assert access_cache.terms_if_remembered("acme", "open_ticket") is not None
    change()
    with pytest.raises(ledger.LedgerError):
        intent("cache:after")


def test_a_new_policy_version_is_seen_at_once(issued) -> None:
    assert intent("cache:v1")[0].policy_version == "v1"
    Grant.objects.filter(tenant="acme", tool="open_ticket").update(policy_version="v2")
    assert intent("cache:v2")[0].policy_version == "v2"


def _save(row, **fields) -> None:
    for name, value in fields.items():
        setattr(row, name, value)
    row.save()


@pytest.mark.django_db(transaction=True)
def test_a_revocation_in_another_process_is_seen_at_once() -> None:
    sqlite_only()
    make_world()
    _, raw = AgentToken.issue("cache-bot", ["acme"])
    assert AgentToken.authenticate(raw) is not None
    assert remembered(raw) is not None
    subprocess.run(
        [PYTHON, "manage.py", "revoke_agent_token", "cache-bot"],
        cwd=REPO,
        env=child_env(),
        check=True,
        capture_output=True,
    )
    assert AgentToken.authenticate(raw) is None


def test_postgresql_remembers_nothing(issued) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("PostgreSQL only")
    _, raw = issued
    assert AgentToken.authenticate(raw) is not None
    intent("cache:pg")
    assert access_cache.stamp_path() is None
    assert remembered(raw) is None
    assert access_cache.terms_if_remembered("acme", "open_ticket") is None
