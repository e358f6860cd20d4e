# ruff: noqa: S608 -- the attacker writes raw SQL against constant table names
"""Protocol invariant 7: history cannot be edited, deleted, inserted, reordered, nor an attempt
deleted with its history, nor the tail cut, without ``verify_audit`` saying so and naming the
right event, attempt or checkpoint; on both sides of the sealed/unsealed boundary.

Each test plays an attacker with write access to the database: it drops the append-only triggers
(as such an attacker can) and tampers with raw SQL, then runs the real command."""

from __future__ import annotations

import gc

import pytest
from django.core.management import CommandError
from django.db import connection

from attempts import audit_verify, chain, jcs, review, verify_export
from attempts.locking import write_transaction
from attempts.models import Attempt, AttemptEvent, Checkpoint
from attempts.states import Actor
from tests.attempts.audit_helpers import (
    ATTEMPTS,
    EVENTS,
    broken,
    build_history,
    drop_triggers,
    event_row,
    fast_passwords,  # noqa: F401  (autouse)
    run_verify,
    seal_all,
    sql,
)

LEAVES = "attempts_checkpointleaf"
CHECKPOINTS = "attempts_checkpoint"
CONFIG = "attempts_configevent"


def problems(kind: str | None = None) -> list[verify_export.Problem]:
    report = audit_verify.verify_django_database()
    return [p for p in report.problems if kind is None or p.kind == kind]


def ids_of(attempt: Attempt) -> list[int]:
    return list(attempt.events.order_by("id").values_list("id", flat=True))


@pytest.fixture
def history(world):
    return build_history(world, 5)


@pytest.fixture
def sealed(history):
    seal_all()
    return history


def test_untouched_ledger_verifies_before_and_after_sealing(history):
    out = run_verify()
    assert out.startswith("OK:") and f"{AttemptEvent.objects.count()} events verify" in out
    assert "unsealed: 5 attempts" in out
    seal_all()
    out = run_verify()
    newest = Checkpoint.objects.order_by("-seq").first()
    assert newest.hash in out and "unsealed: 0 attempts" in out


def test_verifying_leaves_the_cycle_collector_as_it_found_it(history):
    """The verifier pauses the cycle collector for each batch of attempts, never for longer."""
    assert gc.isenabled()
    assert audit_verify.verify_django_database().ok
    assert gc.isenabled()
    gc.disable()
    try:
        assert audit_verify.verify_django_database().ok
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_empty_ledger_verifies(db):
    assert run_verify().startswith("OK:")


def test_every_event_links_to_its_attempts_previous_event(history):
    for attempt in history:
        prev = verify_export.GENESIS
        for event_id in ids_of(attempt):
            row = event_row(event_id)
            assert row["prev_hash"] == prev and row["v"] == verify_export.SALTED_FORMAT
            assert verify_export.event_hash(row) == row["hash"]
            prev = row["hash"]
        attempt.refresh_from_db()
        assert attempt.chain_head == prev and attempt.chain_length == len(ids_of(attempt))


@pytest.mark.parametrize("seal_first", [False, True], ids=["unsealed", "sealed"])
def test_editing_an_event_names_it(history, seal_first):
    if seal_first:
        seal_all()
    target = ids_of(history[2])[1]
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET reason = %s WHERE id = %s", ["nothing to see", target])
    message = broken()
    assert "first broken link: [content]" in message
    assert f"event {target}" in message.splitlines()[0]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("action", "attempt.dispatched"),
        ("actor", "someone-else"),
        ("actor_kind", "person"),
        ("from_state", "INTENT_RECORDED"),
        ("to_state", "OUTCOME_CONFIRMED"),
        ("details", '{"provider_request_id": "req-forged"}'),
        ("details", "{}"),
        ("created_at", "2020-01-01 00:00:00+00:00"),
    ],
)
def test_editing_an_event_without_free_text_names_it(history, column, value):
    """The events most of a ledger is made of (no reason, only public details, the attempt's
    one digest of no text) have a shorter path to their hash: an edit of any of their fields is
    still an edited event."""
    target = ids_of(history[0])[2]  # the provider request id attached
    row = event_row(target)
    assert row["reason"] == "" and row["details"] == {"provider_request_id": "req-k-0"}
    assert row["text_digest"] == verify_export.salted_digest(
        row["salt"], {"details": {}, "reason": ""}
    )
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET {column} = %s WHERE id = %s", [value, target])
    found = problems("content")
    assert [p.event_id for p in found] == [target]


def test_editing_the_private_details_of_an_event_without_a_reason_names_it(history):
    """A creation event has no reason but private details (the args hash), committed by its
    text digest: editing them is an edited event, on the short path as on the general one."""
    target = ids_of(history[0])[0]
    row = event_row(target)
    assert row["reason"] == "" and row["action"] == "attempt.created"
    assert "args_hash" in row["details"]
    drop_triggers()
    forged = {**row["details"], "args_hash": "0" * 64}
    sql(f"UPDATE {EVENTS} SET details = %s WHERE id = %s", [jcs.dumps(forged).decode(), target])
    found = problems("content")
    assert [p.event_id for p in found] == [target]


def test_details_that_are_not_json_are_an_edited_event(history):
    """SQLite keeps details as text (JSON by a CHECK constraint, which whoever edits the file
    can turn off): text that is not JSON is an edited event (on the short path's way to the
    general one), not a crash of the verifier."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb column holds only JSON")
    target = ids_of(history[0])[2]
    drop_triggers()
    sql("PRAGMA ignore_check_constraints = ON")  # as someone editing the file would
    sql(f"UPDATE {EVENTS} SET details = %s WHERE id = %s", ['{"provider_request_id" "x"}', target])
    sql("PRAGMA ignore_check_constraints = OFF")
    found = problems("content")
    assert [p.event_id for p in found] == [target]
    assert "cannot be hashed" in found[0].message


def test_editing_and_rehashing_an_event_names_the_next_one(history):
    events = ids_of(history[0])
    drop_triggers()
    row = event_row(events[1])
    row["actor"] = "someone-else"
    sql(
        f"UPDATE {EVENTS} SET actor = %s, hash = %s WHERE id = %s",
        ["someone-else", verify_export.event_hash(row), events[1]],
    )
    link = problems("link")
    assert link and link[0].event_id == events[2]


def test_an_event_that_cannot_be_hashed_is_reported_whatever_its_hash_says(history):
    """An event whose details no encoder can hash (a number JSON cannot carry exactly) is edited
    history, even when its hash column was set to the verifier's own words for such an event."""
    victim = history[1]
    last = ids_of(victim)[-1]
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET details = %s WHERE id = %s", ['{"count": 1e400}', last])
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT details FROM {EVENTS} WHERE id = %s", [last])
        (text,) = cursor.fetchone()
    with pytest.raises(jcs.CanonicalizationError) as error:
        jcs.dumps(audit_verify.load_json(text))
    forged = f"unhashable ({error.value})"
    if len(forged) <= 64:  # on PostgreSQL the hash column holds 64 characters, not these words
        sql(f"UPDATE {EVENTS} SET hash = %s WHERE id = %s", [forged, last])
        sql(f"UPDATE {ATTEMPTS} SET chain_head = %s WHERE id = %s", [forged, victim.pk])
    found = problems()
    assert [(p.kind, p.event_id) for p in found] == [("content", last)]
    assert "cannot be hashed" in found[0].message


def _rewrite_tail(attempt: Attempt, position: int, *, actor: str) -> None:
    """Rewrite the attempt's event at ``position`` and re-hash every event after it, fixing the
    attempt row too: internally consistent, as a careful attacker leaves it."""
    prev = None
    for index, event_id in enumerate(ids_of(attempt)):
        row = event_row(event_id)
        if index < position:
            prev = row["hash"]
            continue
        if index == position:
            row["actor"] = actor
        row["prev_hash"] = prev
        row["hash"] = verify_export.event_hash(row)
        sql(
            f"UPDATE {EVENTS} SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [row["actor"], row["prev_hash"], row["hash"], event_id],
        )
        prev = row["hash"]
    sql(f"UPDATE {ATTEMPTS} SET chain_head = %s WHERE id = %s", [prev, attempt.pk])


def test_rewriting_sealed_history_consistently_is_seen_at_the_seal(sealed):
    victim = sealed[3]
    drop_triggers()
    _rewrite_tail(victim, 1, actor="forger")
    found = problems()
    assert [p.kind for p in found] == ["seal"]
    assert found[0].attempt_id == victim.attempt_id and "rewritten" in found[0].message


def test_rewriting_unsealed_history_consistently_is_the_window(history):
    """Before its seal, a careful rewrite of an attempt's own history is not detectable: that is
    the unsealed window, which verify_audit reports and --max-unsealed-seconds bounds."""
    victim = history[3]
    drop_triggers()
    _rewrite_tail(victim, 1, actor="forger")
    out = run_verify()
    assert out.startswith("OK:") and "unsealed: 5 attempts" in out
    assert "[window]" in broken("--max-unsealed-seconds", "0")


def test_deleting_an_event_names_the_gap(sealed):
    events = ids_of(sealed[1])
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [events[2]])
    message = broken()
    first = message.splitlines()[0]
    assert "[link]" in first and f"event {events[3]}" in first


def test_deleting_the_first_event_is_seen(history):
    events = ids_of(history[0])
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [events[0]])
    found = problems()
    assert found[0].kind == "link" and found[0].event_id == events[1]
    assert any("creation event was deleted" in p.message for p in found)


def test_inserting_a_forged_event_is_seen(sealed):
    victim = sealed[0]
    events = ids_of(victim)
    drop_triggers()
    base = event_row(events[1])
    forged = dict(base, action="attempt.note", reason="approved by the CFO", details={})
    forged["prev_hash"] = base["hash"]
    forged["hash"] = verify_export.event_hash(forged)
    # Squeeze it in between events 1 and 2 of the attempt by moving the later ones up.
    top = AttemptEvent.objects.order_by("-id").values_list("id", flat=True).first()
    for event_id in reversed(events[2:]):
        sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [event_id + top, event_id])
    sql(
        f"INSERT INTO {EVENTS} (id, attempt_id, action, actor_kind, actor, from_state, to_state, "
        "reason, details, created_at, prev_hash, hash, chain_format) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            events[2] + top - 1,
            victim.pk,
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
            2,
        ],
    )
    link = problems("link")
    assert link and link[0].event_id == events[2] + top


def test_reordering_two_events_of_an_attempt_is_seen(history):
    events = ids_of(history[2])
    a, b = events[1], events[2]
    drop_triggers()
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [-1, a])
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [a, b])
    sql(f"UPDATE {EVENTS} SET id = %s WHERE id = %s", [b, -1])
    link = problems("link")
    assert link and link[0].event_id == a


def test_deleting_a_sealed_attempt_with_its_history_is_seen(sealed):
    victim = sealed[1]
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [victim.pk])
    sql(f"DELETE FROM {ATTEMPTS} WHERE id = %s", [victim.pk])
    message = broken()
    assert "[missing]" in message and victim.attempt_id in message


def test_cutting_a_sealed_tail_is_seen(sealed):
    victim = sealed[0]
    events = ids_of(victim)
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE id = %s", [events[-1]])
    previous = AttemptEvent.objects.get(id=events[-2])
    sql(
        f"UPDATE {ATTEMPTS} SET state = %s, chain_head = %s, chain_length = chain_length - 1 "
        "WHERE id = %s",
        [previous.to_state, previous.hash, victim.pk],
    )
    seal = problems("seal")
    assert len(seal) == 1 and "were deleted" in seal[0].message
    assert seal[0].attempt_id == victim.attempt_id


def test_cutting_the_newest_checkpoint_and_what_it_sealed_needs_the_kept_hash(sealed, world):
    kept = Checkpoint.objects.order_by("-seq").first()
    # New work, sealed into a second checkpoint whose hash the auditor keeps.
    extra = build_history(world, 1, prefix="late")[0]
    seal_all()
    newest = Checkpoint.objects.order_by("-seq").first()
    assert newest.seq == kept.seq + 1
    assert run_verify("--expect-head", newest.hash).startswith("OK:")
    drop_triggers()
    # The log's rows of the cut checkpoint go too: its leaves' places, the hashes they
    # completed, its signatures.
    sql(
        "DELETE FROM attempts_logentry WHERE leaf_id IN "
        f"(SELECT id FROM {LEAVES} WHERE checkpoint_id = %s)",
        [newest.pk],
    )
    sql(
        'DELETE FROM attempts_lognode WHERE ("index" + 1) * (1 << level) > %s',
        [kept.size],
    )
    sql("DELETE FROM attempts_checkpointsignature WHERE checkpoint_id = %s", [newest.pk])
    sql(f"DELETE FROM {LEAVES} WHERE checkpoint_id = %s", [newest.pk])
    sql(f"DELETE FROM {CHECKPOINTS} WHERE id = %s", [newest.pk])
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [extra.pk])
    sql(f"DELETE FROM {ATTEMPTS} WHERE id = %s", [extra.pk])
    assert run_verify().startswith("OK:")  # the database alone cannot know
    message = broken("--expect-head", newest.hash)
    assert "[anchor]" in message and newest.hash in message
    assert run_verify("--expect-head", kept.hash).startswith("OK:")


def test_editing_a_checkpoint_or_a_leaf_is_seen(sealed):
    checkpoint = Checkpoint.objects.order_by("seq").first()
    drop_triggers()
    sql(
        f"UPDATE {LEAVES} SET length = length + 1 WHERE checkpoint_id = %s AND position = 0",
        [checkpoint.pk],
    )
    kinds = {p.kind for p in problems()}
    assert kinds & {"checkpoint", "log"}  # format 2: the log's root no longer matches


def test_moving_a_logged_leaf_out_of_its_place_is_seen(sealed):
    """A logged checkpoint's leaves are hashed by the log in the log's order; their places in
    the checkpoint are checked apart (by the database, which returns only misplaced leaves)."""
    checkpoint = Checkpoint.objects.order_by("seq").first()
    assert checkpoint.format >= verify_export.LOG_FORMAT
    drop_triggers()
    sql(
        f"UPDATE {LEAVES} SET position = 1000 WHERE checkpoint_id = %s AND position = 0",
        [checkpoint.pk],
    )
    messages = [p.message for p in problems("checkpoint")]
    assert f"checkpoint {checkpoint.seq}: leaf 1000 is out of place" in messages
    assert f"checkpoint {checkpoint.seq}: leaf 1 is out of place" in messages


def test_rehashing_a_checkpoint_breaks_the_next_ones_link(sealed, world):
    build_history(world, 1, prefix="more")
    seal_all()
    first = Checkpoint.objects.order_by("seq").first()
    drop_triggers()
    sql(f"UPDATE {CHECKPOINTS} SET hash = %s WHERE id = %s", ["f" * 64, first.pk])
    messages = [p.message for p in problems("checkpoint")]
    assert any("checkpoint 1: its fields do not match" in m for m in messages)
    assert any("checkpoint 2: its prev_hash" in m for m in messages)


def test_marking_an_attempt_sealed_to_hide_it_from_the_sealer_is_seen(sealed, world):
    victim = sealed[1]
    victim.refresh_from_db()

    review.add_note(victim, user=world.admin, text="after the seal")
    sql(f"UPDATE {ATTEMPTS} SET sealed = %s WHERE id = %s", [True, victim.pk])
    assert any(p.kind == "seal" and p.attempt_id == victim.attempt_id for p in problems())


def _tool_made_uncritical():
    """A configuration change, recorded as the config paths record one (inside a write)."""
    return chain.record_config_change(
        subject="tool:update_crm",
        action="config.tool.changed",
        actor=Actor.system("test"),
        before={"critical": True},
        after={"critical": False},
    )


def test_config_changes_are_chained_sealed_and_verified(history):
    with write_transaction():
        first = _tool_made_uncritical()
        chain.record_config_change(
            subject="tenant:acme",
            action="config.tenant.created",
            actor=Actor.system("test"),
            before=None,
            after={"name": "Acme"},
        )
    seal_all()
    assert Checkpoint.objects.order_by("-seq").first().config_length == first.seq + 1
    assert run_verify().startswith("OK:")
    drop_triggers()
    sql(f"UPDATE {CONFIG} SET after = %s WHERE id = %s", ['{"critical": true}', first.pk])
    assert any(f"config change {first.seq}" in p.message for p in problems("config"))


def test_a_config_change_that_cannot_be_hashed_is_reported_whatever_its_hash_says(history):
    with write_transaction():
        change = _tool_made_uncritical()
    drop_triggers()
    sql(f"UPDATE {CONFIG} SET after = %s WHERE id = %s", ['{"n": 1e400}', change.pk])
    with pytest.raises(jcs.CanonicalizationError) as error:
        jcs.dumps(audit_verify.load_json('{"n": 1e400}'))
    if connection.vendor == "sqlite":  # PostgreSQL's numeric keeps 1e400 exact, and its hash
        # column holds 64 characters, not the verifier's words
        forged = f"unhashable ({error.value})"
        sql(f"UPDATE {CONFIG} SET hash = %s WHERE id = %s", [forged, change.pk])
    found = problems("config")
    assert found and f"config change {change.seq}" in found[0].message
    assert "cannot be hashed" in found[0].message


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
        ("args_salt", "0" * 64, "not the text its hash committed to"),
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


def test_pointing_an_attempt_at_a_parent_its_history_never_named_is_seen(history):
    target, other = history[0], history[1]
    sql(f"UPDATE {ATTEMPTS} SET parent_id = %s WHERE id = %s", [other.pk, target.pk])
    message = broken()
    assert f"attempt {target.attempt_id}" in message
    assert f"parent_attempt_id is {other.attempt_id!r}" in message


def test_an_attempt_without_history_is_seen(history):
    target = history[2]
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [target.pk])
    assert any(
        p.attempt_id == target.attempt_id and "has no history" in p.message for p in problems()
    )


def test_bad_arguments_are_clear_errors(db, tmp_path):
    with pytest.raises(CommandError, match="64-digit hex"):
        run_verify("--expect-head", "abc")
    with pytest.raises(CommandError, match="no such file"):
        run_verify("--export", str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match="no such file"):
        run_verify("--sqlite", str(tmp_path / "missing.sqlite3"))
    with pytest.raises(CommandError, match="must not be negative"):
        run_verify("--max-unsealed-seconds", "-1")


@pytest.mark.parametrize("table", [EVENTS, CONFIG, CHECKPOINTS, LEAVES])
def test_history_tables_are_append_only_in_the_database(sealed, table):
    """The triggers (which an attacker must drop first) refuse UPDATE and DELETE."""
    from django.db import DatabaseError, transaction

    with write_transaction():
        chain.record_config_change(
            subject="tenant:acme",
            action="config.tenant.changed",
            actor=Actor.system("t"),
            before={},
            after={},
        )
    for statement in (f"UPDATE {table} SET id = id WHERE 1 = 1", f"DELETE FROM {table}"):
        with pytest.raises(DatabaseError, match="append-only"):
            with transaction.atomic():
                sql(statement)
    assert run_verify().startswith("OK:")


# ---------------------------------------------------------------------------------------------
# Erased text is proven erased by the four-eyes erasure in the attempt's history


def _erase_by_update(event_id: int) -> None:
    """One plain UPDATE that writes what an erasure writes, and that the append-only guard lets
    through for that reason: the marker as the reason, the public details kept."""
    event = AttemptEvent.objects.get(pk=event_id)
    public, _ = verify_export.split_details(event.details)
    sql(
        f"UPDATE {EVENTS} SET reason = %s, details = %s WHERE id = %s",
        [verify_export.ERASED_TEXT, jcs.dumps(public).decode(), event_id],
    )


def test_the_erasure_marker_without_an_erasure_is_an_edited_event(sealed, tmp_path):
    from tests.attempts.test_audit_export import export, offline

    victim = sealed[1]  # UNKNOWN, with the reason "timeout"
    event = victim.events.get(reason="timeout")
    assert event.chain_format >= verify_export.SALTED_FORMAT
    _erase_by_update(event.pk)  # the guard stays installed: it allows this update
    assert AttemptEvent.objects.get(pk=event.pk).reason == verify_export.ERASED_TEXT
    message = broken()
    assert "[content]" in message and f"event {event.pk}" in message
    assert "no four-eyes erasure" in message
    result = offline(export(tmp_path))
    assert result.returncode == 1, result.stdout
    assert "[content]" in result.stdout and "no four-eyes erasure" in result.stdout
    assert victim.attempt_id in result.stdout


def test_an_erasure_event_must_be_four_eyes():
    proof = verify_export.ErasureProof()
    erased = {"id": 1, "v": 3, "action": "attempt.noted", "reason": "[erased]", "details": {}}
    assert proof.event("a", erased, None) == []
    alone = {
        "id": 2,
        "v": 3,
        "action": verify_export.ERASURE_ACTION,
        "actor_kind": "user",
        "actor": "ann",
        "reason": "DSR-1",
        "details": {"erasure": {"requested_by": "ann", "approved_by": "ann"}},
    }
    (problem,) = proof.event("a", alone, None)
    assert problem.kind == "erasure" and "not four eyes" in problem.message
    assert [p.event_id for p in proof.finish()] == [1]  # an invalid erasure proves nothing
    proof.event("a", erased, None)
    four_eyes = {**alone, "details": {"erasure": {"requested_by": "bob", "approved_by": "ann"}}}
    assert proof.event("a", four_eyes, None) == [] and proof.finish() == []


# ---------------------------------------------------------------------------------------------
# A sealed attempt deleted with its history is missing offline too


def test_a_sealed_attempt_deleted_with_its_history_is_missing_from_a_whole_export(sealed, tmp_path):
    from tests.attempts.test_audit_export import export, offline

    victim = sealed[1]
    drop_triggers()
    sql(f"DELETE FROM {EVENTS} WHERE attempt_id = %s", [victim.pk])
    sql(f"DELETE FROM {ATTEMPTS} WHERE id = %s", [victim.pk])
    assert "[missing]" in broken()  # the database check
    result = offline(export(tmp_path))  # the auditor's, on an export of everything
    assert result.returncode == 1, result.stdout
    assert "[missing]" in result.stdout and victim.attempt_id in result.stdout
