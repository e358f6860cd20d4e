# ruff: noqa: S608 -- the attacker writes raw SQL against constant table names
"""Protocol invariant 7: history cannot be edited, deleted, inserted, reordered, nor an attempt
deleted with its history, without ``verify_audit`` saying so and naming the right event.

Each test plays an attacker with write access to the database: it drops the append-only triggers
(as such an attacker can) and tampers with raw SQL, then runs the real command."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from attempts import audit, audit_verify, verify_export
from attempts.models import Attempt, AttemptEvent
from tests.attempts.audit_helpers import (
    ATTEMPTS,
    EVENTS,
    build_history,
    drop_triggers,
    event_ids,
    event_row,
    fast_passwords,  # noqa: F401  (autouse)
    sql,
)


def run_verify(*args: str) -> str:
    out = io.StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def broken(*args: str) -> str:
    with pytest.raises(CommandError) as info:
        run_verify(*args)
    assert info.value.returncode == 1
    return str(info.value)


def first_problem(report) -> verify_export.Problem:
    assert not report.ok
    return report.problems[0]


@pytest.fixture
def history(world):
    return build_history(world, 5)


def test_untouched_ledger_verifies(history):
    out = run_verify()
    assert out.startswith("OK:")
    head = AttemptEvent.objects.order_by("-id").first()
    assert head.hash in out
    assert f"{AttemptEvent.objects.count()} events verify" in out


def test_empty_ledger_verifies(db):
    assert run_verify().startswith("OK:")


def test_the_verifier_hashes_exactly_what_the_core_hashes(history):
    for event in AttemptEvent.objects.select_related("attempt"):
        core = audit.event_payload(
            attempt_id=event.attempt.attempt_id,
            action=event.action,
            actor_kind=event.actor_kind,
            actor=event.actor,
            from_state=event.from_state,
            to_state=event.to_state,
            reason=event.reason,
            details=event.details,
            created_at=event.created_at,
            prev_hash=event.prev_hash,
        )
        row = event_row(event.id)
        assert verify_export.event_payload(row) == core
        assert verify_export.event_hash(row) == audit.payload_hash(core) == event.hash


def test_editing_an_event_names_it(history):
    target = event_ids()[6]
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET reason = %s WHERE id = %s", ["nothing to see", target])
    message = broken()
    assert "first broken link: [content]" in message
    assert f"event {target}" in message.splitlines()[0]


def test_editing_an_event_and_rehashing_it_names_it_and_the_next(history):
    ids = event_ids()
    target = ids[6]
    drop_triggers()
    row = event_row(target)
    row["actor"] = "someone-else"
    new_hash = verify_export.event_hash(row)
    sql(
        f"UPDATE {EVENTS} SET actor = %s, hash = %s WHERE id = %s",
        ["someone-else", new_hash, target],
    )
    report = audit_verify.verify_django_database()
    problem = first_problem(report)
    assert problem.kind == "link"
    assert problem.event_id == ids[7]
    assert f"after event {target}" in problem.message


def test_deleting_an_event_names_the_gap(history):
    ids = event_ids()
    target = ids[4]
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [target])
    message = broken()
    first = message.splitlines()[0]
    assert "[link]" in first
    assert f"event {ids[5]}" in first
    assert f"after event {ids[3]}" in first


def test_deleting_the_first_event_is_seen(history):
    ids = event_ids()
    drop_triggers()
    # The creation event goes, so the attempt row is also inconsistent with its history.
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [ids[0]])
    report = audit_verify.verify_django_database()
    problem = first_problem(report)
    assert problem.kind == "link" and problem.event_id == ids[1]
    assert "events before it were deleted" in problem.message
    assert any("creation event was deleted" in p.message for p in report.problems)


def test_inserting_an_event_names_it(history):
    ids = event_ids()
    after = ids[5]
    drop_triggers()
    # Make room after ``after`` by moving the later events up, then forge a well-formed event
    # chained to its predecessor: its own hash is right, but the next link cannot be.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MAX(id) FROM {EVENTS}")
        top = cursor.fetchone()[0]
    for event_id in reversed(ids[6:]):
        sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [event_id + top, event_id])
    base = event_row(after)
    forged = dict(base, action="attempt.note", reason="approved by the CFO", details={})
    forged["prev_hash"] = base["hash"]
    forged["hash"] = verify_export.event_hash(forged)
    forged_id = after + 1
    sql(
        f"INSERT INTO {EVENTS} (id, attempt_id, action, actor_kind, actor, from_state, to_state, "
        "reason, details, created_at, prev_hash, hash) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            forged_id,
            base["attempt_pk"],
            forged["action"],
            forged["actor_kind"],
            forged["actor"],
            forged["from_state"],
            forged["to_state"],
            forged["reason"],
            "{}",
            base["created_at"],
            forged["prev_hash"],
            forged["hash"],
        ],
    )
    report = audit_verify.verify_django_database()
    problem = first_problem(report)
    assert problem.kind == "link"
    assert problem.event_id == ids[6] + top
    assert f"after event {forged_id}" in problem.message
    assert f"after event {forged_id}" in broken()


def test_reordering_two_events_names_the_first_moved(history):
    ids = event_ids()
    a, b = ids[3], ids[8]
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [-1, a])
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [a, b])
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [b, -1])
    report = audit_verify.verify_django_database()
    problem = first_problem(report)
    assert problem.kind == "link"
    assert problem.event_id == a
    assert f"event {a}" in broken().splitlines()[0]


def test_deleting_an_attempt_with_its_history_is_seen(history):
    victim = history[1]
    victim_events = list(victim.events.order_by("id").values_list("id", flat=True))
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [victim.pk])
    sql(f"DELETE FROM {ATTEMPTS} WHERE id = %s", [victim.pk])
    assert not Attempt.objects.filter(pk=victim.pk).exists()
    successor = min(i for i in event_ids() if i > victim_events[0])
    report = audit_verify.verify_django_database()
    problem = first_problem(report)
    assert problem.kind == "link"
    assert problem.event_id == successor
    assert f"event {successor}" in broken().splitlines()[0]


def test_deleting_the_newest_events_is_seen_with_a_head_kept_elsewhere(history):
    head = AttemptEvent.objects.order_by("-id").first()
    assert run_verify("--expect-head", head.hash).startswith("OK:")
    drop_triggers()
    last = history[-1]
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [head.id])
    # Cover the tracks on the attempt row too: without the kept head the chain looks whole.
    previous = last.events.order_by("-id").first()
    sql(f"UPDATE {ATTEMPTS} SET state = %s WHERE id = %s", [previous.to_state, last.pk])
    assert run_verify().startswith("OK:")
    message = broken("--expect-head", head.hash)
    assert "[anchor]" in message and head.hash in message


def test_editing_an_attempt_row_is_seen(history):
    target = history[1]  # UNKNOWN
    sql(f"UPDATE {ATTEMPTS} SET state = %s WHERE id = %s", ["OUTCOME_CONFIRMED", target.pk])
    message = broken()
    assert f"attempt {target.attempt_id}" in message
    assert "state is OUTCOME_CONFIRMED" in message


@pytest.mark.parametrize(
    ("column", "value", "phrase"),
    [
        ("idempotency_key", "k:acme:other", "idempotency_key is"),
        ("tenant_id", "globex", "tenant is"),
        ("args", '{"customer": 99}', "args no longer hash"),
        ("provider_request_id", "req-forged", "provider_request_id is"),
        ("result_ref", "receipt-forged", "result_ref is"),
    ],
)
def test_editing_an_attempts_key_fields_is_seen(history, column, value, phrase):
    target = history[0]
    sql(f"UPDATE {ATTEMPTS} SET {column} = %s WHERE id = %s", [value, target.pk])
    message = broken()
    assert f"attempt {target.attempt_id}" in message
    assert phrase in message


def test_an_attempt_without_history_is_seen(history):
    target = history[2]
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [target.pk])
    report = audit_verify.verify_django_database()
    assert any(
        p.attempt_id == target.attempt_id and "has no history" in p.message for p in report.problems
    )


def test_bad_arguments_are_clear_errors(db, tmp_path):
    with pytest.raises(CommandError, match="64-digit hex"):
        run_verify("--expect-head", "abc")
    with pytest.raises(CommandError, match="no such file"):
        run_verify("--export", str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match="no such file"):
        run_verify("--sqlite", str(tmp_path / "missing.sqlite3"))


def test_history_is_append_only_in_the_database(history):
    """The triggers (which an attacker must drop first) refuse UPDATE and DELETE."""
    from django.db import DatabaseError, transaction

    target = event_ids()[0]
    for statement in (
        f"UPDATE {EVENTS} SET reason = 'x' WHERE id = %s",
        f"DELETE FROM {EVENTS} WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"):
            with transaction.atomic():
                sql(statement, [target])
    assert run_verify().startswith("OK:")
