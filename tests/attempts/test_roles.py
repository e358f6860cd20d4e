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


def test_no_role_rank_is_compared_outside_the_models() -> None:
    rank = re.compile(r"ROLE_RANK|role_rank")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for folder in ("attempts", "reconciliation", "ledgerweb")
        for path in sorted((REPO / folder).rglob("*.py"))
        if REPO / "attempts" / "models" not in path.parents
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if rank.search(line)
    ]
    assert found == []
