"""The client's receipt checker (``ledgerweb_client/receipts.py``) and the standalone verifier
(``attempts/verify_export.py``) are two independent implementations of the same hash formats:
RFC 8785 JSON, the salted digests, the log's leaves and its Merkle proofs. Held to each other
here, on the same inputs, so neither can drift from the other."""

from __future__ import annotations

import hashlib
import random

import pytest
import rfc8785

from attempts import verify_export
from ledgerweb_client import receipts

# Does not depend on the database: one pass runs it.
pytestmark = pytest.mark.one_database("postgres")

TRICKY_NUMBERS = [
    0,
    -0.0,
    1,
    -1,
    2**53 - 1,
    -(2**53 - 1),
    0.1,
    1e21,
    1e20,
    123456789012345680000.0,
    1e-6,
    1e-7,
    5e-324,
    1.7976931348623157e308,
    333333333.3333333,
    -1.5e-9,
]


def _values(count: int) -> list[object]:
    rng = random.Random(43)
    words = ["", "a", "é", "\u20ac", "\U0001f600", "\ufb33", '\r\n\t"\\', "\x7f", "\x00"]
    out: list[object] = list(TRICKY_NUMBERS)
    for _ in range(count):
        out.append(rng.uniform(-1e30, 1e30) * 10 ** rng.randint(-300, 0))
        out.append(rng.randint(-(2**53) + 1, 2**53 - 1))
        keys = rng.sample(words, 4) + ["\U0001f600a", "\ufb33b"]
        out.append(
            {
                k: [rng.random(), None, True, False, rng.choice(words), {"n": rng.random()}]
                for k in keys
            }
        )
    return out


def test_both_write_the_same_canonical_json() -> None:
    for value in _values(300):
        assert receipts.canonical_json(value) == rfc8785.dumps(value), value


def test_both_refuse_what_rfc_8785_cannot_write() -> None:
    for value in (float("nan"), float("inf"), 2**53, {1: "not a string key"}):
        with pytest.raises(receipts.ReceiptError):
            receipts.canonical_json(value)
        with pytest.raises(rfc8785.CanonicalizationError):
            rfc8785.dumps(value)


def test_both_hash_a_leaf_and_a_salted_digest_alike() -> None:
    head = hashlib.sha256(b"head").hexdigest()
    for attempt_id, length in (("att_01", 1), ("att_ÿ", 12), ("a" * 32, 2**40)):
        assert receipts.leaf_hash(attempt_id, length, head) == verify_export.leaf_hash(
            attempt_id, length, head
        )
    salt = "00" * 16
    for value in ({"args": {"amount": 1.5, "to": "é"}}, "", {"reason": "x", "details": {}}):
        assert receipts._salted(salt, value) == verify_export.salted_digest(salt, value)


def _subproof(tree: verify_export.MerkleTree, m: int, lo: int, hi: int, whole: bool) -> list:
    """RFC 9162, 2.1.4.1 SUBPROOF over the verifier's tree (a consistency proof generator)."""
    n = hi - lo
    if m == n:
        return [] if whole else [tree._root(lo, hi)]
    k = verify_export._split(n)
    if m <= k:
        return _subproof(tree, m, lo, lo + k, whole) + [tree._root(lo + k, hi)]
    return _subproof(tree, m - k, lo + k, hi, False) + [tree._root(lo, lo + k)]


def test_both_check_merkle_proofs_alike() -> None:
    leaves = [verify_export.leaf_hash(f"att_{i}", i + 1, "0" * 64) for i in range(19)]
    wrong = hashlib.sha256(b"wrong").digest()
    for size in range(1, len(leaves) + 1):
        tree = verify_export.MerkleTree(leaves[:size])
        root = bytes.fromhex(tree.root())
        for index in range(size):
            proof = [bytes.fromhex(h) for h in tree.proof(index)]
            for leaf, path in ((leaves[index], proof), (wrong, proof), (leaves[index], proof[1:])):
                ours = receipts.inclusion_root(leaf, index, size, path)
                assert ours == verify_export.inclusion_root(leaf, index, size, path)
            assert receipts.inclusion_root(leaves[index], index, size, proof) == root
        for old in range(1, size + 1):
            old_root = bytes.fromhex(verify_export.MerkleTree(leaves[:old]).root())
            proof = _subproof(tree, old, 0, size, True) if old < size else []
            for path, left in ((proof, old_root), (proof[:-1], old_root), (proof, wrong)):
                ours = receipts.consistent(old, left, size, root, path)
                assert ours == verify_export.consistent(old, left, size, root, path)
            assert receipts.consistent(old, old_root, size, root, proof)
