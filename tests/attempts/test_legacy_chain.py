"""A ledger whose early history was written before per-attempt chains (one chain over the whole
ledger, format 1: a ledger of release 0.1.0 that was made before its chain migration keeps such
events) verifies as it did, a head hash kept from then still anchors it, new events continue
each attempt's history, the first checkpoint seals it, and tampering with the old history is
still detected. The history is written as that migration left it: format-1 events, and each
attempt's chain head and length where its history stood."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import rfc8785

from attempts import audit_verify, chain, ledger
from attempts.models import Attempt, AttemptEvent, Grant, Tenant, Tool
from attempts.states import Actor
from attempts.verify_export import GENESIS, LEGACY_FORMAT, event_hash
from tests.attempts.audit_helpers import drop_triggers, sql

pytestmark = pytest.mark.django_db(transaction=True)


def _legacy_ledger() -> tuple[list[str], str]:
    """Three attempts with five events in one ledger-wide chain, written as the old code did.
    Returns the attempts' ids and the head hash an auditor kept."""
    now = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
    acme = Tenant.objects.create(slug="acme", name="Acme")
    tool = Tool.objects.create(name="update_crm", effect_class="idempotent", adapter="http")
    Grant.objects.create(tenant=acme, tool=tool, policy_version="v1")
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
        pks[attempt_id] = Attempt.objects.create(
            attempt_id=attempt_id,
            tenant=acme,
            task_id="t",
            tool_name="update_crm",
            args=args,
            args_hash=args_hash,
            idempotency_key=f"legacy:{n}",
            state=state,
            version=len(moves[n]),
            policy_version="v1",
            created_at=now,
            updated_at=now,
        ).pk
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
        AttemptEvent.objects.create(
            attempt_id=pks[attempt_id],
            action=action,
            actor_kind="agent",
            actor="old-agent",
            from_state=frm,
            to_state=to,
            details=details,
            created_at=moment,
            prev_hash=prev,
            hash=digest,
            chain_format=LEGACY_FORMAT,
        )
        prev = digest
    # Where the chain migration left each attempt: its newest event and its event count.
    for attempt in Attempt.objects.all():
        newest = attempt.events.order_by("-id").first()
        Attempt.objects.filter(pk=attempt.pk).update(
            chain_head=newest.hash, chain_length=attempt.events.count()
        )
    return ids, prev


@pytest.fixture
def legacy():
    return _legacy_ledger()


def test_a_legacy_ledger_verifies_and_keeps_its_anchor(legacy):
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
