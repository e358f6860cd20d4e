"""Shared helpers for the audit tests: a small real history, and an attacker's raw SQL."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from attempts import ledger
from attempts.models import Attempt, AttemptEvent
from attempts.states import Actor

EVENTS = "attempts_attemptevent"
ATTEMPTS = "attempts_attempt"


def build_history(world, n: int = 4, *, tenant: str = "acme", prefix: str = "k") -> list[Attempt]:
    """``n`` attempts through the safe order, some confirmed, some left UNKNOWN or FAILED."""
    agent = Actor.agent("test-agent")
    made = []
    for i in range(n):
        attempt, _ = ledger.record_intent(
            tenant=tenant,
            task_id=f"task-{i}",
            tool_name="update_crm",
            idempotency_key=f"{prefix}:{tenant}:{i}",
            args={"customer": i, "note": f'=HYPERLINK("x{i}")'},
            actor=agent,
        )
        attempt, _ = ledger.claim_dispatch(attempt, actor=agent)
        attempt = ledger.attach_provider_request(attempt, f"req-{prefix}-{i}", actor=agent)
        if i % 3 == 0:
            attempt = ledger.confirm(attempt, result_ref=f"receipt-{i}", actor=agent)
        elif i % 3 == 1:
            attempt = ledger.mark_unknown(attempt, reason="timeout", actor=agent)
        else:
            attempt = ledger.fail(attempt, reason="refused", retryable=False, actor=agent)
        made.append(attempt)
    return made


def event_ids() -> list[int]:
    return list(AttemptEvent.objects.order_by("id").values_list("id", flat=True))


def drop_triggers() -> None:
    """What an attacker with write access to the database does first."""
    from attempts import history_guard

    history_guard.remove(connection)


def seal_all() -> None:
    """Run the sealer until everything written so far is in a checkpoint."""
    from attempts import chain

    while chain.seal() is not None:
        pass


def sql(statement: str, params: list | tuple = ()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def event_row(event_id: int) -> dict:
    event = AttemptEvent.objects.select_related("attempt").get(id=event_id)
    return {
        "id": event.id,
        "attempt_id": event.attempt.attempt_id,
        "action": event.action,
        "actor_kind": event.actor_kind,
        "actor": event.actor,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "details": event.details,
        "created_at": event.created_at,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
        "v": event.chain_format,
        "attempt_pk": event.attempt_id,
    }


def json_text(value) -> str:
    return json.dumps(value)


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """The world's users are made with a fast hasher (these tests are about the ledger), and
    pages render without a collectstatic manifest."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
