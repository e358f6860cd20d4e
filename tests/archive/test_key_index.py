"""Protocol section 7, invariant 11: a key takes effect at most once for the life of the ledger.
The permanent key index (``RecordedKey``) outlives archiving, is carried into a restore's
scratch database without duplicates, decides races between processes, and is filled for a
ledger that existed before it (issue 39, item 7)."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest
from django.core.management import call_command
from django.db import connection

from attempts import history_guard, ledger
from attempts.models import (
    ArchivedAttempt,
    Attempt,
    ProviderEffect,
    RecordedKey,
    RetentionRule,
    State,
    key_digest,
)
from tests.archive.conftest import AGENT, age, key_file, make  # noqa: F401 (a fixture)
from tests.archive.test_retention import _run
from tests.attempts.audit_helpers import seal_all
from tests.attempts.racers import CHARGE, race
from tests.conftest import PYTHON, REPO, agent_intent, child_env, make_world


def _replay(key: str, **changes) -> tuple[Attempt, bool]:
    """``make``'s intent for ``key`` again (the same arguments unless ``changes``)."""
    args = {"customer": key, "email": f"{key}@example.test", **changes}
    return ledger.record_intent(
        tenant="acme",
        task_id=f"task-{key}",
        tool_name="update_crm",
        idempotency_key=key,
        args=args,
        actor=AGENT,
    )


def test_a_replay_after_archiving_is_the_archived_outcome_and_other_args_conflict(
    ledger_with_rules, tmp_path
):
    result = _run(tmp_path)
    first = ledger_with_rules.due[0]
    attempt, created = _replay(first.idempotency_key)
    assert not created and attempt.pk is None
    assert attempt.archived.archive.name == result.name
    assert (attempt.attempt_id, attempt.state) == (first.attempt_id, State.OUTCOME_CONFIRMED)
    assert attempt.result_ref == first.result_ref
    assert ledger.claim_dispatch(attempt, actor=AGENT) == (attempt, False)
    with pytest.raises(ledger.IdempotencyConflict):
        _replay(first.idempotency_key, customer="someone else")
    assert not Attempt.objects.filter(idempotency_key=first.idempotency_key).exists()


def test_a_restore_carries_the_index_into_the_scratch_database_once(ledger_with_rules, tmp_path):
    _run(tmp_path)
    scratch = tmp_path / "scratch.sqlite3"
    root = str(tmp_path / "archives")
    for _ in range(2):  # a second restore finds every row there and adds none
        call_command("archive", "restore", "--from", root, "--into-sqlite", str(scratch))
    due = {a.attempt_id: a for a in ledger_with_rules.due}
    with sqlite3.connect(scratch) as db:
        keys = db.execute("SELECT key_digest, attempt_id, args_hash FROM attempts_recordedkey")
        assert sorted(keys) == sorted(
            (key_digest(a.idempotency_key), a.attempt_id, a.args_hash) for a in due.values()
        )
        effects = db.execute("SELECT provider_request_id, attempt_id FROM attempts_providereffect")
        assert sorted(effects) == sorted(
            (a.provider_request_id, a.attempt_id) for a in due.values()
        )
    # In the scratch database a replay of a restored key is answered by its restored attempt.
    first = ledger_with_rules.due[0]
    env = child_env()
    env.pop("DATABASE_URL", None)
    env["LEDGERWEB_SQLITE_PATH"] = str(scratch)
    script = (
        "from tests.archive.test_key_index import _replay; "
        f"a, c = _replay({first.idempotency_key!r}); print(a.attempt_id, a.pk is not None, c)"
    )
    shown = subprocess.run(
        [PYTHON, "manage.py", "shell", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert shown.stdout.split()[-3:] == [first.attempt_id, "True", "False"]
    # The ledger itself still refuses to record the key again.
    assert _replay(first.idempotency_key)[0].archived is not None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("key_file")
def test_processes_racing_on_an_archived_key_all_get_its_outcome(tmp_path):
    """Four processes record the key of an archived attempt at the same instant: none records
    it anew, none claims it (the index's primary key decides, not a read before the write)."""
    world = make_world()
    key = "charge:acme:archived-race"
    attempt, _ = agent_intent(world, key, tool="charge_card", args=CHARGE, task="race")
    attempt, _ = ledger.claim_dispatch(attempt, actor=world.agent)
    ledger.confirm(attempt, result_ref="ch_1", provider_request_id="ch_1", actor=world.agent)
    age([attempt], 40)
    seal_all()
    RetentionRule.objects.create(tenant_id="acme", tool_id="charge_card", archive_after_days=30)
    assert _run(tmp_path).removed == 1
    results = race("tests.attempts.race_child", [[key, str(n)] for n in range(4)])
    assert results == [{"attempt_id": attempt.attempt_id, "created": False, "claimed": False}] * 4
    assert Attempt.objects.count() == 0


def test_the_migration_fills_the_indexes_of_an_existing_ledger(ledger_with_rules, tmp_path):
    """Migration 0018's fill: every live attempt's key (with its args hash) and every archived
    one's (without: it was never kept), and each provider effect's first claimant."""
    import importlib

    from django.apps import apps

    _run(tmp_path)
    live = make("acme", "update_crm", "live:after-archive")
    history_guard.remove(connection)
    try:
        RecordedKey.objects.all().delete()
        ProviderEffect.objects.all().delete()
    finally:
        history_guard.install(connection)
    migration = importlib.import_module("attempts.migrations.0018_key_and_effect_index")
    migration.BATCH = 2  # several batches
    migration.fill(apps, None)
    index = {r.attempt_id: r for r in RecordedKey.objects.all()}
    for attempt in Attempt.objects.all():
        entry = index[attempt.attempt_id]
        assert entry.key_digest == key_digest(attempt.idempotency_key)
        assert entry.args_hash == attempt.args_hash
    for gone in ArchivedAttempt.objects.all():
        entry = index[gone.attempt_id]
        assert (entry.key_digest, entry.args_hash) == (key_digest(gone.idempotency_key), "")
    assert len(index) == Attempt.objects.count() + ArchivedAttempt.objects.count()
    claimed = dict(ProviderEffect.objects.values_list("provider_request_id", "attempt_id"))
    assert claimed[live.provider_request_id] == live.attempt_id
    assert (
        claimed[ledger_with_rules.due[0].provider_request_id] == ledger_with_rules.due[0].attempt_id
    )
    # An archived key without its args hash is refused, never recorded again.
    with pytest.raises(ledger.IdempotencyConflict, match="did not keep|arguments hashes"):
        _replay(ledger_with_rules.due[0].idempotency_key)
