"""Check a ledgerweb receipt without the server: the checkpoint note is signed by the log's key
(C2SP signed-note, Ed25519) and cosigned by enough witnesses (C2SP tlog-cosignature), and the
attempt's sealed state (attempt id, chain length, newest event hash) is in its tree (RFC 9162
inclusion proof). A ``LogView`` keeps the newest checkpoint it verified and checks that each
next one extends it (RFC 9162 consistency proof): the history cannot be rewritten behind it.

Ed25519 needs the ``cryptography`` package: ``pip install 'ledgerweb-client[verify]'``. The
rest is the standard library. The formats are the server's (docs/audit-chain.md); this is an
independent implementation of them, so a client need not trust the server's code.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04


class ReceiptError(ValueError):
    """A receipt, checkpoint or key that is malformed or does not verify."""


def _ed25519_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        raise ReceiptError(
            "verifying receipts needs the cryptography package: "
            "pip install 'ledgerweb-client[verify]'"
        ) from None
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class VerifierKey:
    """A signed-note verifier key ``NAME+KEYID+BASE64(ALG || KEY)``."""

    name: str
    id: bytes
    alg: int
    public: bytes

    @classmethod
    def parse(cls, text: str | VerifierKey) -> VerifierKey:
        if isinstance(text, VerifierKey):
            return text
        parts = text.strip().split("+", 2)
        try:
            wanted, raw = bytes.fromhex(parts[1]), base64.b64decode(parts[2], validate=True)
        except (IndexError, ValueError):
            raise ReceiptError(f"not a verifier key NAME+KEYID+BASE64: {text[:60]!r}") from None
        if not parts[0] or len(wanted) != 4 or len(raw) != 33:
            raise ReceiptError(f"not an Ed25519 verifier key: {text[:60]!r}")
        key = cls(parts[0], wanted, raw[0], raw[1:])
        digest = hashlib.sha256(key.name.encode() + b"\n" + raw).digest()[:4]
        if key.alg not in (ALG_ED25519, ALG_COSIGNATURE_V1) or digest != wanted:
            raise ReceiptError(f"the key id of {key.name} does not match its key")
        return key

    def signed(self, text: str, name: str, key_id: bytes, signature: bytes) -> bool:
        if name != self.name or key_id != self.id:
            return False
        if self.alg == ALG_ED25519:
            return _ed25519_verify(self.public, text.encode(), signature)
        if len(signature) != 72:
            return False
        stamp = int.from_bytes(signature[:8], "big")
        message = f"cosignature/v1\ntime {stamp}\n{text}".encode()
        return _ed25519_verify(self.public, message, signature[8:])


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: origin, tree size, root hash, and who cosigned it."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...]
    witnesses: tuple[str, ...]
    note: str


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def leaf_hash(attempt_id: str, length: int, head: str) -> bytes:
    """The log's leaf for an attempt's sealed state: SHA-256(0x00 || RFC 8785 JSON)."""
    # RFC 8785 of this object (ASCII id and hex head, an integer) is sorted, compact JSON.
    text = json.dumps(
        {"attempt_id": attempt_id, "head": head, "length": int(length)},
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(b"\x00" + text.encode()).digest()


def open_checkpoint(
    note: str,
    verifier_keys: Iterable[str | VerifierKey],
    *,
    witness_keys: Iterable[str | VerifierKey] = (),
    quorum: int = 0,
) -> Checkpoint:
    """Verify a checkpoint note: signed by one of ``verifier_keys`` (old keys too, after a
    rotation), cosigned by at least ``quorum`` of ``witness_keys``."""
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise ReceiptError("not a signed note")
    text, block = note[: cut + 1], note[cut + 2 :]
    signatures = []
    for line in block.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "\u2014":
            raise ReceiptError(f"a malformed signature line: {line[:60]!r}")
        try:
            raw = base64.b64decode(parts[2], validate=True)
        except ValueError:
            raise ReceiptError("a signature line is not base64") from None
        signatures.append((parts[1], raw[:4], raw[4:]))
    lines = text.split("\n")
    if len(lines) < 4 or not lines[1].isdigit():
        raise ReceiptError("not a checkpoint (origin, size, root)")
    try:
        root = base64.b64decode(lines[2], validate=True)
    except ValueError:
        raise ReceiptError("the checkpoint's root is not base64") from None
    keys = [VerifierKey.parse(k) for k in verifier_keys]
    if not any(k.signed(text, *s) for k in keys for s in signatures):
        raise ReceiptError("the checkpoint is not signed by the log's verifier key")
    witnesses = [VerifierKey.parse(k) for k in witness_keys]
    cosigned = tuple(sorted({w.name for w in witnesses for s in signatures if w.signed(text, *s)}))
    if len(cosigned) < quorum:
        raise ReceiptError(
            f"the checkpoint has {len(cosigned)} known witness cosignatures, quorum is {quorum}"
        )
    return Checkpoint(lines[0], int(lines[1]), root, tuple(lines[3:-1]), cosigned, note)


def inclusion_root(leaf: bytes, index: int, size: int, proof: list[bytes]) -> bytes | None:
    """RFC 9162, 2.1.3.2: the root the proof leads to, or None."""
    if not 0 <= index < size:
        return None
    fn, sn, value = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            value = _node(sibling, value)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            value = _node(value, sibling)
        fn, sn = fn >> 1, sn >> 1
    return value if sn == 0 else None


def consistent(old: int, old_root: bytes, new: int, new_root: bytes, proof: list[bytes]) -> bool:
    """RFC 9162, 2.1.4.2: whether the tree (old, old_root) is a prefix of (new, new_root)."""
    if old == new:
        return old_root == new_root and not proof
    if old == 0:
        return not proof
    if old > new or not proof:
        return False
    path = ([old_root] if old & (old - 1) == 0 else []) + list(proof)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for value in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(value, fr), _node(value, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = _node(sr, value)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == new_root


def hashes(values: Iterable[str]) -> list[bytes]:
    out = []
    for value in values:
        raw = base64.b64decode(value, validate=True)
        if len(raw) != 32:
            raise ReceiptError("a proof hash is not 32 bytes")
        out.append(raw)
    return out


def verify_receipt(
    receipt: Mapping[str, Any],
    verifier_key: str | VerifierKey | Iterable[str | VerifierKey],
    *,
    witness_keys: Iterable[str | VerifierKey] = (),
    quorum: int = 0,
) -> Checkpoint:
    """Verify an attempt's receipt (``LedgerClient.receipt``) with the log's verifier key(s).
    Returns the verified checkpoint; raises ``ReceiptError`` when anything does not hold."""
    keys = [verifier_key] if isinstance(verifier_key, str | VerifierKey) else list(verifier_key)
    try:
        checkpoint = open_checkpoint(
            receipt["checkpoint"], keys, witness_keys=witness_keys, quorum=quorum
        )
        leaf = receipt["leaf"]
        if leaf["attempt_id"] != receipt["attempt_id"]:
            raise ReceiptError("the receipt's leaf is another attempt's")
        value = leaf_hash(leaf["attempt_id"], leaf["length"], leaf["head"])
        root = inclusion_root(
            value, int(receipt["index"]), checkpoint.size, hashes(receipt["inclusion_proof"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ReceiptError):
            raise
        raise ReceiptError(f"malformed receipt: {exc!r}") from None
    if root != checkpoint.root:
        raise ReceiptError(
            "the inclusion proof does not lead to the signed root: the attempt's sealed state "
            "is not in the history the log signed"
        )
    return checkpoint


@dataclass
class LogView:
    """The newest checkpoint this client verified (keep ``size`` and ``root`` between runs,
    e.g. in a file): ``advance`` accepts a newer one only with a valid consistency proof."""

    size: int = 0
    root: bytes = hashlib.sha256(b"").digest()

    def advance(self, checkpoint: Checkpoint, proof: list[bytes]) -> None:
        if checkpoint.size < self.size:
            raise ReceiptError(
                f"the log shows a tree of {checkpoint.size} leaves after one of {self.size}: "
                "it was rolled back"
            )
        if not consistent(self.size, self.root, checkpoint.size, checkpoint.root, proof):
            raise ReceiptError(
                f"the checkpoint of size {checkpoint.size} is not consistent with the one of "
                f"size {self.size} verified before: the history was rewritten (a fork)"
            )
        self.size, self.root = checkpoint.size, checkpoint.root
