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

from attempts import log, verify_export
from attempts.models import Attempt
from tests.attempts.audit_helpers import build_history, rewrite_history, seal_all
from tests.attempts.test_witness import ORIGIN, _start_witness

pytestmark = pytest.mark.django_db(transaction=True)

VERIFIER = Path(verify_export.__file__)


@pytest.fixture
def witnessed(world, tmp_path, settings):
    key_path = tmp_path / "log.key"
    verifier = log.write_key_file(key_path, ORIGIN)
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(key_path), "ORIGIN": ORIGIN}
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
