"""An independent implementation accepts the log: Go's golang.org/x/mod/sumdb/note and
sumdb/tlog (Debian's golang-golang-x-mod-dev), the code behind Go's checksum database, which
Go's toolchain uses to check every module download. It opens our signed checkpoint with our
verifier key, parses our private key file as a signer that signs to the same bytes, fetches the
hash tiles from /log/tile/ and checks them against the signed root (TileHashReader), and accepts
our inclusion and consistency proofs (CheckRecord, CheckTree) and computes the same ones.

Built offline in GOPATH mode from /usr/share/gocode; .ci/run installs golang-go and
golang-golang-x-mod-dev. Skipped, saying so, when they are missing."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import rfc8785

from attempts import chain, log
from attempts.models import LogEntry
from tests.attempts.audit_helpers import build_history, sealed_before_the_log, sign_with_new_key

pytestmark = pytest.mark.django_db(transaction=True)

HERE = Path(__file__).resolve().parent
GOPATH = Path("/usr/share/gocode")


@pytest.fixture(scope="module")
def tlogcheck(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None or not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir():
        pytest.skip(
            "Go's sumdb/note and sumdb/tlog are not installed "
            "(apt-get install golang-go golang-golang-x-mod-dev; .ci/run does)"
        )
    out = tmp_path_factory.mktemp("go") / "tlogcheck"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(out.parent / "cache"),
        "GOFLAGS": "",
        "GOPROXY": "off",
    }
    subprocess.run(
        [go, "build", "-o", str(out), "tlogcheck.go"], cwd=HERE, env=env, check=True, timeout=300
    )
    return out


def _legacy_leaves(n: int) -> None:
    """A ledger sealed before the log: one format-1 checkpoint of ``n`` leaves."""
    sealed_before_the_log([(f"att_legacy_{i:05d}", i % 7 + 1, f"{i:064x}") for i in range(n)])


def _check(binary: Path, request: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary)], input=json.dumps(request), capture_output=True, text=True, timeout=120
    )


def test_go_accepts_our_checkpoints_keys_tiles_and_proofs(
    tlogcheck, live_server, world, tmp_path, settings
):
    key_path, verifier = sign_with_new_key(tmp_path, settings)
    _legacy_leaves(600)  # two full tiles at level 0, a partial one, a level-1 tile
    chain.seal()
    build_history(world, 3)
    while chain.seal() is not None:
        pass
    newest = log.newest_signed()
    size = newest.size
    assert size > 600
    entries = {
        e.index: e.leaf
        for e in LogEntry.objects.select_related("leaf").filter(
            index__in=[0, 255, 256, 599, size - 1]
        )
    }
    receipts = [
        {
            "index": index,
            "leaf_json": rfc8785.dumps(
                {"attempt_id": leaf.attempt_id, "length": leaf.length, "head": leaf.head}
            ).decode(),
            "proof": [base64.b64encode(h).decode() for h in log.inclusion_proof(index, size)],
        }
        for index, leaf in sorted(entries.items())
    ]
    consistency = [
        {
            "old": old,
            "old_root": base64.b64encode(log.root_at(old)).decode(),
            "proof": [base64.b64encode(h).decode() for h in log.consistency_proof(old, size)],
        }
        for old in (1, 7, 256, 600)
    ]
    request = {
        "verifier": str(verifier),
        "private_key": key_path.read_text().strip(),
        "note": log.signed_note(newest),
        "base": live_server.url,
        "receipts": receipts,
        "consistency": consistency,
    }
    done = _check(tlogcheck, request)
    assert done.returncode == 0, done.stderr
    assert f"OK: note, key, {size}-leaf tree from tiles" in done.stdout

    # The same program refuses what does not hold: a changed leaf, a foreign key.
    bad = {**request, "receipts": [{**receipts[0], "leaf_json": receipts[1]["leaf_json"]}]}
    assert "tlog.CheckRecord" in _check(tlogcheck, bad).stderr
    other = str(log.generate_key("example.test/ledger")[1])
    assert "note.Open" in _check(tlogcheck, {**request, "verifier": other}).stderr
