"""Roles compare in one place: the model's role functions (``attempts.models.Role``). Every
other module asks them, so what a role may do cannot drift between screens, the API, the admin,
SSO and notifications."""

from __future__ import annotations

import re

import pytest

from attempts.models import Role
from tests.conftest import REPO

RANKED = [None, Role.VIEWER, Role.OPERATOR, Role.REVIEWER, Role.ADMIN]


@pytest.mark.parametrize(
    ("question", "first"),
    [(Role.can_view, Role.VIEWER), (Role.can_act, Role.OPERATOR), (Role.can_review, Role.REVIEWER)],
)
def test_each_question_holds_from_its_role_upwards(question, first) -> None:
    assert [question(role) for role in RANKED] == [
        RANKED.index(role) >= RANKED.index(first) for role in RANKED
    ]
    assert Role.at_or_above(first) == [r for r in RANKED[RANKED.index(first) :]]
    assert question("") is False  # no role is not a role


def test_the_highest_role_is_the_one_that_may_do_most() -> None:
    assert Role.highest([Role.VIEWER, Role.ADMIN, Role.OPERATOR]) == Role.ADMIN
    assert Role.highest([]) is None


def outside_the_models(pattern: str, *, besides: tuple[str, ...] = ()) -> list[str]:
    """Where the server's code (the models and the files ``besides`` aside) matches."""
    found = re.compile(pattern)
    skipped = {REPO / name for name in besides}
    return [
        f"{path.relative_to(REPO)}:{number}"
        for folder in ("attempts", "reconciliation", "ledgerweb")
        for path in sorted((REPO / folder).rglob("*.py"))
        if REPO / "attempts" / "models" not in path.parents and path not in skipped
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if found.search(line)
    ]


def test_no_role_rank_is_compared_outside_the_models() -> None:
    assert outside_the_models(r"ROLE_RANK|role_rank") == []


def test_superusers_are_asked_about_through_the_role_functions() -> None:
    """``admin_everywhere`` (and ``tenant_roles``) say what a superuser may do in the ledger;
    the admin site's own permissions (Django's, not a tenant's) are the one exception."""
    assert outside_the_models(r"\.is_superuser\b", besides=("attempts/admin.py",)) == []


@pytest.mark.django_db
def test_an_active_superuser_is_admin_everywhere_and_an_inactive_one_nowhere() -> None:
    from django.contrib.auth import get_user_model

    from attempts.models import Tenant, tenant_roles
    from attempts.models.roles import admin_everywhere

    Tenant.objects.create(slug="acme", name="Acme")
    root = get_user_model().objects.create_superuser("root", password="x")  # noqa: S106
    assert admin_everywhere(root) and tenant_roles(root, fresh=True) == {"acme": Role.ADMIN}
    root.is_active = False
    assert not admin_everywhere(root) and tenant_roles(root, fresh=True) == {}
