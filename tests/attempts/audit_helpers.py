"""Shared helpers for the audit tests: a small real history, and an attacker's raw SQL."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from attempts import ledger, log
from attempts.models import Attempt, AttemptEvent, Checkpoint, CheckpointLeaf
from attempts.states import Actor
from attempts.verify_export import GENESIS, MerkleTree, checkpoint_hash, leaf_hash

EVENTS = "attempts_attemptevent"
ATTEMPTS = "attempts_attempt"
ORIGIN = "example.test/ledger"


def sealed_before_the_log(
    rows: list[tuple[str, int, str]], *, config_length: int = 0, config_head: str = GENESIS
) -> Checkpoint:
    """A format-1 checkpoint, as a ledger sealed before the log has, sealed a day ago: its leaves
    ``rows`` (attempt id, chain length, chain head) in order, and the configuration chain's
    ``config_length`` and ``config_head``."""
    fields = {
        "seq": 1,
        "prev_hash": GENESIS,
        "root": MerkleTree([leaf_hash(*row) for row in rows]).root(),
        "size": len(rows),
        "config_length": config_length,
        "config_head": config_head,
        "sealed_at": timezone.now() - dt.timedelta(days=1),
    }
    checkpoint = Checkpoint.objects.create(**fields, hash=checkpoint_hash(fields))
    CheckpointLeaf.objects.bulk_create(
        CheckpointLeaf(checkpoint=checkpoint, position=i, attempt_id=a, length=n, head=h)
        for i, (a, n, h) in enumerate(rows)
    )
    return checkpoint


def sign_with_new_key(tmp_path, settings, name: str = "log.key"):
    """The log signs with a new key, written to ``tmp_path / name``, under the name ``ORIGIN``
    from now on; returns the key file's path and the key's verifier."""
    path = tmp_path / name
    verifier = log.write_key_file(path, ORIGIN)
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(path), "ORIGIN": ORIGIN}
    return path, verifier


def run_verify(*args: str) -> str:
    """``verify_audit`` with ``args``, in this process; what it printed."""
    out = io.StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def broken(*args: str) -> str:
    """``verify_audit`` with ``args`` must fail (exit status 1); what it said."""
    with pytest.raises(CommandError) as info:
        run_verify(*args)
    assert info.value.returncode == 1
    return str(info.value)


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
        **event.export_row(event.attempt.attempt_id),
        "salt": event.attempt.args_salt,
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


def rewrite_history(attempt: Attempt, *, details: dict) -> None:
    """A database superuser rewrites one attempt's first event and recomputes every hash after
    it: the attempt's chain, its row's head, the sealed leaves, the log's stored hashes, every
    checkpoint (roots, notes, the checkpoint chain). What it cannot make is a signature: the
    log's signatures, which no longer verify, are deleted."""
    from attempts import log
    from attempts.models import Checkpoint, CheckpointLeaf, LogEntry
    from attempts.verify_export import (
        GENESIS,
        MerkleTree,
        checkpoint_hash,
        event_hash,
        leaf_hash,
        text_digest,
    )

    drop_triggers()
    prev, hashes = GENESIS, []
    for number, event_id in enumerate(
        AttemptEvent.objects.filter(attempt=attempt).order_by("id").values_list("id", flat=True)
    ):
        row = event_row(event_id)
        if number == 0:
            row["details"] = details
        row["prev_hash"] = prev
        if row["salt"]:  # format 3: the salt is in the database, so they recompute this too
            row["text_digest"] = text_digest(row["salt"], row["reason"], row["details"])
        prev = event_hash(row)
        hashes.append(prev)
        sql(
            "UPDATE attempts_attemptevent SET details = %s, prev_hash = %s, hash = %s, "
            "text_digest = %s WHERE id = %s",
            [json.dumps(row["details"]), row["prev_hash"], prev, row["text_digest"], event_id],
        )
    sql("UPDATE attempts_attempt SET chain_head = %s WHERE id = %s", [prev, attempt.pk])
    for leaf_id, length in CheckpointLeaf.objects.filter(attempt_id=attempt.attempt_id).values_list(
        "id", "length"
    ):
        sql(
            "UPDATE attempts_checkpointleaf SET head = %s WHERE id = %s",
            [hashes[length - 1], leaf_id],
        )
    sql("DELETE FROM attempts_lognode")
    sql("DELETE FROM attempts_checkpointsignature")
    entries = LogEntry.objects.order_by("index").values_list(
        "leaf__attempt_id", "leaf__length", "leaf__head"
    )
    log.append([leaf_hash(*row) for row in entries], size=0)
    prev_checkpoint = GENESIS
    for checkpoint in Checkpoint.objects.order_by("seq"):
        if checkpoint.format >= 2:
            root = log.root_at(checkpoint.size)
            checkpoint.root = root.hex()
            checkpoint.note = log.checkpoint_text(
                seq=checkpoint.seq,
                size=checkpoint.size,
                root=root,
                config_length=checkpoint.config_length,
                config_head=checkpoint.config_head,
                authority=checkpoint.authority,
            )
        else:
            rows = checkpoint.leaves.order_by("position").values_list(
                "attempt_id", "length", "head"
            )
            checkpoint.root = MerkleTree([leaf_hash(*row) for row in rows]).root()
        checkpoint.prev_hash = prev_checkpoint
        checkpoint.hash = checkpoint_hash(checkpoint.__dict__)
        sql(
            "UPDATE attempts_checkpoint SET root = %s, note = %s, prev_hash = %s, hash = %s "
            "WHERE id = %s",
            [
                checkpoint.root,
                checkpoint.note,
                checkpoint.prev_hash,
                checkpoint.hash,
                checkpoint.pk,
            ],
        )
        prev_checkpoint = checkpoint.hash


def forget_signer_state() -> None:
    """What an operator holding the signing key can do: delete the signer's memory of the
    newest tree it signed, so it signs a rewritten history."""
    from attempts import log

    log._signer_state_path().unlink(missing_ok=True)
