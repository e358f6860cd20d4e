"""The transparency log (attempts/log.py): one append-only tree over every sealed leaf, whose
stored hashes give the same roots and RFC 9162 proofs as a tree rebuilt from all leaves; format-2
checkpoints are (size, root) of it, signed with a key kept outside the database."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from attempts import chain, log
from attempts.models import Checkpoint, CheckpointLeaf, CheckpointSignature, LogEntry, LogNode
from attempts.verify_export import (
    LogBuilder,
    MerkleTree,
    NoteError,
    VerifierKey,
    checkpoint_hash,
    consistent,
    inclusion_root,
    leaf_hash,
    open_checkpoint,
)
from tests.attempts.audit_helpers import (
    build_history,
    seal_all,
    sealed_before_the_log,
    sign_with_new_key,
)
from tests.conftest import REPO

pytestmark = pytest.mark.django_db


def _leaf(i: int) -> bytes:
    return leaf_hash(f"att_{i:04d}", i + 1, hashlib.sha256(str(i).encode()).hexdigest())


def _grow(sizes: list[int]) -> list[bytes]:
    """Append leaves in batches (as successive seals do), returning every leaf."""
    leaves: list[bytes] = []
    size = 0
    for batch in sizes:
        new = [_leaf(len(leaves) + i) for i in range(batch)]
        size, root = log.append(new, size=size)
        leaves += new
        assert root.hex() == MerkleTree(leaves).root()
    return leaves


def test_stored_hashes_give_the_rebuilt_trees_roots_and_proofs():
    leaves = _grow([1, 2, 5, 1, 13, 8, 1, 40])
    for size in range(1, len(leaves) + 1):
        root = bytes.fromhex(MerkleTree(leaves[:size]).root())
        assert log.root_at(size) == root
        for index in range(size):
            proof = log.inclusion_proof(index, size)
            assert inclusion_root(leaves[index], index, size, proof) == root
            assert [h.hex() for h in proof] == MerkleTree(leaves[:size]).proof(index)
        for old in range(0, size + 1):
            old_root = log.root_at(old)
            assert consistent(old, old_root, size, root, log.consistency_proof(old, size))
    # A wrong root or a wrong old size does not verify.
    proof = log.consistency_proof(5, 30)
    assert not consistent(5, log.root_at(6), 30, log.root_at(30), proof)
    assert not consistent(6, log.root_at(6), 30, log.root_at(30), proof)
    assert inclusion_root(leaves[3], 4, 30, log.inclusion_proof(3, 30)) != log.root_at(30)


def test_log_builder_matches_the_tree():
    leaves = [_leaf(i) for i in range(70)]
    builder = LogBuilder()
    for i, leaf in enumerate(leaves):
        builder.append(leaf)
        assert builder.root().hex() == MerkleTree(leaves[: i + 1]).root()


def test_tiles_hold_the_stored_hashes_of_their_level():
    leaves = _grow([300, 20])
    full = log.tile(log.TilePath(0, 0, None), 320)
    assert full == b"".join(leaves[:256])
    assert log.tile(log.TilePath(0, 1, 64), 320) == b"".join(leaves[256:320])
    assert log.tile(log.TilePath(0, 1, 65), 320) is None  # wider than the tree
    assert log.tile(log.TilePath(0, 1, None), 320) is None  # not full yet
    level1 = log.tile(log.TilePath(1, 0, 1), 320)  # node 0 of level 8: root of leaves 0..255
    assert level1 == log.root_at(256)
    assert log.tile(log.TilePath(0, 0, None), 255) is None  # beyond the published size


@pytest.mark.parametrize(
    ("path", "parsed"),
    [
        ("0/000", (0, 0, None)),
        ("0/x001/234", (0, 1234, None)),
        ("2/x001/x234/067.p/8", (2, 1234067, 8)),
        ("1/255.p/255", (1, 255, 255)),
    ],
)
def test_tile_paths_follow_the_spec(path, parsed):
    tile = log.TilePath.parse(path)
    assert (tile.level, tile.index, tile.width) == parsed
    assert tile.path() == path


@pytest.mark.parametrize(
    "path",
    ["0", "0/1", "0/0001", "0/x1/234", "0/001/234", "01/000", "0/000.p/0", "0/000.p/256",
     "0/000.p/08", "x/000", "0/x000/001", "64/000", "0/000.p"],
)  # fmt: skip
def test_bad_tile_paths_are_refused(path):
    with pytest.raises(ValueError):
        log.TilePath.parse(path)


def test_sealing_appends_every_leaf_once_and_checkpoints_are_the_logs_size_and_root(world):
    build_history(world, 3)
    seal_all()
    build_history(world, 2, prefix="b")
    seal_all()
    checkpoints = list(Checkpoint.objects.order_by("seq"))
    assert [c.format for c in checkpoints] == [2] * len(checkpoints)
    entries = list(
        LogEntry.objects.order_by("index").values_list(
            "leaf__attempt_id", "leaf__length", "leaf__head"
        )
    )
    leaves = [leaf_hash(*row) for row in entries]
    assert len(leaves) == CheckpointLeaf.objects.count() == checkpoints[-1].size
    for checkpoint in checkpoints:
        assert checkpoint.root == MerkleTree(leaves[: checkpoint.size]).root()
        body = open_checkpoint_body(checkpoint.note)
        assert (body.size, body.root.hex()) == (checkpoint.size, checkpoint.root)
        assert f"ledgerweb-checkpoint {checkpoint.seq}" in body.extensions
        assert checkpoint.hash == checkpoint_hash(checkpoint.__dict__)


def open_checkpoint_body(note: str):
    from attempts.verify_export import LogCheckpoint

    return LogCheckpoint.parse(note)


def test_leaves_of_older_checkpoints_join_the_log_first(world):
    """A ledger sealed before the log (format-1 checkpoints) keeps them as they are; the next
    seal appends their leaves to the log in the order they were sealed."""
    rows = [("att_old_b", 3, "b" * 64), ("att_old_a", 2, "a" * 64)]
    tree = MerkleTree([leaf_hash(*row) for row in rows])
    old = sealed_before_the_log(rows)
    new = chain.seal()
    assert new is not None and new.format == 2 and new.prev_hash == old.hash
    assert new.size == 2 and new.root == tree.root()
    assert list(LogEntry.objects.order_by("index").values_list("leaf__attempt_id", flat=True)) == [
        "att_old_b",
        "att_old_a",
    ]
    assert chain.seal() is None  # nothing left to log


def test_looking_for_older_leaves_reads_only_older_checkpoints(world):
    """Only a format-1 checkpoint's leaves can lack a log entry, so the sealer looks for them
    from the checkpoints: at 10M attempts, asking every leaf read both tables whole (8.5 s) on
    every seal, the idle ones included."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    build_history(world, 4)
    seal_all()
    with CaptureQueriesContext(connection) as queries:
        assert chain.seal() is None
    backlog = [
        q["sql"]
        for q in queries.captured_queries
        if 'FROM "attempts_checkpointleaf"' in q["sql"] and "attempts_logentry" in q["sql"]
    ]
    assert len(backlog) == 1, [q["sql"] for q in queries.captured_queries]
    assert '"attempts_checkpoint"."format" < 2' in backlog[0]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + backlog[0])
            plan = [row[-1] for row in cursor.fetchall()]
        assert not [step for step in plan if step.startswith("SCAN attempts_checkpointleaf")], plan


def test_nothing_to_seal_writes_nothing(world):
    chain.seal()  # the world's own configuration changes (and the history's baseline)
    assert chain.seal() is None
    assert not LogNode.objects.exists()


# -- keys and signing


@pytest.fixture
def key_file(tmp_path, settings):
    return sign_with_new_key(tmp_path, settings)


def _rotated(world, tmp_path, settings, *, old_verifier):
    """Sign with a new key from now on, the old key's ``old_verifier`` kept for checking what it
    signed, and seal one more attempt. Returns the newest signed checkpoint before, the new
    key's verifier, and the newest one after."""
    before = log.newest_signed()
    _, second = sign_with_new_key(tmp_path, settings, "second.key")
    settings.TLOG = {**settings.TLOG, "OLD_VERIFIER_KEYS": [str(old_verifier)]}
    build_history(world, 1, prefix="r")
    seal_all()
    return before, second, log.newest_signed()


def test_checkpoints_are_signed_with_the_key_file(world, key_file):
    _, verifier = key_file
    assert os.stat(key_file[0]).st_mode & 0o777 == 0o600
    build_history(world, 2)
    seal_all()
    newest = log.newest_signed()
    assert newest is not None
    checkpoint, _ = open_checkpoint(log.signed_note(newest), [verifier])
    assert checkpoint.origin == "example.test/ledger"
    assert checkpoint.size == newest.size
    other = log.generate_key("example.test/ledger")[1]
    with pytest.raises(NoteError, match="not signed by the log's key"):
        open_checkpoint(log.signed_note(newest), [other])
    assert str(VerifierKey.parse(str(verifier))) == str(verifier)


def test_a_key_file_others_may_read_is_refused(tmp_path):
    path = tmp_path / "loose.key"
    log.write_key_file(path, "example.test/ledger")
    path.chmod(0o640)
    with pytest.raises(log.LogKeyError, match="mode 0640.*chmod 600"):
        log.read_key_file(path)


def test_without_a_key_checkpoints_stay_unsigned_and_are_never_served_as_signed(world):
    build_history(world, 1)
    seal_all()
    assert Checkpoint.objects.exists()
    assert log.newest_signed() is None
    assert log.signed_note(Checkpoint.objects.get()) is None
    assert not CheckpointSignature.objects.exists()


def test_a_signing_command_signs_and_a_wrong_one_is_refused(world, tmp_path, settings):
    text, verifier = log.generate_key("kms.test/ledger")
    key_path = tmp_path / "kms.key"
    key_path.write_text(text)
    key_path.chmod(0o600)
    script = tmp_path / "sign.py"
    # A stand-in for a KMS client: reads the note text on stdin, prints a base64 signature.
    script.write_text(
        "import base64, sys\n"
        "from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey\n"
        f"seed = base64.b64decode(open({str(key_path)!r}).read().strip().split('+', 4)[4])[1:]\n"
        "key = Ed25519PrivateKey.from_private_bytes(seed)\n"
        "print(base64.b64encode(key.sign(sys.stdin.buffer.read())).decode())\n"
    )
    import sys

    command = f"{sys.executable} {script}"
    settings.TLOG = {
        **settings.TLOG,
        "SIGN_COMMAND": command,
        "VERIFIER_KEY": str(verifier),
        "ORIGIN": "kms.test/ledger",
        "SIGNER_STATE": str(tmp_path / "signer.state"),
    }
    build_history(world, 1)
    seal_all()
    newest = log.newest_signed()
    assert newest is not None
    open_checkpoint(log.signed_note(newest), [verifier])
    settings.TLOG = {**settings.TLOG, "VERIFIER_KEY": str(log.generate_key("kms.test/ledger")[1])}
    with pytest.raises(log.LogKeyError, match="does not verify"):
        log.signer().sign("x\n")


def test_key_rotation_keeps_old_checkpoints_verifiable(world, key_file, tmp_path, settings):
    _, first = key_file
    build_history(world, 1)
    seal_all()
    old, second, new = _rotated(world, tmp_path, settings, old_verifier=first)
    assert new.seq > old.seq
    keys = log.verifier_keys()
    assert {str(k) for k in keys} == {str(first), str(second)}
    open_checkpoint(log.signed_note(old), keys)
    open_checkpoint(log.signed_note(new), keys)
    assert base64.b64decode(log.signed_note(new).splitlines()[-1].split()[-1])[:4] == second.id


def test_ledger_log_genkey_key_and_status(world, tmp_path, settings):
    import io

    from django.core.management import CommandError, call_command

    out = io.StringIO()
    path = tmp_path / "made.key"
    call_command("ledger_log", "genkey", "--out", str(path), "--name", "example.test/l", stdout=out)
    assert os.stat(path).st_mode & 0o777 == 0o600
    printed = out.getvalue().strip().splitlines()[-1]
    assert VerifierKey.parse(printed).name == "example.test/l"
    with pytest.raises(CommandError, match="never overwritten"):
        call_command("ledger_log", "genkey", "--out", str(path))
    call_command("ledger_log", "genkey", "--out", str(path), "--if-missing")  # quietly nothing
    with pytest.raises(CommandError, match="no signing key is configured"):
        call_command("ledger_log", "key")
    settings.TLOG = {**settings.TLOG, "KEY_FILE": str(path)}
    out = io.StringIO()
    call_command("ledger_log", "key", stdout=out)
    assert out.getvalue().strip() == printed
    build_history(world, 1)
    seal_all()
    out = io.StringIO()
    call_command("ledger_log", "status", stdout=out)
    assert "newest signed: 1 (1 leaves); 0 unsigned" in out.getvalue()
    path.chmod(0o644)
    with pytest.raises(CommandError, match="chmod 600"):
        call_command("ledger_log", "key")


SANDBOXED_SIGN = r"""
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
django.setup()
from attempts import chain, ledger, log
from attempts.states import Actor

agent = Actor.agent("sandboxed-agent")
for i in range(2):
    attempt, _ = ledger.record_intent(
        tenant="acme", task_id=f"t-{i}", tool_name="open_ticket",
        idempotency_key=f"sandbox:{i}", args={"i": i}, actor=agent,
    )
while chain.seal() is not None:
    pass
newest = log.newest_signed()
print("signed", newest.seq if newest else None)
"""


@pytest.mark.skipif(
    not shutil.which("unshare") or os.geteuid() != 0, reason="needs unshare as root"
)
def test_the_signer_keeps_its_state_in_the_data_folder_under_a_read_only_key_folder(tmp_path):
    """As the shipped systemd units run it (ProtectSystem=strict: the key's folder is read-only,
    the data folder is not): checkpoints are signed, and the signer's state is in the data
    folder. The key folder is made read-only with a bind mount in a mount namespace of its own,
    which binds root too."""
    keys, data = tmp_path / "etc-ledgerweb", tmp_path / "data"
    keys.mkdir()
    data.mkdir()
    key = keys / "log.key"
    log.write_key_file(key, "example.test/ledger")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LEDGERWEB_"))},
        "LEDGERWEB_DATA_DIR": str(data),
        "LEDGERWEB_TLOG_KEY_FILE": str(key),
        "LEDGERWEB_TLOG_ORIGIN": "example.test/ledger",
        "DJANGO_SETTINGS_MODULE": "ledgerweb.settings",
        "PYTHONPATH": str(REPO),
    }
    (tmp_path / "sign.py").write_text(SANDBOXED_SIGN)
    python = f"{sys.executable} {REPO / 'manage.py'}"
    script = (
        f"mount --bind {keys} {keys} && mount -o remount,bind,ro {keys} && "
        f"! touch {keys}/writable && "
        f"{python} migrate -v0 && "
        f"{python} seed_demo --provider-url http://127.0.0.1:9 --password sandbox-pass-1 -v0 && "
        f"{sys.executable} {tmp_path / 'sign.py'}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "signed None" not in done.stdout and "signed " in done.stdout, done.stdout
    assert (data / "log_signer.state").is_file()
    assert sorted(p.name for p in keys.iterdir()) == ["log.key"]


def test_a_rotated_key_signs_the_older_checkpoints_the_remembered_tree_extends(
    world, key_file, tmp_path, settings
):
    """The signer remembers the newest tree signed (outside the database). A new key first
    signs the checkpoints before it, which that tree extends (a consistency proof checked
    against the remembered root), then the new ones; a smaller tree that is not a prefix of the
    remembered one is still refused."""
    _, first = key_file
    for prefix in ("a", "b", "c"):
        build_history(world, 2, prefix=prefix)
        seal_all()
    before, second, newest = _rotated(world, tmp_path, settings, old_verifier=first)
    assert newest.seq > before.seq and newest.size > before.size
    by_second = CheckpointSignature.objects.filter(kind="log", key_id=second.id.hex())
    assert by_second.filter(checkpoint=newest).exists()
    assert by_second.count() == Checkpoint.objects.filter(format__gte=2).count()
    # The memory still holds the newest tree, not an older one the new key caught up on.
    assert log.signed_tree()[1][0] == newest.size
    # A rewritten older checkpoint is not a prefix of the remembered tree: refused.
    older = Checkpoint.objects.filter(format__gte=2).order_by("seq").first()
    older.root = "00" * 32
    with pytest.raises(log.LogKeyError, match="rollback|rewritten"):
        log._check_extends(log.signed_tree()[0], older)
