# ruff: noqa: S608 -- the attacker writes raw SQL against constant table names
"""verify_audit at any size: the attempts' chains verified in several processes (``--jobs``) find
exactly what one process finds, in the same order; ``--since`` checks only what changed after a
checkpoint an earlier run verified."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from attempts import audit_verify, ledger
from attempts.audit_verify.parallel import ranges
from attempts.models import Attempt, AttemptEvent
from attempts.states import Actor
from tests.attempts.audit_helpers import (
    ATTEMPTS,
    EVENTS,
    build_history,
    drop_triggers,
    fast_passwords,  # noqa: F401  (autouse)
    seal_all,
    sql,
)

# Workers are other processes: they see only committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of two attempts, so a dozen attempts spread over every worker."""
    monkeypatch.setattr(audit_verify.chains, "BATCH", 2)


def lines(report) -> list[str]:
    return [str(problem) for problem in report.problems]


def test_several_processes_find_what_one_finds_in_the_same_order(world, small_batches) -> None:
    made = build_history(world, 12)
    seal_all()
    one = audit_verify.verify_django_database(jobs=1)
    many = audit_verify.verify_django_database(jobs=3)
    assert one.ok and many.ok, many.render()
    assert (one.events, many.events) == (AttemptEvent.objects.count(),) * 2
    drop_triggers()
    events = {a.attempt_id: list(a.events.order_by("id")) for a in Attempt.objects.all()}
    sql(f"UPDATE {EVENTS} SET actor = 'forger' WHERE id = %s", [events[made[1].attempt_id][1].id])
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [events[made[6].attempt_id][2].id])
    sql(f"UPDATE {ATTEMPTS} SET state = 'RECONCILED' WHERE id = %s", [made[10].pk])
    one = audit_verify.verify_django_database(jobs=1)
    many = audit_verify.verify_django_database(jobs=3)
    assert lines(one) == lines(many)
    assert {p.kind for p in one.problems} >= {"content", "link", "attempt", "seal"}
    assert one.events == many.events


def test_since_checks_what_changed_after_the_checkpoint(world, small_batches) -> None:
    old = build_history(world, 6)
    seal_all()
    first = audit_verify.verify_django_database(jobs=2)
    assert first.ok and first.checkpoint is not None
    seq, digest = first.checkpoint
    assert f"to resume from here: --since {seq}:{digest}" in first.render()
    new = build_history(world, 3, prefix="new")
    seal_all()
    since = audit_verify.verify_django_database(jobs=2, since=(seq, digest))
    assert since.ok, since.render()
    assert since.events == sum(a.events.count() for a in new)
    # A changed attempt is checked whole; an untouched sealed one waits for a full run.
    agent = Actor.agent("test-agent")
    ledger.confirm(Attempt.objects.get(pk=old[1].pk), result_ref="late", actor=agent)
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET reason = 'forged' WHERE attempt_id = %s", [old[1].pk])
    sql(f"UPDATE {EVENTS} SET reason = 'forged' WHERE attempt_id = %s", [old[3].pk])
    incremental = audit_verify.verify_django_database(jobs=2, since=(seq, digest))
    assert {p.attempt_id for p in incremental.problems if p.kind == "content"} == {
        old[1].attempt_id
    }
    full = audit_verify.verify_django_database(jobs=2)
    assert {p.attempt_id for p in full.problems if p.kind == "content"} == {
        old[1].attempt_id,
        old[3].attempt_id,
    }


def test_since_a_checkpoint_that_was_rewritten_is_an_anchor_problem(world) -> None:
    build_history(world, 2)
    seal_all()
    seq, _ = audit_verify.verify_django_database().checkpoint
    report = audit_verify.verify_django_database(since=(seq, "f" * 64))
    assert [p.kind for p in report.problems] == ["anchor"]
    report = audit_verify.verify_django_database(since=(seq + 5, "f" * 64))
    assert [p.kind for p in report.problems] == ["anchor"]


def test_the_command_takes_jobs_and_since(world, small_batches) -> None:
    build_history(world, 6)
    seal_all()
    out = io.StringIO()
    call_command("verify_audit", "--jobs", "2", stdout=out)
    resume = out.getvalue().split("to resume from here: ")[1].split()[1]
    out = io.StringIO()
    call_command("verify_audit", "--jobs", "2", "--since", resume, stdout=out)
    assert out.getvalue().startswith("OK:") and ": 0 events verify" in out.getvalue()
    for bad in (["--jobs", "0"], ["--since", "12"], ["--since", "x:abc"]):
        with pytest.raises(CommandError):
            call_command("verify_audit", *bad, stdout=io.StringIO())


def delete_attempt_rows(pks: list[int]) -> None:
    """An attacker who deletes attempts but leaves their events, past the foreign key."""
    from django.db import connection

    if connection.vendor == "postgresql":
        sql("SET session_replication_role = replica")  # foreign keys are triggers there
        sql(f"DELETE FROM {ATTEMPTS} WHERE id = ANY(%s)", [pks])
        sql("SET session_replication_role = DEFAULT")
    else:
        sql("PRAGMA foreign_keys = OFF")
        for pk in pks:
            sql(f"DELETE FROM {ATTEMPTS} WHERE id = %s", [pk])
        sql("PRAGMA foreign_keys = ON")


@pytest.mark.parametrize("jobs", [1, 3])
def test_events_whose_attempt_is_gone_are_orphans_wherever_the_attempt_was(
    world, small_batches, jobs
) -> None:
    made = build_history(world, 12)
    # The first and the last attempt (outside the remaining ids), and two in the middle (one
    # alone in its batch of two, one beside a survivor).
    victims = [made[0], made[4], made[5], made[8], made[11]]
    orphans = sorted(AttemptEvent.objects.filter(attempt__in=victims).values_list("id", flat=True))
    drop_triggers()
    delete_attempt_rows([a.pk for a in victims])
    report = audit_verify.verify_django_database(jobs=jobs)
    found = [p.event_id for p in report.problems if p.kind == "orphan"]
    assert sorted(found) == orphans and len(found) == len(set(found))
    assert {p.kind for p in report.problems} == {"orphan"}, report.render()
    assert lines(report) == lines(audit_verify.verify_django_database(jobs=1))


@pytest.mark.parametrize(
    ("lo", "hi", "jobs", "step"), [(-1, 50_000, 2, 5000), (0, 7, 3, 2), (3, 52_001, 4, 5000)]
)
def test_the_tasks_cover_every_attempt_id_once_in_order(lo, hi, jobs, step) -> None:
    tasks = ranges(lo, hi, jobs=jobs, step=step)
    assert tasks[0][0] == lo and tasks[-1][1] == hi
    assert all(done == start for (_, done), (start, _) in zip(tasks, tasks[1:], strict=False))
    assert all(start < end <= start + step for start, end in tasks)


def test_the_last_tasks_are_quarter_batches_so_the_processes_finish_together() -> None:
    sizes = [end - start for start, end in ranges(0, 50_000, jobs=2, step=5000)]
    assert sizes == [5000] * 6 + [1250] * 16
    assert ranges(7, 7, jobs=2, step=5000) == []
