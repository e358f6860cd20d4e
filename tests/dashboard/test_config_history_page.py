"""The configuration history page: every change of who may do what, filtered by kind, subject,
actor and time, with before and after, paginated, scoped to the person's tenants."""

from __future__ import annotations

import pytest

from attempts import config_history
from attempts.models import ConfigEvent, Membership, Tenant, Tool
from attempts.states import Actor
from tests.dashboard.conftest import login

pytestmark = pytest.mark.django_db


def change_things(world) -> None:
    with config_history.acting(Actor.user(world.admin), "test change"):
        membership = Membership.objects.get(user=world.viewer, tenant="acme")
        membership.role = "operator"
        membership.save()
        globex = Tenant.objects.get(slug="globex")
        globex.name = "Globex Secret Rename"
        globex.save()
        tool = Tool.objects.get(name="open_ticket")
        tool.critical = True
        tool.save()


def test_a_reviewer_sees_their_tenants_changes_with_before_and_after(world) -> None:
    change_things(world)
    page = login(world.reviewer).get("/audit/config/").content.decode()
    assert "membership:acme/viewer" in page
    assert "&quot;viewer&quot;</del> → <ins>&quot;operator&quot;</ins>" in page
    assert "tool:open_ticket" in page
    # Another tenant's changes, and people's, are not a reviewer's.
    assert "Globex Secret Rename" not in page and "tenant:globex" not in page
    assert "user:viewer" not in page
    assert 'data-testid="nav-config"' in page


def test_people_and_other_tenants_changes_are_for_superusers(world) -> None:
    change_things(world)
    assert "user:viewer" not in login(world.admin).get("/audit/config/").content.decode()
    world.admin.is_superuser = True
    world.admin.save()
    client = login(world.admin)
    assert "user:viewer" in client.get("/audit/config/?kind=user").content.decode()
    assert "Globex Secret Rename" in client.get("/audit/config/?kind=tenant").content.decode()


def test_viewers_and_operators_may_not_open_it(world) -> None:
    assert login(world.viewer).get("/audit/config/").status_code == 403
    assert login(world.operator).get("/audit/config/").status_code == 403
    anonymous = login(world.viewer)
    anonymous.logout()
    assert anonymous.get("/audit/config/").status_code == 302


def test_filters_by_kind_subject_actor_and_time(world) -> None:
    change_things(world)
    client = login(world.reviewer)

    def subjects(query: str) -> set[str]:
        response = client.get("/audit/config/" + query, headers={"HX-Request": "true"})
        assert response.status_code == 200
        text = response.content.decode()
        assert "<html" not in text  # the table partial only
        return {s for s in ("membership:acme/viewer", "tool:open_ticket") if s in text}

    assert subjects("?kind=tool") == {"tool:open_ticket"}
    assert subjects("?subject=membership:acme/") == {"membership:acme/viewer"}
    assert subjects(f"?actor={world.admin.username}&action=changed") == {
        "membership:acme/viewer",
        "tool:open_ticket",
    }
    assert subjects("?actor=nobody") == set()
    assert subjects("?until=2000-01-01") == set()
    assert subjects("?since=2000-01-01") == {"membership:acme/viewer", "tool:open_ticket"}


@pytest.mark.parametrize(
    "query",
    [
        "?kind=nope",
        "?since=yesterday",
        "?size=7",
        "?before=abc",
        "?since=2026-02-02&until=2026-01-01",
    ],
)
def test_bad_filters_are_a_clear_400(world, query) -> None:
    response = login(world.reviewer).get("/audit/config/" + query)
    assert response.status_code == 400
    text = response.content.decode().lower()
    assert "must" in text or "unknown kind" in text


def test_pages_are_keyset_ranges_newest_first(world) -> None:
    with config_history.acting(Actor.user(world.admin), "paging"):
        tool = Tool.objects.get(name="open_ticket")
        for n in range(30):
            tool.timeout_seconds = 10.0 + n
            tool.save()
    client = login(world.reviewer)
    first = client.get("/audit/config/?kind=tool&size=25").content.decode()
    newest = ConfigEvent.objects.filter(subject="tool:open_ticket").order_by("-seq")
    seqs = list(newest.values_list("seq", flat=True))
    assert f'data-change="{seqs[0]}"' in first and f'data-change="{seqs[24]}"' in first
    assert f'data-change="{seqs[25]}"' not in first
    assert f"before={seqs[24]}" in first
    second = client.get(f"/audit/config/?kind=tool&size=25&before={seqs[24]}").content.decode()
    assert f'data-change="{seqs[25]}"' in second and f'data-change="{seqs[24]}"' not in second


def test_a_reviewer_sees_the_approval_policies_that_concern_their_tenants(world) -> None:
    """Approval policies name their tenants in their values (every tenant when empty): a
    reviewer sees the changes of those that concern a tenant of theirs, and filters by kind."""
    from attempts.models import ApprovalPolicy

    with config_history.acting(Actor.user(world.admin), "hold risky calls"):
        ApprovalPolicy.objects.create(name="every-tenant", tool_id="charge_card")
        ApprovalPolicy.objects.create(name="acme-crm", tool_id="update_crm", tenants=["acme"])
        ApprovalPolicy.objects.create(name="globex-only", tool_id="update_crm", tenants=["globex"])
    client = login(world.reviewer)
    kinds = client.get("/audit/config/").content.decode()
    assert '<option value="approval_policy"' in kinds
    response = client.get("/audit/config/?kind=approval_policy")
    assert response.status_code == 200
    page = response.content.decode()
    assert "approval_policy:every-tenant" in page and "approval_policy:acme-crm" in page
    assert "globex-only" not in page
    assert '<td class="mono wrap">tool:' not in page  # the filter keeps only policies
    assert client.get("/audit/config/?kind=nonsense").status_code == 400
