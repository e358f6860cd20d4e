"""The transparency log: one append-only Merkle tree (RFC 9162's shape) over every sealed leaf,
signed checkpoints in the C2SP ``tlog-checkpoint`` / ``signed-note`` format, hash tiles in the
``tlog-tiles`` layout, witnesses (``tlog-witness``, ``tlog-cosignature``) and receipts.

- The sealer (``attempts.chain.seal``, under the lock only sealers take) appends each checkpoint's
  leaves here (``append``) and stores the new subtree hashes (``LogNode``): the root of every
  complete subtree, so an inclusion or consistency proof and a tile are a handful of indexed
  reads, never a walk over the whole log. A format-2 checkpoint is (size, root) of this tree.
- Signing happens after the sealer's transaction (``sign_pending``), with a key file or a signing
  command (a KMS or HSM): the private key never enters the database, and a slow signer never
  holds the sealer's lock or the write path. A checkpoint without a log signature is never
  served or presented as signed.
- ``publish`` (run by the reconcile worker after sealing) submits the newest signed checkpoint to
  each configured witness with a consistency proof from the size it last cosigned, each call
  under a whole-request deadline, and stores the cosignatures beside the checkpoint. A witness
  that is down or refuses is reported (``status``), never waited for by a write.

The hash and note formats, and every check of them, are ``attempts.verify_export``'s.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import os
import shlex
import stat
import subprocess
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from attempts import replication
from attempts.models import (
    Attempt,
    Checkpoint,
    CheckpointLeaf,
    CheckpointSignature,
    LogNode,
    WitnessState,
)
from attempts.verify_export import (
    ALG_ED25519,
    ERASURE_ACTION,
    EXT_AUTHORITY,
    EXT_CHECKPOINT,
    EXT_CONFIG,
    LOG_FORMAT,
    LogCheckpoint,
    NoteError,
    NoteSignature,
    Problem,
    VerifierKey,
    _split,
    consistent,
    ed25519_verify,
    event_payload,
    key_id,
    node_hash,
    note_signed_by,
    split_note,
)

log = logging.getLogger(__name__)

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
PRIVATE_PREFIX = "PRIVATE+KEY+"
RECEIPT_FORMAT = "ledgerweb-receipt"
RECEIPT_VERSION = 2
SIGN_COMMAND_TIMEOUT = 10


class LogKeyError(Exception):
    """The signing key is missing, unreadable, too widely readable, or signs wrongly."""


class NotSealed(Exception):
    """The attempt's current state is not in a signed checkpoint yet."""


# ---------------------------------------------------------------------------------------------
# The tree


def _subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi) as complete subtrees, left to right, as (level, index) of their stored nodes.
    ``lo`` must be aligned as RFC 9162's recursion leaves it (true for every range below)."""
    out = []
    while lo < hi:
        level = (hi - lo).bit_length() - 1
        while lo % (1 << level):
            level -= 1
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def _read(coords: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """Stored node hashes by (level, index), in one query."""
    by_level: dict[int, set[int]] = {}
    for level, index in coords:
        by_level.setdefault(level, set()).add(index)
    if not by_level:
        return {}
    match = Q()
    for level, indexes in by_level.items():
        match |= Q(level=level, index__in=sorted(indexes))
    found = {
        (level, index): bytes(value)
        for level, index, value in LogNode.objects.filter(match).values_list(
            "level", "index", "hash"
        )
    }
    missing = {(level, i) for level, indexes in by_level.items() for i in indexes} - found.keys()
    if missing:
        raise LookupError(f"the log is missing stored hashes {sorted(missing)[:3]}")
    return found


def _range_hashes(ranges: list[tuple[int, int]]) -> list[bytes]:
    """The tree hash of each [lo, hi) range."""
    parts = [_subtrees(lo, hi) for lo, hi in ranges]
    stored = _read(coord for part in parts for coord in part)
    out = []
    for part in parts:
        value = stored[part[-1]]
        for coord in reversed(part[:-1]):
            value = node_hash(stored[coord], value)
        out.append(value)
    return out


def log_size() -> int:
    """How many leaves the log holds: the newest format-2 checkpoint's size (the sealer appends
    leaves and that checkpoint in one transaction)."""
    newest = (
        Checkpoint.objects.filter(format__gte=LOG_FORMAT)
        .order_by("-seq")
        .values_list("size", flat=True)
        .first()
    )
    return newest or 0


def root_at(size: int) -> bytes:
    """The root of the tree of the first ``size`` leaves."""
    if size == 0:
        return _empty_root()
    return _range_hashes([(0, size)])[0]


def _empty_root() -> bytes:
    import hashlib

    return hashlib.sha256(b"").digest()


def append(leaves: list[bytes], *, size: int) -> tuple[int, bytes]:
    """Append leaf hashes to the log of ``size`` leaves, storing every subtree hash they
    complete. Call inside the sealer's transaction. Returns the new (size, root)."""
    frontier = [(level, index << level, value) for (level, index), value in _frontier(size)]
    nodes: list[tuple[int, int, bytes]] = []
    for leaf in leaves:
        level, start, value = 0, size, leaf
        nodes.append((0, size, leaf))
        while frontier and frontier[-1][0] == level:
            _, start, left = frontier.pop()
            value = node_hash(left, value)
            level += 1
            nodes.append((level, start >> level, value))
        frontier.append((level, start, value))
        size += 1
    _insert(_NODE_SQL, nodes)
    if not frontier:
        return size, _empty_root()
    root = frontier[-1][2]
    for _, _, left in reversed(frontier[:-1]):
        root = node_hash(left, root)
    return size, root


# The sealer holds the write lock while it appends (on SQLite, everybody's): plain
# executemany INSERTs of about three rows per leaf, not model instances (bench/seal.py).
_NODE_SQL = 'INSERT INTO attempts_lognode (level, "index", hash) VALUES (%s, %s, %s)'
_ENTRY_SQL = 'INSERT INTO attempts_logentry ("index", leaf_id) VALUES (%s, %s)'


def _insert(sql: str, rows: list[tuple]) -> None:
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 1000):
            cursor.executemany(sql, rows[start : start + 1000])


def record_entries(first_index: int, leaf_ids: list[int]) -> None:
    """Give the sealed leaves ``leaf_ids`` their places in the log, from ``first_index`` on."""
    _insert(_ENTRY_SQL, [(first_index + offset, pk) for offset, pk in enumerate(leaf_ids)])


def _frontier(size: int) -> list[tuple[tuple[int, int], bytes]]:
    coords = _subtrees(0, size)
    stored = _read(coords)
    return [(coord, stored[coord]) for coord in coords]


def _proof_ranges(index: int, size: int) -> list[tuple[int, int]]:
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    ranges = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo += k
    return list(reversed(ranges))


def inclusion_proof(index: int, size: int) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves (RFC 9162, 2.1.3.1)."""
    return _range_hashes(_proof_ranges(index, size))


def inclusion_proofs(indexes: Iterable[int], size: int) -> dict[int, list[bytes]]:
    """The audit paths of several leaves in the tree of ``size``, reading the stored hashes
    they need in one query (archives prove a batch of attempts at once)."""
    paths = {index: _proof_ranges(index, size) for index in indexes}
    flat = [r for ranges in paths.values() for r in ranges]
    hashes = dict(zip(flat, _range_hashes(flat), strict=True)) if flat else {}
    return {index: [hashes[r] for r in ranges] for index, ranges in paths.items()}


def consistency_proof(old: int, new: int) -> list[bytes]:
    """The proof that the tree of ``old`` leaves is a prefix of the tree of ``new`` leaves
    (RFC 9162, 2.1.4.1); empty when old is 0 or equal to new."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    if old in (0, new):
        return []
    ranges: list[tuple[int, int]] = []

    def sub(m: int, lo: int, hi: int, whole: bool) -> None:
        if m == hi - lo:
            if not whole:
                ranges.append((lo, hi))
            return
        k = _split(hi - lo)
        if m <= k:
            sub(m, lo, lo + k, whole)
            ranges.append((lo + k, hi))
        else:
            sub(m - k, lo + k, hi, False)
            ranges.append((lo, lo + k))

    sub(old, 0, new, True)
    return _range_hashes(ranges)


# ---------------------------------------------------------------------------------------------
# Tiles (C2SP tlog-tiles): tile L/N holds the hashes of tree level 8*L, nodes 256*N on.


@dataclass(frozen=True)
class TilePath:
    level: int
    index: int
    width: int | None  # None: a full tile

    @classmethod
    def parse(cls, path: str) -> TilePath:
        """``<L>/<N>[.p/<W>]`` with N in the spec's x-prefixed three-digit groups."""
        parts = path.split("/")
        width = None
        if len(parts) >= 3 and parts[-2].endswith(".p"):
            width = _decimal(parts[-1], "width")
            if not 0 < width < TILE_WIDTH:
                raise ValueError("a partial tile's width is 1 to 255")
            parts = [*parts[:-2], parts[-2][:-2]]
        if len(parts) < 2:
            raise ValueError("a tile path is <L>/<N>")
        level = _decimal(parts[0], "level")
        if level > 63:
            raise ValueError("no such tile level")
        groups = parts[1:]
        digits = []
        for position, group in enumerate(groups):
            last = position == len(groups) - 1
            body = group if last else group.removeprefix("x")
            if (not last and not group.startswith("x")) or len(body) != 3 or not body.isdigit():
                raise ValueError("a tile index is x-prefixed groups of three digits")
            digits.append(body)
        if len(groups) > 1 and digits[0] == "000":
            raise ValueError("a tile index has no leading zero groups")
        return cls(level, int("".join(digits)), width)

    def path(self) -> str:
        digits = f"{self.index:03d}"
        digits = "0" * (-len(digits) % 3) + digits
        groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
        text = "/".join([*(f"x{g}" for g in groups[:-1]), groups[-1]])
        suffix = f".p/{self.width}" if self.width is not None else ""
        return f"{self.level}/{text}{suffix}"


def _decimal(text: str, what: str) -> int:
    if not text.isdigit() or (text != "0" and text.startswith("0")) or len(text) > 20:
        raise ValueError(f"a tile {what} is a decimal without leading zeros")
    return int(text)


def tile(path: TilePath, size: int) -> bytes | None:
    """The tile's bytes within the tree of ``size`` leaves, or None if that tree has no such
    tile (a full tile of a level not yet complete, a wider partial tile than exists)."""
    level = path.level * TILE_HEIGHT
    available = (size >> level) - path.index * TILE_WIDTH
    width = TILE_WIDTH if path.width is None else path.width
    if available < width:
        return None
    start = path.index * TILE_WIDTH
    rows = list(
        LogNode.objects.filter(level=level, index__gte=start, index__lt=start + width)
        .order_by("index")
        .values_list("hash", flat=True)
    )
    if len(rows) != width:
        raise LookupError(f"the log is missing stored hashes of tile {path.path()}")
    return b"".join(bytes(row) for row in rows)


# ---------------------------------------------------------------------------------------------
# Keys and signing


@dataclass(frozen=True)
class Signer:
    """The log's signing key: ``verifier`` is its public half; ``sign`` returns a signature."""

    verifier: VerifierKey
    private: bytes | None = None  # the Ed25519 seed, for a key file
    command: str = ""

    def sign(self, text: str) -> bytes:
        if self.private is not None:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            signature = Ed25519PrivateKey.from_private_bytes(self.private).sign(text.encode())
        else:
            signature = self._run_command(text)
        if not ed25519_verify(self.verifier.public, text.encode(), signature):
            raise LogKeyError(
                "the signature does not verify with the log's verifier key "
                f"{self.verifier}: wrong key, or LEDGERWEB_TLOG_VERIFIER_KEY is not the signing "
                "command's"
            )
        return signature

    def _run_command(self, text: str) -> bytes:
        try:
            done = subprocess.run(  # noqa: S603 -- the operator's own configured command
                shlex.split(self.command),
                input=text.encode(),
                capture_output=True,
                timeout=SIGN_COMMAND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LogKeyError(f"the signing command failed to run: {exc}") from None
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip()[:200]
            raise LogKeyError(f"the signing command exited {done.returncode}: {error}")
        try:
            signature = base64.b64decode(done.stdout.strip(), validate=True)
        except ValueError:
            raise LogKeyError("the signing command did not print a base64 signature") from None
        if len(signature) != 64:
            raise LogKeyError("the signing command's signature is not 64 bytes (Ed25519)")
        return signature


def parse_private_key(text: str) -> tuple[VerifierKey, bytes]:
    """A signed-note private key ``PRIVATE+KEY+NAME+KEYID+BASE64(1 || SEED)`` (the form Go's
    ``note.GenerateKey`` writes): its verifier key and seed."""
    text = text.strip()
    if not text.startswith(PRIVATE_PREFIX):
        raise LogKeyError("the key file does not hold a PRIVATE+KEY+NAME+KEYID+BASE64 key")
    parts = text[len(PRIVATE_PREFIX) :].split("+", 2)  # base64 may hold "+" too
    try:
        name, wanted, raw = parts[0], bytes.fromhex(parts[1]), base64.b64decode(parts[2])
    except (IndexError, ValueError):
        raise LogKeyError("the key file's key is malformed") from None
    if len(parts) != 3 or len(raw) != 33 or raw[0] != ALG_ED25519 or not name:
        raise LogKeyError("the key file's key is not an Ed25519 signed-note key")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.from_private_bytes(raw[1:]).public_key().public_bytes_raw()
    verifier = VerifierKey(name, key_id(name, ALG_ED25519, public), ALG_ED25519, public)
    if verifier.id != wanted:
        raise LogKeyError("the key file's key id does not match its key")
    return verifier, raw[1:]


def generate_key(name: str) -> tuple[str, VerifierKey]:
    """A new signing key for log ``name``: (private key text, verifier key)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not name or any(c in name for c in " +\n\t"):
        raise LogKeyError("a key name has no spaces or '+'")
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw()
    public = private.public_key().public_bytes_raw()
    verifier = VerifierKey(name, key_id(name, ALG_ED25519, public), ALG_ED25519, public)
    encoded = base64.b64encode(bytes([ALG_ED25519]) + seed).decode()
    return f"{PRIVATE_PREFIX}{name}+{verifier.id.hex()}+{encoded}\n", verifier


def write_key_file(path: Path, name: str) -> VerifierKey:
    """Create ``path`` (mode 0600, never overwriting) with a new key; returns its verifier."""
    text, verifier = generate_key(name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    return verifier


def read_key_file(path: str | Path) -> Signer:
    """The signer of a key file; refuses one that group or others may read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise LogKeyError(f"cannot read the log signing key {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LogKeyError(
            f"the log signing key {path} has mode {stat.S_IMODE(mode):04o}; it must be readable "
            f"by its owner only (chmod 600 {path})"
        )
    verifier, seed = parse_private_key(text)
    return Signer(verifier, private=seed)


def signer() -> Signer | None:
    """The configured signing key, or None when none is set (checkpoints stay unsigned)."""
    config = settings.TLOG
    if config["KEY_FILE"] and config["SIGN_COMMAND"]:
        raise LogKeyError("set LEDGERWEB_TLOG_KEY_FILE or LEDGERWEB_TLOG_SIGN_COMMAND, not both")
    if config["KEY_FILE"]:
        return read_key_file(config["KEY_FILE"])
    if config["SIGN_COMMAND"]:
        if not config["VERIFIER_KEY"]:
            raise LogKeyError("LEDGERWEB_TLOG_SIGN_COMMAND needs LEDGERWEB_TLOG_VERIFIER_KEY")
        try:
            verifier = VerifierKey.parse(config["VERIFIER_KEY"])
        except NoteError as exc:
            raise LogKeyError(f"LEDGERWEB_TLOG_VERIFIER_KEY: {exc}") from None
        return Signer(verifier, command=config["SIGN_COMMAND"])
    return None


def verifier_keys() -> list[VerifierKey]:
    """The current signing key's verifier and every old one still trusted."""
    keys = []
    current = signer()
    if current is not None:
        keys.append(current.verifier)
    for text in settings.TLOG["OLD_VERIFIER_KEYS"]:
        keys.append(VerifierKey.parse(text))
    return keys


# ---------------------------------------------------------------------------------------------
# Checkpoint notes


def checkpoint_text(
    *, seq: int, size: int, root: bytes, config_length: int, config_head: str, authority: str
) -> str:
    """The text of a format-2 checkpoint's note (what the log key and witnesses sign)."""
    extensions = [f"{EXT_CHECKPOINT} {seq}", f"{EXT_CONFIG} {config_length} {config_head}"]
    if authority:
        extensions.append(f"{EXT_AUTHORITY} {authority}")
    return LogCheckpoint(settings.TLOG["ORIGIN"], size, root, tuple(extensions)).text()


def signed_note(checkpoint: Checkpoint) -> str | None:
    """The checkpoint's signed note with its cosignatures, or None while it is unsigned."""
    # "log" sorts before "witness": the log's own signatures come first.
    lines = list(checkpoint.signatures.order_by("kind", "id").values_list("kind", "line"))
    if not any(kind == CheckpointSignature.Kind.LOG for kind, _ in lines):
        return None
    return checkpoint.note + "\n" + "".join(line for _, line in lines)


def newest_signed() -> Checkpoint | None:
    """The newest format-2 checkpoint that carries a log signature."""
    return (
        Checkpoint.objects.filter(format__gte=LOG_FORMAT, signatures__kind="log")
        .order_by("-seq")
        .first()
    )


def _store_signature(
    checkpoint: Checkpoint, kind: str, signature: NoteSignature, now: dt.datetime
) -> bool:
    try:
        with transaction.atomic():
            CheckpointSignature.objects.create(
                checkpoint=checkpoint,
                kind=kind,
                name=signature.name,
                key_id=signature.id.hex(),
                line=signature.line(),
                created_at=now,
            )
    except IntegrityError:
        return False  # another worker stored the same key's signature first
    return True


def sign_pending(*, limit: int = 100, now: dt.datetime | None = None) -> int:
    """Sign the format-2 checkpoints the current key has not signed (oldest first). Runs after
    the sealer's transaction, outside its lock. Returns how many it signed; 0 with no key."""
    current = signer()
    if current is None:
        return 0
    now = now or timezone.now()
    signed = CheckpointSignature.objects.filter(
        kind="log", name=current.verifier.name, key_id=current.verifier.id.hex()
    ).values("checkpoint_id")
    pending = (
        Checkpoint.objects.filter(format__gte=LOG_FORMAT)
        .exclude(pk__in=signed)
        .order_by("seq")[:limit]
    )
    count = 0
    memory = _signer_state_path()
    for checkpoint in pending:
        _check_extends(memory, checkpoint)
        signature = current.sign(checkpoint.note)
        line = NoteSignature(current.verifier.name, current.verifier.id, signature)
        count += _store_signature(checkpoint, "log", line, now)
        _remember(memory, checkpoint)
    return count


# The signer keeps the newest tree it signed outside the database and signs a later checkpoint
# only with a consistency proof from it: someone who rewrites the database (and its hashes)
# cannot get the rewritten history signed. Only whoever can also replace this file can.


def _signer_state_path() -> Path:
    """LEDGERWEB_TLOG_SIGNER_STATE, else the data folder: the one place the server's processes
    may write (the shipped units' ProtectSystem=strict leaves the key's folder read-only)."""
    config = settings.TLOG
    if config["SIGNER_STATE"]:
        return Path(config["SIGNER_STATE"])
    return Path(settings.DATA_DIR) / "log_signer.state"


def _legacy_signer_state_path() -> Path | None:
    """Where releases before 0.2.0 kept the state with a key file: beside it. Read when the data
    folder has none yet, so an upgraded signer still refuses a rollback of what it signed."""
    config = settings.TLOG
    if config["SIGNER_STATE"] or not config["KEY_FILE"]:
        return None
    return Path(config["KEY_FILE"] + ".state")


def _read_state(memory: Path) -> tuple[int, bytes] | None:
    """(size, root) of the newest tree the signer signed, from its memory outside the
    database; None when it has signed nothing yet (or the file is not on this host)."""
    try:
        text = memory.read_text()
    except FileNotFoundError:
        legacy = _legacy_signer_state_path()
        if legacy is None or memory != _signer_state_path():
            return None
        try:
            text = legacy.read_text()
        except OSError:
            return None
        memory = legacy
    except OSError as exc:
        raise LogKeyError(f"cannot read the signer's state {memory}: {exc.strerror}") from None
    try:
        held = json.loads(text)
        return int(held["size"]), base64.b64decode(held["root"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise LogKeyError(f"the signer's state {memory} is malformed") from None


def signed_tree() -> tuple[Path, tuple[int, bytes] | None] | None:
    """Where the configured signer keeps the newest tree it signed, and that (size, root):
    what ``verify_audit`` pins the database's log to (it is kept outside the database). None
    when no signing key is configured."""
    if signer() is None:
        return None
    memory = _signer_state_path()
    return memory, _read_state(memory)


def _check_extends(memory: Path, checkpoint: Checkpoint) -> None:
    held = _read_state(memory)
    if held is None:
        return  # the first checkpoint this signer signs
    size, root = held
    if checkpoint.size < size:
        # An older checkpoint (a rotated key catching up): signed only if the tree already signed
        # extends it, proved against the remembered root, not the database's word.
        try:
            prefix = check_consistent(checkpoint.size, bytes.fromhex(checkpoint.root), size, root)
        except LookupError:
            prefix = False
        if prefix:
            return
        raise LogKeyError(
            f"refusing to sign checkpoint {checkpoint.seq}: its tree of {checkpoint.size} leaves "
            f"is smaller than the {size} this key signed before and not a prefix of it (a "
            "rollback)"
        )
    if checkpoint.size == size and bytes.fromhex(checkpoint.root) == root:
        return
    try:
        ok = check_consistent(size, root, checkpoint.size, bytes.fromhex(checkpoint.root))
    except LookupError:
        ok = False
    if not ok:
        raise LogKeyError(
            f"refusing to sign checkpoint {checkpoint.seq}: the log is not consistent with the "
            f"tree of {size} leaves this key signed before: history was rewritten"
        )


def _remember(memory: Path, checkpoint: Checkpoint) -> None:
    """Keep the newest tree signed: an older checkpoint signed later leaves it as it is."""
    held = _read_state(memory)
    if held is not None and held[0] > checkpoint.size:
        return
    data = json.dumps(
        {"size": checkpoint.size, "root": base64.b64encode(bytes.fromhex(checkpoint.root)).decode()}
    )
    temporary = memory.with_name(memory.name + ".tmp")
    try:
        temporary.write_text(data)
        os.replace(temporary, memory)
    except OSError as exc:
        raise LogKeyError(f"cannot write the signer's state {memory}: {exc.strerror}") from None


# ---------------------------------------------------------------------------------------------
# Witnesses


@dataclass(frozen=True)
class Witness:
    key: VerifierKey
    url: str


def witnesses() -> list[Witness]:
    """The configured witnesses (``VERIFIER_KEY URL`` items)."""
    out = []
    for item in settings.TLOG["WITNESSES"]:
        parts = item.split()
        if len(parts) != 2:
            raise LogKeyError(f"a witness is 'VERIFIER_KEY URL'; got {item!r}")
        key = VerifierKey.parse(parts[0])
        if key.alg not in (ALG_ED25519, 4):
            raise LogKeyError(f"witness {key.name}: unsupported key")
        out.append(Witness(key, parts[1].rstrip("/")))
    return out


def quorum() -> int:
    """How many witness cosignatures make a checkpoint witnessed."""
    configured = witnesses()
    return min(settings.TLOG["WITNESS_QUORUM"], len(configured)) if configured else 0


class _Deadline(Exception):
    pass


def _post(url: str, body: bytes, *, timeout: float) -> tuple[int, str, str]:
    """POST with a deadline on the whole request (connect, send, every read), not per read."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline
        return remaining

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a witness URL is http(s)://host/...; got {url!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=left())
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("POST", path, body=body, headers={"Content-Type": "text/plain"})
        if connection.sock is not None:
            connection.sock.settimeout(left())
        response = connection.getresponse()
        chunks = []
        total = 0
        while True:
            if connection.sock is not None:
                connection.sock.settimeout(left())
            chunk = response.read1(65536) if hasattr(response, "read1") else response.read()
            if not chunk:
                break
            total += len(chunk)
            if total > 1 << 20:
                raise ValueError("the witness answered more than 1 MiB")
            chunks.append(chunk)
        text = b"".join(chunks).decode("utf-8", errors="replace")
        return response.status, response.getheader("Content-Type") or "", text
    finally:
        connection.close()


def publish(*, now: dt.datetime | None = None) -> dict[str, str]:
    """Submit the newest signed checkpoint to every configured witness that has not cosigned it
    and store their cosignatures. Returns each witness's status. Never raises for a witness."""
    results = {}
    newest = newest_signed()
    if newest is None:
        return results
    note = signed_note(newest)
    assert note is not None
    configured = witnesses()
    if configured:
        # What a witness cosigns must survive a failover of the database (docs/scaling.md).
        replication.make_durable()
    for witness in configured:
        try:
            results[witness.key.name] = _publish_one(witness, newest, note, now or timezone.now())
        except Exception as exc:  # a witness must never stop the worker
            log.exception("publishing to witness %s failed", witness.key.name)
            _record(witness, status="unreachable", message=f"publishing failed: {exc}")
            results[witness.key.name] = "unreachable"
    return results


def _record(witness: Witness, **fields: Any) -> None:
    WitnessState.objects.update_or_create(
        name=witness.key.name, defaults={**fields, "checked_at": timezone.now()}
    )


def _publish_one(witness: Witness, checkpoint: Checkpoint, note: str, now: dt.datetime) -> str:
    state, _ = WitnessState.objects.get_or_create(name=witness.key.name)
    already = checkpoint.signatures.filter(
        kind="witness", name=witness.key.name, key_id=witness.key.id.hex()
    ).exists()
    if already and state.size == checkpoint.size:
        if state.status != "ok":
            _record(witness, status="ok", message="")
        return "ok"
    # The size the witness last cosigned (stored only from a cosignature that verified) is
    # where to start; a 409's size is the witness's unauthenticated word, a hint to retry
    # from within this pass and never stored, so one wrong answer cannot stop witnessing.
    old = state.size if state.size <= checkpoint.size else 0
    for _ in range(2):  # a 409 tells us the size the witness holds; one retry from there
        if old > checkpoint.size:
            message = (
                f"the witness says it holds a tree of {old} leaves, larger than this log's "
                f"{checkpoint.size}: the log was rolled back or forked, or the witness is wrong "
                "(asked again at the next pass)"
            )
            _record(witness, status="refused", message=message)
            return "refused"
        proof = consistency_proof(old, checkpoint.size) if old else []
        body = f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof)
        body += "\n" + note
        try:
            code, kind, text = _post(
                witness.url + "/add-checkpoint",
                body.encode(),
                timeout=settings.TLOG["WITNESS_TIMEOUT"],
            )
        except (_Deadline, TimeoutError):
            _record(witness, status="unreachable", message="no answer within the deadline")
            return "unreachable"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            _record(witness, status="unreachable", message=f"cannot reach the witness: {exc}")
            return "unreachable"
        if code == 409 and kind.startswith("text/x.tlog.size") and text.strip().isdigit():
            held = int(text.strip())
            if held == old:
                break  # same size, other root: a fork
            old = held
            continue
        if code == 200:
            return _cosigned(witness, checkpoint, text, now)
        break
    _record(
        witness,
        status="refused",
        message=f"the witness refused checkpoint {checkpoint.seq} (size {checkpoint.size}) "
        f"with HTTP {code}: {text.strip()[:200]}",
    )
    return "refused"


def _cosigned(witness: Witness, checkpoint: Checkpoint, text: str, now: dt.datetime) -> str:
    stored = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            _, (signature,) = split_note("x\n\n" + line + "\n")
        except (NoteError, ValueError):
            continue
        if note_signed_by(checkpoint.note, signature, witness.key):
            _store_signature(checkpoint, "witness", signature, now)
            stored += 1
    if not stored:
        _record(
            witness,
            status="refused",
            message="the witness answered without a cosignature that verifies with its key",
        )
        return "refused"
    _record(witness, size=checkpoint.size, status="ok", message="")
    return "ok"


def _unsigned(newest: Checkpoint | None, signed: Checkpoint | None) -> int:
    """Format-2 checkpoints after the newest signed one: sequence numbers run without gaps, so
    a subtraction, not a count over every checkpoint."""
    if newest is None:
        return 0
    if signed is not None:
        return newest.seq - signed.seq
    first = (
        Checkpoint.objects.filter(format__gte=LOG_FORMAT)
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    return newest.seq - first + 1


def status() -> dict[str, Any]:
    """The log as /metrics, /healthz and the audit page show it."""
    newest = Checkpoint.objects.filter(format__gte=LOG_FORMAT).order_by("-seq").first()
    signed = newest_signed()
    try:
        configured = witnesses()
        need = quorum()
        problem = ""
    except (LogKeyError, NoteError) as exc:
        configured, need, problem = [], 0, str(exc)
    states = {
        w.name: w for w in WitnessState.objects.filter(name__in=[w.key.name for w in configured])
    }
    cosigners = set()
    if signed is not None:
        cosigners = set(signed.signatures.filter(kind="witness").values_list("name", flat=True))
    rows = []
    for witness in configured:
        state = states.get(witness.key.name)
        size = state.size if state else 0
        rows.append(
            {
                "name": witness.key.name,
                "url": witness.url,
                "size": size,
                "behind": max(0, (signed.size if signed else 0) - size),
                "status": state.status if state else "behind",
                "message": state.message if state else "not contacted yet",
                "checked_at": state.checked_at if state else None,
                "cosigned_newest": witness.key.name in cosigners,
            }
        )
    return {
        "size": newest.size if newest else 0,
        "checkpoint": newest.seq if newest else None,
        "signed_size": signed.size if signed else 0,
        "signed_checkpoint": signed.seq if signed else None,
        "unsigned": _unsigned(newest, signed),
        "witnesses": rows,
        "quorum": need,
        "witnessed": len(cosigners & {w.key.name for w in configured}) >= need if need else None,
        "problem": problem,
    }


# ---------------------------------------------------------------------------------------------
# Receipts


def receipt(attempt: Attempt) -> dict[str, Any]:
    """The attempt's receipt: its sealed chain head (the leaf), the newest signed (and
    cosigned) checkpoint and the inclusion proof of the leaf in it. Raises NotSealed."""
    if not attempt.sealed:
        raise NotSealed("the attempt has changes that are not sealed into a checkpoint yet")
    leaf = (
        CheckpointLeaf.objects.filter(attempt_id=attempt.attempt_id, log_entry__isnull=False)
        .select_related("log_entry")
        .order_by("-checkpoint__seq")
        .first()
    )
    if leaf is None or leaf.length != attempt.chain_length:
        raise NotSealed("the attempt's current state is not in the log yet")
    index = leaf.log_entry.index
    checkpoint = newest_signed()
    if checkpoint is None or checkpoint.size <= index:
        raise NotSealed("no signed checkpoint covers the attempt's current state yet")
    note = signed_note(checkpoint)
    # What the leaf commits to, so an agent can recompute it from what it sent: each event as
    # its hash covers it (format 3: no free text, only its salted digest), and the salt of the
    # arguments' digest, unless erasure replaced it (the agent already holds the arguments).
    events = attempt.events.order_by("id")[: leaf.length]
    rows = [event.export_row(attempt.attempt_id) for event in events]
    erased = any(row["action"] == ERASURE_ACTION for row in rows)
    return {
        "format": RECEIPT_FORMAT,
        "version": RECEIPT_VERSION,
        "attempt_id": attempt.attempt_id,
        "leaf": {"attempt_id": leaf.attempt_id, "length": leaf.length, "head": leaf.head},
        "index": index,
        "tree_size": checkpoint.size,
        "checkpoint": note,
        "inclusion_proof": [
            base64.b64encode(h).decode() for h in inclusion_proof(index, checkpoint.size)
        ],
        "witnesses": sorted(
            set(checkpoint.signatures.filter(kind="witness").values_list("name", flat=True))
        ),
        "events": [event_payload(row) for row in rows],
        "args_salt": None if erased else attempt.args_salt or None,
    }


def check_consistent(old_size: int, old_root: bytes, new_size: int, new_root: bytes) -> bool:
    """Whether the stored log proves (old_size, old_root) a prefix of (new_size, new_root)."""
    return consistent(old_size, old_root, new_size, new_root, consistency_proof(old_size, new_size))


def witness_problems() -> list[Problem]:
    """``[witness]`` problems for verify_audit: a configured witness refused the log's newest
    checkpoint (a fork or a rollback after what it cosigned), or the newest signed checkpoint
    is not witnessed by the quorum. A witness that is only unreachable is a note on /healthz."""
    problems = []
    current = status()
    for row in current["witnesses"]:
        if row["status"] == "refused":
            problems.append(Problem("witness", f"witness {row['name']} refused: {row['message']}"))
    return problems
