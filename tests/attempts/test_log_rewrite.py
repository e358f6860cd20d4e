"""Protocol: a database superuser who rewrites history and recomputes every hash (events, chain
heads, leaves, the log's stored hashes, checkpoints) is caught by the standalone verifier given
only the log's verifier key and a witnessed checkpoint kept elsewhere; and the signer refuses to
sign the rewritten log, since it keeps the newest tree it signed outside the database."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from attempts import log, verify_export
from attempts.models import Attempt, Checkpoint, CheckpointSignature
from attempts.verify_export import NoteSignature
from tests.attempts.audit_helpers import (
    ORIGIN,
    broken,
    build_history,
    drop_triggers,
    rewrite_history,
    run_verify,
    seal_all,
    sign_with_new_key,
    sql,
)
from tests.attempts.test_witness import _start_witness

pytestmark = pytest.mark.django_db(transaction=True)

VERIFIER = Path(verify_export.__file__)


@pytest.fixture
def witnessed(world, tmp_path, settings):
    _, verifier = sign_with_new_key(tmp_path, settings)
    process, port, witness_key = _start_witness(tmp_path, verifier)
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{witness_key} http://127.0.0.1:{port}"]}
    build_history(world, 4)
    seal_all()
    assert log.publish() == {"witness.test/w1": "ok"}
    kept = tmp_path / "witnessed.checkpoint"
    kept.write_text(log.signed_note(log.newest_signed()))  # what an auditor saves
    build_history(world, 2, prefix="later")
    seal_all()
    yield verifier, witness_key, kept
    process.terminate()
    process.wait(timeout=10)


def _export(tmp_path: Path) -> Path:
    out = tmp_path / "audit.jsonl"
    call_command("export_audit", "--format", "jsonl", "--out", str(out), stdout=io.StringIO())
    return out


def _verify(export: Path, verifier, witness_key, kept: Path) -> subprocess.CompletedProcess:
    """The auditor's run: the one copied file, in its own process, no Django."""
    return subprocess.run(
        [sys.executable, str(VERIFIER), str(export), "--log-key", str(verifier),
         "--witness-key", witness_key, "--quorum", "1", "--checkpoint", str(kept)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_honest_export_verifies_against_the_witnessed_checkpoint(witnessed, tmp_path):
    verifier, witness_key, kept = witnessed
    done = _verify(_export(tmp_path), verifier, witness_key, kept)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log's" in done.stdout and "checkpoints kept elsewhere checked" in done.stdout


def test_a_superusers_rewrite_that_recomputes_every_hash_is_caught(witnessed, tmp_path):
    verifier, witness_key, kept = witnessed
    rewrite_history(Attempt.objects.order_by("id").first(), details={"amount": 1})
    # The sealer's host still signs new checkpoints, but not this rewritten log.
    with pytest.raises(log.LogKeyError, match="refusing to sign"):
        log.sign_pending()
    assert log.newest_signed() is None
    # Every hash agrees with every other: only the key and the kept checkpoint tell.
    report = verify_export.verify_file(_export(tmp_path))
    assert report.ok, report.render()
    done = _verify(_export(tmp_path), verifier, witness_key, kept)
    assert done.returncode == 1
    assert "[consistency]" in done.stdout and "a fork" in done.stdout
    assert "[signature]" in done.stdout


def test_a_kept_checkpoint_must_be_signed_and_witnessed(witnessed, tmp_path):
    verifier, witness_key, kept = witnessed
    forged = kept.read_text().replace("\n4\n", "\n5\n", 1) if "\n4\n" in kept.read_text() else ""
    assert forged
    fake = tmp_path / "forged.checkpoint"
    fake.write_text(forged)
    done = _verify(_export(tmp_path), verifier, witness_key, fake)
    assert done.returncode == 1 and "not signed by the log's key" in done.stdout
    unwitnessed = tmp_path / "unwitnessed.checkpoint"
    unwitnessed.write_text(log.signed_note(log.newest_signed()))
    done = _verify(_export(tmp_path), verifier, witness_key, unwitnessed)
    assert done.returncode == 1 and "fewer than the quorum" in done.stdout


def test_the_pure_python_ed25519_agrees_with_cryptography():
    """The copied verifier works without cryptography (RFC 8032 arithmetic in plain Python)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    for message in (b"", b"checkpoint\n", bytes(range(256))):
        key = Ed25519PrivateKey.generate()
        public = key.public_key().public_bytes_raw()
        signature = key.sign(message)
        assert verify_export._ed25519_plain(public, message, signature)
        assert not verify_export._ed25519_plain(public, message + b"x", signature)
        bent = bytes([signature[0] ^ 1]) + signature[1:]
        assert not verify_export._ed25519_plain(public, message, bent)


# ---------------------------------------------------------------------------------------------
# verify_audit: the newest checkpoint verifies on its own, from configuration and keys


@pytest.fixture
def signed_ledger(world, tmp_path, settings):
    """A ledger whose sealer signs (a key file configured), with two signed checkpoints."""
    _, verifier = sign_with_new_key(tmp_path, settings)
    build_history(world, 3)
    seal_all()
    build_history(world, 2, prefix="later")
    seal_all()
    assert Checkpoint.objects.filter(signatures__kind="log").count() >= 2
    return verifier


def test_an_honest_signed_ledger_verifies_on_its_keys(signed_ledger):
    assert "OK:" in run_verify()


def test_a_rewrite_that_recomputes_every_hash_and_deletes_every_signature_fails(signed_ledger):
    rewrite_history(Attempt.objects.order_by("id").first(), details={"amount": 1})
    message = broken()
    assert "[signature]" in message
    assert "no checkpoint carries a valid signature of the log's key" in message
    assert "the log's signer last signed a tree" in message  # its memory, outside the database


def test_deleting_only_the_newest_signatures_is_seen_by_the_signers_memory(signed_ledger):
    newest = Checkpoint.objects.order_by("-seq").first()
    drop_triggers()
    sql("DELETE FROM attempts_checkpointsignature WHERE checkpoint_id = %s", [newest.pk])
    message = broken()
    assert "[signature]" in message and "the log's signer last signed a tree" in message


def _signed_by_another_key():
    """The newest checkpoint also signed by a new key under the log's name (an INSERT: the
    append-only guard allows it); returns that key's verifier."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text, other = log.generate_key(ORIGIN)
    _, seed = log.parse_private_key(text)
    checkpoint = Checkpoint.objects.order_by("-seq").first()
    signature = Ed25519PrivateKey.from_private_bytes(seed).sign(checkpoint.note.encode())
    CheckpointSignature.objects.create(
        checkpoint=checkpoint,
        kind="log",
        name=other.name,
        key_id=other.id.hex(),
        line=NoteSignature(other.name, other.id, signature).line(),
        created_at=timezone.now(),
    )
    return other


def test_a_signature_by_a_key_that_is_not_configured_is_reported(signed_ledger, settings):
    other = _signed_by_another_key()
    message = broken()
    assert "[signature]" in message and "neither the log's configured key" in message
    # Listed as an old verifier key (a rotation), it is trusted.
    settings.TLOG = {**settings.TLOG, "OLD_VERIFIER_KEYS": [str(other)]}
    assert "OK:" in run_verify()


def test_with_no_key_configured_unsigned_checkpoints_are_a_note_or_a_failure(world):
    build_history(world, 2)
    seal_all()
    assert "no log key is configured" in run_verify()
    message = broken("--require-signed")
    assert "[signature]" in message and "no log key is configured" in message


def test_deleted_cosignatures_fail_the_witness_quorum(witnessed):
    assert "OK:" in run_verify()
    drop_triggers()
    sql("DELETE FROM attempts_checkpointsignature WHERE kind = 'witness'")
    message = broken()
    assert "[witness]" in message and "no checkpoint is cosigned by 1" in message


# The standalone verifier does the same with the keys it is given.


def _offline(export: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(VERIFIER), str(export), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_offline_the_witness_quorum_is_checked_on_the_export_with_the_keys_given(
    witnessed, tmp_path
):
    verifier, witness_key, _ = witnessed
    keys = ["--log-key", str(verifier), "--witness-key", witness_key, "--quorum", "1"]
    done = _offline(_export(tmp_path), *keys)
    assert done.returncode == 0, done.stdout + done.stderr
    drop_triggers()
    sql("DELETE FROM attempts_checkpointsignature WHERE kind = 'witness'")
    done = _offline(_export(tmp_path), *keys)
    assert done.returncode == 1 and "[witness]" in done.stdout, done.stdout
    assert "no checkpoint of the export is cosigned by 1" in done.stdout


def test_offline_a_signature_by_a_key_not_given_is_reported(signed_ledger, tmp_path):
    other = _signed_by_another_key()
    export = _export(tmp_path)
    done = _offline(export, "--log-key", str(signed_ledger))
    assert done.returncode == 1 and "[signature]" in done.stdout
    assert "a key not given with --log-key" in done.stdout
    done = _offline(export, "--log-key", str(signed_ledger), "--log-key", str(other))
    assert done.returncode == 0, done.stdout  # an old key, given: trusted


def test_a_restored_copy_may_be_older_than_the_signers_memory(signed_ledger):
    """A restore drill checks a copy the signer has signed past since: with --restored that is
    a note; without it, the same database is a rollback."""
    import base64
    import json

    size = Checkpoint.objects.order_by("-seq").first().size
    memory = log._signer_state_path()
    later = {"size": size + 3, "root": base64.b64encode(bytes(32)).decode()}
    memory.write_text(json.dumps(later))  # what the signer remembers after signing on
    message = broken()
    assert "[signature]" in message and f"last signed a tree of {size + 3} leaves" in message
    out = run_verify("--restored")
    assert "OK:" in out and "this restored copy is older" in out
