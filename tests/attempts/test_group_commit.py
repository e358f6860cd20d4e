"""Group commit (attempts.states.GroupCommit) and the writer queue, with real threads on the
suite's real database: pieces queued while a group commits share the next transaction; each
caller gets its own outcome only after the commit; a failing piece rolls back alone; a failing
group keeps nothing and tells every caller."""

import fcntl
import os
import threading
import time

import pytest
from django.db import IntegrityError, connection, connections, transaction

from attempts import ledger, states
from attempts.audit_verify import verify_django_database
from attempts.canonical import normalize_args
from attempts.models import Attempt, AttemptEvent, State
from attempts.states import Actor, GroupCommit
from tests.conftest import make_world

AGENT = Actor.agent("group-test")


def _create(key: str, *, tenant: str = "acme"):
    args = normalize_args({"key": key})

    def work():
        return states.create(
            state=State.INTENT_RECORDED,
            actor=AGENT,
            tenant_id=tenant,
            task_id="group",
            tool_name="open_ticket",
            idempotency_key=key,
            args=args.value,
            args_hash=args.args_hash,
        )

    return work


class Caller(threading.Thread):
    """A thread that runs one piece through ``group`` and keeps what it got back."""

    def __init__(self, group: GroupCommit, work) -> None:
        super().__init__(daemon=True)
        self.group, self.work = group, work
        self.value = self.error = None
        self.returned_at = None

    def run(self) -> None:
        try:
            self.value = self.group.run(self.work)
        except BaseException as exc:  # noqa: BLE001 (the test inspects it)
            self.error = exc
        finally:
            self.returned_at = time.monotonic()
            connections.close_all()


def _hold_the_group(group: GroupCommit):
    """Start a caller whose piece blocks until released, so later callers queue behind it."""
    entered, release = threading.Event(), threading.Event()

    def blocking():
        entered.set()
        assert release.wait(30)
        return _create("group:first")()

    first = Caller(group, blocking)
    first.start()
    assert entered.wait(30)
    return first, release


def _wait_queued(group: GroupCommit, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(group._queue) < n:
        assert time.monotonic() < deadline, "callers never queued"
        time.sleep(0.005)


@pytest.mark.django_db(transaction=True)
def test_pieces_queued_during_a_commit_share_the_next_one():
    make_world()
    group = GroupCommit()
    first, release = _hold_the_group(group)
    waiting = [Caller(group, _create(f"group:{n}")) for n in range(5)]
    for caller in waiting:
        caller.start()
    _wait_queued(group, 5)
    release.set()
    for caller in [first, *waiting]:
        caller.join(30)
        assert caller.error is None, caller.error
    # One group for the first piece, one for the five that queued behind it.
    assert (group.groups, group.pieces) == (2, 6)
    keys = {caller.value.idempotency_key for caller in waiting}
    assert keys == {f"group:{n}" for n in range(5)}
    assert Attempt.objects.filter(idempotency_key__in=keys).count() == 5
    assert all(caller.value.pk for caller in waiting)
    # Each attempt has its own creation event, and the chain stays one line.
    assert AttemptEvent.objects.filter(attempt__idempotency_key__in=keys).count() == 5
    assert verify_django_database().ok


@pytest.mark.django_db(transaction=True)
def test_a_failing_piece_rolls_back_alone_and_its_caller_gets_the_error():
    make_world()
    group = GroupCommit()
    first, release = _hold_the_group(group)

    def creates_then_fails():
        _create("group:doomed")()
        raise ledger.InvalidIntent("refused after writing")

    good = Caller(group, _create("group:good"))
    doomed = Caller(group, creates_then_fails)
    duplicate = Caller(group, _create("group:good"))  # same key: the unique index refuses it
    for n, caller in enumerate((good, doomed, duplicate), start=1):
        caller.start()
        _wait_queued(group, n)
    release.set()
    for caller in (first, good, doomed, duplicate):
        caller.join(30)
    assert first.error is None and good.error is None
    assert isinstance(doomed.error, ledger.InvalidIntent)
    assert isinstance(duplicate.error, IntegrityError)
    assert group.groups == 2 and group.pieces == 4
    assert Attempt.objects.filter(idempotency_key="group:good").count() == 1
    assert not Attempt.objects.filter(idempotency_key="group:doomed").exists()
    # The rolled-back piece left no event either: the chain verifies end to end.
    assert verify_django_database().ok


class Abort(BaseException):
    """Not an Exception: it must abort the whole group, as a dying thread would."""


@pytest.mark.django_db(transaction=True)
def test_an_aborted_group_keeps_nothing_and_tells_every_caller():
    make_world()
    group = GroupCommit()
    first, release = _hold_the_group(group)

    def aborts():
        raise Abort()

    callers = [Caller(group, _create("group:a")), Caller(group, aborts)]
    callers.append(Caller(group, _create("group:b")))
    for n, caller in enumerate(callers, start=1):
        caller.start()
        _wait_queued(group, n)
    release.set()
    for caller in (first, *callers):
        caller.join(30)
    assert first.error is None
    assert all(isinstance(caller.error, Abort) for caller in callers)
    assert not Attempt.objects.filter(idempotency_key__in=["group:a", "group:b"]).exists()
    assert group.pieces == 1  # only the first group committed


@pytest.mark.django_db(transaction=True)
def test_callers_are_answered_only_after_the_commit():
    make_world()
    group = GroupCommit()
    committed_at = []
    original = connections["default"].__class__._commit

    def recording_commit(self):
        original(self)
        committed_at.append(time.monotonic())

    first, release = _hold_the_group(group)
    waiting = [Caller(group, _create(f"group:late:{n}")) for n in range(3)]
    for caller in waiting:
        caller.start()
    _wait_queued(group, 3)
    connections["default"].__class__._commit = recording_commit
    try:
        release.set()
        for caller in [first, *waiting]:
            caller.join(30)
    finally:
        connections["default"].__class__._commit = original
    assert len(committed_at) == 2
    assert all(caller.returned_at >= committed_at[-1] for caller in waiting)


@pytest.mark.django_db
def test_inside_a_transaction_the_work_runs_in_it():
    make_world()
    group = GroupCommit()
    with transaction.atomic():
        attempt = group.run(_create("group:nested"))
        assert connection.in_atomic_block
    assert Attempt.objects.get(idempotency_key="group:nested").pk == attempt.pk
    assert group.groups == 0  # not grouped: the caller's own transaction carried it


@pytest.mark.django_db(transaction=True)
def test_record_intent_from_many_threads_records_each_intent_once():
    make_world()
    keys = [f"group:threads:{n}" for n in range(40)]
    results: dict[str, tuple] = {}
    errors = []

    def agent(chunk):
        try:
            for key in chunk:
                for _ in range(2):  # the second call is a replay: same attempt, not created
                    attempt, created = ledger.record_intent(
                        tenant="acme",
                        task_id="threads",
                        tool_name="open_ticket",
                        idempotency_key=key,
                        args={"key": key},
                        actor=AGENT,
                    )
                    results.setdefault(key, []).append((attempt.attempt_id, created))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(keys[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for key in keys:
        (first_id, first_created), (second_id, second_created) = results[key]
        assert first_id == second_id and first_created and not second_created
    assert Attempt.objects.filter(idempotency_key__in=keys).count() == 40


@pytest.mark.django_db(transaction=True)
def test_sqlite_writers_queue_on_a_lock_file_beside_the_database():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: PostgreSQL queues writers on its advisory lock")
    database = states.sqlite_file()
    assert database is not None
    with states.write_transaction():
        probe = os.open(database + "-writers.lock", os.O_RDWR)
        try:
            # Held by this write transaction: another description cannot take it.
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
    probe = os.open(database + "-writers.lock", os.O_RDWR)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the transaction
        fcntl.flock(probe, fcntl.LOCK_UN)
    finally:
        os.close(probe)


@pytest.mark.django_db(transaction=True)
def test_sqlite_checkpoints_run_after_the_writer_queue_is_released(monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    make_world()
    monkeypatch.setattr(states, "CHECKPOINT_EVERY", 3)
    monkeypatch.setattr(states, "_commits_since_checkpoint", 0)
    lock_path = states.sqlite_file() + "-writers.lock"
    seen = []

    def watch(execute, sql, params, many, context):
        if "wal_checkpoint" in sql:
            probe = os.open(lock_path, os.O_RDWR)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody holds it
                fcntl.flock(probe, fcntl.LOCK_UN)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
            finally:
                os.close(probe)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        for n in range(7):
            ledger.record_intent(
                tenant="acme",
                task_id="checkpoint",
                tool_name="open_ticket",
                idempotency_key=f"group:checkpoint:{n}",
                args={"n": n},
                actor=AGENT,
            )
    assert seen == ["free", "free"]  # after the 3rd and the 6th commit, outside the queue
