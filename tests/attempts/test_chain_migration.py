# ruff: noqa: S608 -- raw SQL against constant table names
"""A ledger written before per-attempt chains (one chain over the whole ledger, format 1) migrates
without losing its proof: after migration 0005 it verifies as it did, a head hash kept from
before still anchors it, new events continue each attempt's history, the first checkpoint seals
it, and tampering with the old history is still detected."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
import rfc8785
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from attempts import audit_verify, chain, ledger
from attempts.models import Attempt, AttemptEvent
from attempts.states import Actor
from attempts.verify_export import GENESIS, LEGACY_FORMAT, event_hash
from tests.attempts.audit_helpers import drop_triggers, sql

BEFORE = [("attempts", "0004_fewer_index_writes_per_intent")]

pytestmark = pytest.mark.django_db(transaction=True)


def _old_path() -> MigrationExecutor:
    """An executor over the migrations a ledger created before the squash went through (the
    squashed schema migration taken out of the graph)."""
    executor = MigrationExecutor(connection)
    loader = MigrationLoader(connection, replace_migrations=False)
    for key, migration in loader.replacements.items():
        loader.graph.remove_replacement_node(key, migration.replaces)
    executor.loader = loader
    return executor


def _migrate(targets) -> None:
    _old_path().migrate(targets)


def _latest() -> list[tuple[str, str]]:
    return [key for key in _old_path().loader.graph.leaf_nodes() if key[0] == "attempts"]


def _legacy_ledger() -> tuple[list[str], str]:
    """Three attempts with five events in one ledger-wide chain, written as the old code did.
    Returns the attempts' ids and the head hash an auditor kept."""
    now = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO attempts_tenant (slug, name, created_at) VALUES ('acme', 'Acme', %s)",
            [now],
        )
        cursor.execute(
            "INSERT INTO attempts_tool (name, description, effect_class, critical, adapter, "
            "dispatch_url, lookup_url, timeout_seconds, active, updated_at) "
            "VALUES ('update_crm', '', 'idempotent', false, 'http', '', '', 10, true, %s)",
            [now],
        )
        cursor.execute(
            "INSERT INTO attempts_grant (tenant_id, tool_id, policy_version, allowed_scopes, "
            "active, updated_at) VALUES ('acme', 'update_crm', 'v1', '[]', true, %s)",
            [now],
        )
    prev = GENESIS
    ids = []
    moves = {
        0: ["INTENT_RECORDED", "DISPATCHED"],
        1: ["INTENT_RECORDED"],
        2: ["INTENT_RECORDED", "DISPATCHED"],
    }
    events = []
    pks = {}
    for n in range(3):
        attempt_id = f"att_LEGACY{n:020d}"
        args = {"n": n}
        args_hash = hashlib.sha256(rfc8785.dumps(args)).hexdigest()
        state = moves[n][-1]
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO attempts_attempt (attempt_id, tenant_id, task_id, tool_name, args, "
                "args_hash, idempotency_key, state, version, provider_request_id, result_ref, "
                "policy_version, credential_scope, review_reason, awaiting_approval, send_count, "
                "lookup_count, lease_owner, created_at, updated_at) VALUES "
                "(%s, 'acme', 't', 'update_crm', %s, %s, %s, %s, %s, '', '', 'v1', '[]', '', "
                "false, 0, 0, '', %s, %s)",
                [
                    attempt_id,
                    json.dumps(args),
                    args_hash,
                    f"legacy:{n}",
                    state,
                    len(moves[n]),
                    now,
                    now,
                ],
            )
            cursor.execute("SELECT id FROM attempts_attempt WHERE attempt_id = %s", [attempt_id])
            pks[attempt_id] = cursor.fetchone()[0]
        ids.append(attempt_id)
        created = {
            "tenant": "acme",
            "task_id": "t",
            "tool_name": "update_crm",
            "idempotency_key": f"legacy:{n}",
            "args_hash": args_hash,
            "policy_version": "v1",
            "credential_scope": [],
            "parent_attempt_id": None,
        }
        events.append((attempt_id, "attempt.created", "", "INTENT_RECORDED", created))
    # Interleave the attempts' later moves, as a busy ledger does.
    events.insert(2, (ids[0], "attempt.dispatched", "INTENT_RECORDED", "DISPATCHED", {}))
    events.append((ids[2], "attempt.dispatched", "INTENT_RECORDED", "DISPATCHED", {}))
    for i, (attempt_id, action, frm, to, details) in enumerate(events):
        moment = now + dt.timedelta(seconds=i)
        row = {
            "v": LEGACY_FORMAT,
            "attempt_id": attempt_id,
            "action": action,
            "actor_kind": "agent",
            "actor": "old-agent",
            "from_state": frm,
            "to_state": to,
            "reason": "",
            "details": details,
            "created_at": moment,
            "prev_hash": prev,
        }
        digest = event_hash(row)
        sql(
            "INSERT INTO attempts_attemptevent (attempt_id, action, actor_kind, actor, from_state, "
            "to_state, reason, details, created_at, prev_hash, hash) "
            "VALUES (%s, %s, 'agent', 'old-agent', %s, %s, '', %s, %s, %s, %s)",
            [pks[attempt_id], action, frm, to, json.dumps(details), moment, prev, digest],
        )
        prev = digest
    return ids, prev


@pytest.fixture
def legacy():
    _migrate(BEFORE)
    try:
        ids, head = _legacy_ledger()
    finally:
        _migrate(_latest())
    from attempts import history_guard

    history_guard.install(connection)
    return ids, head


def test_a_legacy_ledger_verifies_after_migrating_and_keeps_its_anchor(legacy):
    ids, head = legacy
    assert set(AttemptEvent.objects.values_list("chain_format", flat=True)) == {LEGACY_FORMAT}
    for attempt in Attempt.objects.all():
        newest = attempt.events.order_by("-id").first()
        assert (attempt.chain_head, attempt.chain_length) == (newest.hash, attempt.events.count())
        assert not attempt.sealed
    report = audit_verify.verify_django_database(anchors=[head])
    assert report.ok, report.render()


def test_new_events_continue_legacy_history_and_are_sealed(legacy):
    ids, head = legacy
    attempt = Attempt.objects.get(attempt_id=ids[0])
    legacy_head = attempt.chain_head
    ledger.confirm(attempt, result_ref="receipt-0", actor=Actor.agent("new-agent"))
    newest = attempt.events.order_by("-id").first()
    assert newest.chain_format == 2 and newest.prev_hash == legacy_head
    while chain.seal() is not None:
        pass
    report = audit_verify.verify_django_database(anchors=[head], max_unsealed_seconds=0)
    assert report.ok, report.render()
    assert report.checkpoint is not None


@pytest.mark.parametrize("seal_first", [False, True], ids=["unsealed", "sealed"])
def test_tampering_with_legacy_history_is_still_detected(legacy, seal_first):
    ids, head = legacy
    if seal_first:
        while chain.seal() is not None:
            pass
    events = list(AttemptEvent.objects.order_by("id").values_list("id", flat=True))
    drop_triggers()
    sql("UPDATE attempts_attemptevent SET actor = 'forger' WHERE id = %s", [events[1]])
    kinds = {p.kind for p in audit_verify.verify_django_database().problems}
    assert "content" in kinds
    sql("DELETE FROM attempts_attemptevent WHERE id = %s", [events[2]])
    kinds = {p.kind for p in audit_verify.verify_django_database().problems}
    assert "link" in kinds  # the ledger-wide links of format-1 events still hold them
