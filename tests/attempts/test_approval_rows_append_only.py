"""Approvals are append-only in the database itself (protocol section 7.7, as attempt events
are): an approval is bound to the arguments and the policy version it saw, so no one may move
its expiry, change what it approved or remove it; a void one stays, a new one is a new row."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from attempts import history_guard, review
from attempts.models import Approval, ApprovalPolicy
from tests.dashboard.approvals_helpers import held_intent


@pytest.fixture
def approval(world):
    ApprovalPolicy.objects.create(name="crm", tool_id="update_crm", approvals_needed=1)
    attempt = held_intent(world, "crm:1", {"id": 1}, tool="update_crm")
    review.approve_held(attempt, user=world.reviewer, comment="fine")
    return Approval.objects.get()


def test_the_database_refuses_to_change_or_remove_an_approval(approval):
    table = Approval._meta.db_table
    later = (timezone.now() + dt.timedelta(days=30)).isoformat()
    for sql, params in (
        (f"UPDATE {table} SET expires_at = %s", [later]),  # noqa: S608
        (f"UPDATE {table} SET args_hash = %s", ["0" * 64]),  # noqa: S608
        (f"DELETE FROM {table}", []),  # noqa: S608
    ):
        with pytest.raises((DatabaseError, IntegrityError)) as exc:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, params)
        assert "append-only" in str(exc.value)
    with pytest.raises((DatabaseError, IntegrityError)), transaction.atomic():
        Approval.objects.filter(pk=approval.pk).update(policy_version=99)
    stored = Approval.objects.get()
    assert (stored.policy_version, stored.expires_at, stored.args_hash) == (
        approval.policy_version,
        approval.expires_at,
        approval.args_hash,
    )


def test_the_guards_are_installed_on_approvals(approval):
    assert "attempts_approval" in history_guard.TABLES
    assert history_guard.installed(connection)
