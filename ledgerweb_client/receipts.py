"""Check a ledgerweb receipt without the server: the checkpoint note is signed by the log's key
(C2SP signed-note, Ed25519) and cosigned by enough witnesses (C2SP tlog-cosignature), and the
attempt's sealed state (attempt id, chain length, newest event hash) is in its tree (RFC 9162
inclusion proof). A ``LogView`` keeps the newest checkpoint it verified and checks that each
next one extends it (RFC 9162 consistency proof): the history cannot be rewritten behind it.

Ed25519 needs the ``cryptography`` package: ``pip install 'ledgerweb-client[verify]'``. The
rest is the standard library. The formats are the server's (docs/audit-chain.md); this is an
independent implementation of them, so a client need not trust the server's code. The server's
own is ``attempts/verify_export.py``; tests/client/test_receipts_formats.py in the server's
repository holds the two to the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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


def _number(value: int | float) -> str:
    """A JSON number as RFC 8785 writes it (ECMAScript's Number.prototype.toString)."""
    if isinstance(value, int):
        if abs(value) > 2**53 - 1:
            raise ReceiptError(f"the integer {value} is outside what RFC 8785 can write exactly")
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ReceiptError("NaN and infinities are not JSON")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # n: where the decimal point falls after the shortest digits (value = 0.DIGITS x 10^n)
    point = len(whole) + int(exponent or 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        return sign + digits + "0" * (point - k)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    shown = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{shown}e{'+' if point - 1 > 0 else '-'}{abs(point - 1)}"


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical JSON: what the server hashes (an independent implementation,
    standard library only)."""
    return _canonical(value).encode()


def _canonical(value: Any) -> str:
    if value is None or value is True or value is False:
        return json.dumps(value)
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(item) for item in value) + "]"
    if isinstance(value, Mapping):
        keys = sorted(value, key=lambda key: str(key).encode("utf-16-be"))
        if not all(isinstance(key, str) for key in keys):
            raise ReceiptError("JSON object keys must be strings")
        return "{" + ",".join(f"{_canonical(k)}:{_canonical(value[k])}" for k in keys) + "}"
    raise ReceiptError(f"not JSON: {type(value).__name__}")


GENESIS = "0" * 64
SALTED_FORMAT = 3
SENT_FIELDS = ("tenant", "task_id", "tool_name", "idempotency_key")


def _salted(salt: str, value: Any) -> str:
    return hmac.new(bytes.fromhex(salt), canonical_json(value), hashlib.sha256).hexdigest()


def check_history(receipt: Mapping[str, Any], *, sent: Mapping[str, Any] | None = None) -> None:
    """Recompute what the receipt's leaf commits to: each event the receipt carries, as its
    hash covers it, links to the one before it from the first, and the last hashes to the
    leaf's head. With ``sent`` (what the agent sent: any of tenant, task_id, tool_name,
    idempotency_key, args), the attempt's creation event must record exactly that, the
    arguments through their (salted) digest. Raises ``ReceiptError``."""
    events = receipt.get("events")
    if events is None:
        raise ReceiptError(
            "the receipt carries no events (a server older than 0.2.0): what its leaf commits "
            "to cannot be checked"
        )
    leaf = receipt["leaf"]
    if len(events) != int(leaf["length"]):
        raise ReceiptError(
            f"the receipt carries {len(events)} events for a leaf of {leaf['length']}"
        )
    prev = GENESIS
    for number, covered in enumerate(events, 1):
        if covered.get("attempt_id") != leaf["attempt_id"]:
            raise ReceiptError(f"event {number} of the receipt is another attempt's")
        if covered.get("prev_hash") != prev:
            raise ReceiptError(f"event {number} of the receipt does not follow the one before it")
        prev = hashlib.sha256(canonical_json(covered)).hexdigest()
    if prev != leaf["head"]:
        raise ReceiptError("the receipt's events do not hash to the leaf's head")
    if not sent or not events:
        return
    created = events[0]
    details = created.get("details")
    if created.get("action") != "attempt.created" or not isinstance(details, dict):
        raise ReceiptError("the history's first event is not the attempt's creation")
    for name in SENT_FIELDS:
        if name in sent and details.get(name) != sent[name]:
            raise ReceiptError(
                f"the history records {name} {details.get(name)!r}, not the {sent[name]!r} sent"
            )
    if "args" not in sent:
        return
    salt = receipt.get("args_salt")
    if int(created.get("v", 2)) >= SALTED_FORMAT:
        if not salt:
            raise ReceiptError("the receipt carries no salt: the arguments cannot be checked")
        matches = details.get("args_digest") == _salted(salt, {"args": sent["args"]})
    else:
        matches = (
            details.get("args_hash") == hashlib.sha256(canonical_json(sent["args"])).hexdigest()
        )
    if not matches:
        raise ReceiptError("the history does not commit to the arguments sent")


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
    sent: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Verify an attempt's receipt (``LedgerClient.receipt``) with the log's verifier key(s):
    the checkpoint is signed (and cosigned), the leaf is in its tree, and the events the
    receipt carries hash to the leaf (``check_history``; with ``sent``, they record what the
    agent sent). Returns the verified checkpoint; raises ``ReceiptError`` when anything does
    not hold."""
    keys = [verifier_key] if isinstance(verifier_key, str | VerifierKey) else list(verifier_key)
    try:
        checkpoint = open_checkpoint(
            receipt["checkpoint"], keys, witness_keys=witness_keys, quorum=quorum
        )
        leaf = receipt["leaf"]
        if leaf["attempt_id"] != receipt["attempt_id"]:
            raise ReceiptError("the receipt's leaf is another attempt's")
        check_history(receipt, sent=sent)
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
