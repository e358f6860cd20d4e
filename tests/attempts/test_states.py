"""Protocol section 3: the legal moves and nothing else, each a compare-and-set with one event;
history is append-only at the database level."""

import datetime as dt
import time

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from attempts import ledger, states
from attempts.locking import write_transaction
from attempts.models import APPROVAL_ACTION, ApprovalPolicy, Attempt, AttemptEvent, State
from attempts.states import LEGAL_MOVES, IllegalMove, StaleAttempt
from tests.conftest import agent_intent

S = State
PROTOCOL_MOVES = {
    (S.INTENT_RECORDED, S.DISPATCHED),
    (S.INTENT_RECORDED, S.FAILED),
    (S.INTENT_RECORDED, S.RECONCILED),
    (S.DISPATCHED, S.OUTCOME_CONFIRMED),
    (S.DISPATCHED, S.FAILED_RETRYABLE),
    (S.DISPATCHED, S.FAILED),
    (S.DISPATCHED, S.UNKNOWN),
    (S.DISPATCHED, S.MANUAL_REVIEW),
    (S.FAILED_RETRYABLE, S.DISPATCHED),
    (S.FAILED_RETRYABLE, S.FAILED),
    # Section 6: unsent work that may not be sent again goes to a person, never a silent FAILED;
    # an attempt whose handling raised is quarantined for review, from any state recovery takes.
    (S.FAILED_RETRYABLE, S.MANUAL_REVIEW),
    (S.INTENT_RECORDED, S.MANUAL_REVIEW),
    (S.UNKNOWN, S.OUTCOME_CONFIRMED),
    (S.UNKNOWN, S.DISPATCHED),
    (S.UNKNOWN, S.FAILED),
    (S.UNKNOWN, S.MANUAL_REVIEW),
    (S.UNKNOWN, S.RECONCILED),
    (S.MANUAL_REVIEW, S.OUTCOME_CONFIRMED),
    (S.MANUAL_REVIEW, S.FAILED),
    (S.MANUAL_REVIEW, S.RECONCILED),
    (S.MANUAL_REVIEW, S.INTENT_RECORDED),
    # Section 11: approval before dispatch. An approved intent whose approvals became void before
    # the claim waits again (INTENT_RECORDED -> AWAITING_APPROVAL: "waits again").
    (S.AWAITING_APPROVAL, S.INTENT_RECORDED),
    (S.AWAITING_APPROVAL, S.FAILED),
    (S.AWAITING_APPROVAL, S.RECONCILED),
    (S.INTENT_RECORDED, S.AWAITING_APPROVAL),
}


def test_the_table_is_exactly_the_protocols():
    table = {(a, b) for a, targets in LEGAL_MOVES.items() for b in targets}
    assert table == PROTOCOL_MOVES
    assert set(LEGAL_MOVES) == set(State.values)
    for terminal in (S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED):
        assert LEGAL_MOVES[terminal] == frozenset()


def _intent(world, key="k-1", *, held=False):
    if held:
        ApprovalPolicy.objects.get_or_create(
            name="big-crm-updates", tool_id="update_crm", defaults={"condition": "args.id > 90"}
        )
    attempt, _ = agent_intent(
        world, key, tool="update_crm", args={"id": 99 if held else 7}, task="task-1"
    )
    if held:
        assert attempt.state == S.AWAITING_APPROVAL
        policy = ApprovalPolicy.objects.get(name="big-crm-updates")
        valid_until = timezone.now() + dt.timedelta(hours=1)
        details = {
            "kind": "held",
            "args_hash": attempt.args_hash,
            "policy_version": policy.version,
            "valid_until": valid_until.isoformat(),
        }
        _reviewer_approves(world, attempt, details)
    return attempt


def _reviewer_approves(world, attempt, details: dict | None = None):
    """A reviewer's approval: its event in the attempt's chain (a row alone counts for
    nothing). Of a held intent with ``details``, else of an attempt in review (a linked retry
    or linked attempt)."""
    with write_transaction():
        states.move(
            attempt,
            None,
            action=APPROVAL_ACTION,
            actor=states.Actor.user(world.reviewer),
            details=details or {"kind": "linked_retry"},
        )


def _start(world, from_state, to_state):
    """An attempt in ``from_state``; one an approval policy held (and approved once) when the
    move leaves or enters AWAITING_APPROVAL."""
    held = S.AWAITING_APPROVAL in (from_state, to_state)
    attempt = _intent(world, held=held)
    if held and from_state != S.AWAITING_APPROVAL:
        with write_transaction():
            states.move(attempt, S.INTENT_RECORDED, actor=states.Actor.system())
    return _force_state(attempt, from_state)


def _force_state(attempt, target):
    """Walk an attempt to ``target`` through legal moves only."""
    paths = {
        S.INTENT_RECORDED: [],
        S.AWAITING_APPROVAL: [],
        S.DISPATCHED: [S.DISPATCHED],
        S.UNKNOWN: [S.DISPATCHED, S.UNKNOWN],
        S.FAILED_RETRYABLE: [S.DISPATCHED, S.FAILED_RETRYABLE],
        S.MANUAL_REVIEW: [S.DISPATCHED, S.MANUAL_REVIEW],
        S.OUTCOME_CONFIRMED: [S.DISPATCHED, S.OUTCOME_CONFIRMED],
        S.FAILED: [S.FAILED],
        S.RECONCILED: [S.RECONCILED],
    }
    for step in paths[target]:
        with write_transaction():
            states.move(attempt, step, actor=states.Actor.system())
    return attempt


# Every pair of states the protocol does not move between (a legal move is not a case here,
# so no case passes without checking anything).
ILLEGAL_MOVES = [
    (from_state, to_state)
    for from_state in State
    for to_state in State
    if (from_state, to_state) not in PROTOCOL_MOVES and from_state != to_state
]


@pytest.mark.parametrize(
    ("from_state", "to_state"), ILLEGAL_MOVES, ids=[f"{f}-{t}" for f, t in ILLEGAL_MOVES]
)
def test_every_illegal_move_is_refused_and_changes_nothing(world, from_state, to_state):
    attempt = _start(world, from_state, to_state)
    before = Attempt.objects.values().get(pk=attempt.pk)
    events = AttemptEvent.objects.count()
    with pytest.raises(IllegalMove) as exc:
        with write_transaction():
            states.move(attempt, to_state, actor=states.Actor.system())
    assert from_state in str(exc.value) and to_state in str(exc.value)
    assert Attempt.objects.values().get(pk=attempt.pk) == before
    assert AttemptEvent.objects.count() == events


@pytest.mark.parametrize(("from_state", "to_state"), sorted(PROTOCOL_MOVES))
def test_every_legal_move_writes_one_event_and_bumps_the_version(world, from_state, to_state):
    attempt = _start(world, from_state, to_state)
    if (from_state, to_state) in states.REVIEW_APPROVED_MOVES:
        _reviewer_approves(world, attempt)
    version = attempt.version
    events = AttemptEvent.objects.filter(attempt=attempt).count()
    with write_transaction():
        states.move(attempt, to_state, actor=states.Actor.system(), reason="test")
    stored = Attempt.objects.get(pk=attempt.pk)
    assert stored.state == to_state
    assert stored.version == version + 1
    assert AttemptEvent.objects.filter(attempt=attempt).count() == events + 1
    last = AttemptEvent.objects.filter(attempt=attempt).last()
    assert (last.from_state, last.to_state, last.reason) == (from_state, to_state, "test")


def test_compare_and_set_refuses_a_stale_copy(world):
    attempt = _intent(world)
    stale = Attempt.objects.get(pk=attempt.pk)
    with write_transaction():
        states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
    with pytest.raises(StaleAttempt):
        with write_transaction():
            states.move(stale, S.FAILED, actor=states.Actor.system())
    assert Attempt.objects.get(pk=attempt.pk).state == S.DISPATCHED


def test_entering_attention_states_assigns_an_owner(world):
    attempt = _force_state(_intent(world), S.UNKNOWN)
    assert attempt.owner == world.triage
    other = _force_state(_intent(world, "k-2"), S.MANUAL_REVIEW)
    assert Attempt.objects.get(pk=other.pk).owner_id == world.triage.pk


def test_state_cannot_be_set_through_fields(world):
    attempt = _intent(world)
    with pytest.raises(states.TransitionError):
        with write_transaction():
            states.move(attempt, None, actor=states.Actor.system(), fields={"state": S.FAILED})


@pytest.mark.django_db(transaction=True)
def test_a_move_alone_commits_its_row_and_its_event_together():
    """No transaction around it: the move is atomic on its own (one statement on PostgreSQL,
    a transaction of its own on SQLite), and a stale one writes nothing at all."""
    from tests.conftest import make_world

    attempt = _intent(make_world())
    assert not connection.in_atomic_block
    stale = Attempt.objects.get(pk=attempt.pk)
    states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
    stored = Attempt.objects.get(pk=attempt.pk)
    assert (stored.state, stored.version, stored.chain_length) == (S.DISPATCHED, 2, 2)
    assert stored.events.count() == 2
    assert stored.chain_head == stored.events.order_by("-id").first().hash
    with pytest.raises(StaleAttempt):
        states.move(stale, S.FAILED, actor=states.Actor.system())
    assert Attempt.objects.get(pk=attempt.pk).version == 2
    assert AttemptEvent.objects.filter(attempt=attempt).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_move_whose_event_cannot_be_written_changes_nothing():
    """The row's compare-and-set and its event commit together or not at all, outside any
    transaction too: an event the database refuses leaves the attempt as it was, and the
    connection goes on working."""
    from attempts import rows
    from tests.conftest import make_world

    attempt = _intent(make_world())
    assert not connection.in_atomic_block
    good = states.chain.attempt_event(
        attempt,
        action="attempt.updated",
        actor=states.Actor.system(),
        from_state=S.INTENT_RECORDED,
        to_state=S.INTENT_RECORDED,
        reason="",
        details={},
        now=attempt.created_at,
    )
    refused = good._replace(action=None)  # NOT NULL
    with pytest.raises(IntegrityError):
        rows.compare_and_set(
            attempt.pk,
            state=S.INTENT_RECORDED,
            version=1,
            values={"chain_head": refused.hash, "result_ref": "half-written"},
            increments={"version": 1, "chain_length": 1},
            event=refused,
        )
    stored = Attempt.objects.get(pk=attempt.pk)
    assert (stored.version, stored.result_ref, stored.chain_length) == (1, "", 1)
    assert stored.events.count() == 1
    states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
    assert Attempt.objects.get(pk=attempt.pk).version == 2


@pytest.mark.django_db(transaction=True)
def test_a_move_waiting_for_sqlites_write_lock_gives_up_with_ledger_busy():
    """SQLite: another writer holds the database; a move waits the busy timeout, then raises
    LedgerBusy with nothing written, and works once the other writer is done."""
    import sqlite3

    from attempts.locking import LedgerBusy
    from tests.conftest import make_world

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one write lock (PostgreSQL: test_scale_out's held transaction)")
    attempt = _intent(make_world())
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout = 200")
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(LedgerBusy, match="busy"):
            states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
        other.execute("ROLLBACK")
        assert Attempt.objects.get(pk=attempt.pk).version == 1
        states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
        assert Attempt.objects.get(pk=attempt.pk).state == S.DISPATCHED
    finally:
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 30000")


@pytest.mark.django_db(transaction=True)
def test_a_move_waits_for_sqlites_write_lock_and_keeps_the_busy_timeout():
    """SQLite: a move that finds another writer holding the database tries again until that
    writer is done, then commits; the connection's busy timeout is as it was afterwards."""
    import sqlite3
    import threading

    from tests.conftest import make_world

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one write lock")
    attempt = _intent(make_world())
    other = sqlite3.connect(
        connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False
    )
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        (before,) = cursor.fetchone()
    try:
        other.execute("BEGIN IMMEDIATE")
        released = threading.Event()

        def release() -> None:
            time.sleep(0.3)
            released.set()
            other.execute("COMMIT")

        releaser = threading.Thread(target=release)
        releaser.start()
        states.move(attempt, S.DISPATCHED, actor=states.Actor.system())
        assert released.is_set()  # it waited for the other writer, and did not fail
        releaser.join()
    finally:
        other.close()
    assert Attempt.objects.get(pk=attempt.pk).state == S.DISPATCHED
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone() == (before,)


@pytest.mark.django_db(transaction=True)
def test_moves_in_a_write_transaction_commit_or_roll_back_together():
    from tests.conftest import make_world

    world = make_world()
    first, second = _intent(world, "k-1"), _intent(world, "k-2")
    with pytest.raises(RuntimeError), write_transaction():
        states.move(first, S.DISPATCHED, actor=states.Actor.system())
        states.move(second, S.DISPATCHED, actor=states.Actor.system())
        raise RuntimeError("the caller fails after both moves")
    for attempt in (first, second):
        stored = Attempt.objects.get(pk=attempt.pk)
        assert (stored.state, stored.version, stored.events.count()) == (S.INTENT_RECORDED, 1, 1)


def test_history_refuses_update_and_delete_in_the_database(world):
    _intent(world)
    table = AttemptEvent._meta.db_table
    for sql in (f"UPDATE {table} SET reason = 'edited'", f"DELETE FROM {table}"):  # noqa: S608
        with pytest.raises((DatabaseError, IntegrityError)) as exc:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql)
        assert "append-only" in str(exc.value)
    assert AttemptEvent.objects.filter(reason="edited").count() == 0
    assert AttemptEvent.objects.count() == 1


def test_each_attempt_has_its_own_chain(world):
    first = _intent(world)
    second = agent_intent(world, "chain:second", tool="open_ticket", args={"n": 2}, task="t-2")[0]
    _force_state(first, S.UNKNOWN)  # interleaved with the second attempt's events
    ledger.claim_dispatch(second, actor=world.agent)
    for attempt in (first, second):
        attempt.refresh_from_db()
        events = list(attempt.events.order_by("id"))
        assert events[0].prev_hash == "0" * 64
        for before, after in zip(events, events[1:], strict=False):
            assert after.prev_hash == before.hash
        assert (attempt.chain_head, attempt.chain_length) == (events[-1].hash, len(events))
        assert not attempt.sealed


def test_the_write_path_takes_no_ledger_wide_lock(world):
    """No advisory lock, no table lock: a move locks its own attempt row and nothing else."""
    from django.test.utils import CaptureQueriesContext

    attempt = _intent(world)
    with CaptureQueriesContext(connection) as queries:
        ledger.claim_dispatch(attempt, actor=world.agent)
        ledger.attach_provider_request(attempt, "req-1", actor=world.agent)
        ledger.confirm(attempt, result_ref="r-1", actor=world.agent)
    statements = " ".join(q["sql"].lower() for q in queries.captured_queries)
    assert "advisory" not in statements and "lock table" not in statements


def test_postgresql_prepares_the_write_path_once_per_connection(world):
    """Server-side binding with prepared statements: after a few tool calls the connection
    executes the intent's and the move's statements without parsing and planning them again."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    for number in range(7):
        attempt = _intent(world, f"k-{number}")
        ledger.claim_dispatch(attempt, actor=world.agent)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    # The intent: the grant's terms still as guessed, its key in the permanent index, the
    # attempt and its first event, one statement; the grant is read once, not once an intent.
    assert any(text.startswith("WITH ok AS (SELECT 1 WHERE EXISTS") for text in prepared), prepared
    assert not any('"policy_version", g."allowed_scopes"' in text for text in prepared), prepared
    assert any(text.startswith("WITH moved AS (UPDATE") for text in prepared), prepared
