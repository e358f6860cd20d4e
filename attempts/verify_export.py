#!/usr/bin/env python3
"""Check a ledgerweb audit export without ledgerweb, Django or a database.

An auditor who does not trust the server copies this one file and runs::

    python verify_export.py audit.jsonl [--expect-head CHECKPOINT_HASH ...]
    python verify_export.py audit.csv [--manifest audit.csv.manifest.json]

It needs only the Python standard library and the ``rfc8785`` package (the RFC 8785 JSON
canonicalization the chain hashes). It recomputes every event's hash from its fields, follows each
attempt's ``prev_hash`` links, checks the checkpoints (each hashing the one before) and each
attempt's seal (a Merkle proof that a checkpoint covers its head, which must be the attempt's event
at that place), checks the manifest (counts, first and last event, pinned checkpoint, and for CSV
the file's SHA-256), and names the first problem. Exit status 0 means the export verifies; 1 means
it does not; 2 means it could not be read.

The hash formats here are the only implementation: ``attempts.chain`` writes with them and
``attempts.audit_verify`` checks the live database with them. See docs/audit-chain.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rfc8785

GENESIS = "0" * 64
# Format 1: an event links to the event before it in the whole ledger (ledgers written before
# per-attempt chains). Format 2: an event links to the event before it of the same attempt.
LEGACY_FORMAT = 1
CHAIN_FORMAT = 2
CHECKPOINT_FORMAT = 1
CONFIG_FORMAT = 1
EXPORT_FORMAT = "ledgerweb-audit-export"
EXPORT_VERSION = 2

# The fields an event's hash covers (with ``v`` and ``prev_hash``); everything else in an export
# row (tenant, tool, the attempt's current state) is a convenience copy and is not proven.
HASHED_FIELDS = (
    "attempt_id",
    "action",
    "actor_kind",
    "actor",
    "from_state",
    "to_state",
    "reason",
    "details",
    "created_at",
)
# CSV columns, in order. The first columns are the hashed ones so a reader sees the proof first.
CSV_COLUMNS = (
    "event_id",
    *HASHED_FIELDS,
    "v",
    "prev_hash",
    "hash",
    "tenant",
    "tool_name",
    "idempotency_key",
    "attempt_state",
    "provider_request_id",
)
# A cell starting with one of these is read as a formula by spreadsheets; it gets a leading quote.
# A leading quote is itself quoted so the escaping can be undone exactly.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def chain_time(value: Any) -> str:
    """The one text form of a timestamp inside the chain: UTC, microseconds, ``Z``.

    Accepts a datetime, the chain's own text form, or the text SQLite stores
    (``YYYY-MM-DD HH:MM:SS[.ffffff]`` in UTC).
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset():
            value = value.astimezone(dt.UTC)
        if value.year < 1000:  # strftime writes such a year unpadded: keep its exact text
            return value.replace(tzinfo=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        # isoformat is C code (strftime was a large part of a verifier's time per event)
        return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
    text = str(value)
    if len(text) == 27 and text[10] == "T" and text.endswith("Z"):
        return text
    if len(text) == 26 and text[10] == " ":  # SQLite with microseconds: the common case, fast
        return f"{text[:10]}T{text[11:]}Z"
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return chain_time(parsed)


def event_payload(row: dict[str, Any]) -> dict[str, Any]:
    """What an event's hash covers: its fields, its chain format ``v`` and ``prev_hash``."""
    return {
        "v": int(row.get("v", CHAIN_FORMAT)),
        "attempt_id": row["attempt_id"],
        "action": row["action"],
        "actor_kind": row["actor_kind"],
        "actor": row["actor"],
        "from_state": row["from_state"],
        "to_state": row["to_state"],
        "reason": row["reason"],
        "details": row["details"],
        "created_at": chain_time(row["created_at"]),
        "prev_hash": row["prev_hash"],
    }


def event_hash(row: dict[str, Any], *, dumps: Callable[[Any], bytes] = rfc8785.dumps) -> str:
    """Recompute an event's hash from its fields. ``dumps`` is the RFC 8785 encoder: the
    reference here; the writer passes its faster twin (``attempts.jcs``), held to the same
    bytes by tests, and every verifier recomputes with the reference."""
    return hashlib.sha256(dumps(event_payload(row))).hexdigest()


CONFIG_FIELDS = ("seq", "subject", "action", "actor_kind", "actor", "before", "after", "reason")


def config_event_hash(row: dict[str, Any]) -> str:
    """Recompute a configuration change's hash: its fields, ``created_at`` and ``prev_hash``
    (the previous change's hash, GENESIS for the first)."""
    payload = {name: row[name] for name in CONFIG_FIELDS}
    payload.update(
        v=CONFIG_FORMAT, created_at=chain_time(row["created_at"]), prev_hash=row["prev_hash"]
    )
    return hashlib.sha256(rfc8785.dumps(payload)).hexdigest()


# ---------------------------------------------------------------------------------------------
# What the configuration history says who may do what is (attempts.config_history writes it).

# A baseline: the kinds in ``after["kinds"]`` are what the ``snapshot`` events after it say.
AUTHORITY_SUBJECT = "authority"
AUTHORITY_BASELINE = "authority.baseline"
# The actions that state what a row is: its whole record (snapshot, created), the fields that
# changed (changed), or that it is gone (deleted). Other actions (password.set, config.*) say
# something happened and change no recorded value.
AUTHORITY_ACTIONS = frozenset({"snapshot", "created", "changed", "deleted"})


def authority_state(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Replay configuration changes (in ``seq`` order; each with subject, action and after)
    into what they say the authority rows are now: subject -> recorded fields."""
    state: dict[str, dict[str, Any]] = {}
    for event in events:
        subject, action, after = event["subject"], event["action"], event["after"]
        if isinstance(after, str):
            after = json.loads(after)
        if action == AUTHORITY_BASELINE and subject == AUTHORITY_SUBJECT:
            kinds = set((after or {}).get("kinds", []))
            for name in [s for s in state if s.split(":", 1)[0] in kinds]:
                del state[name]
        elif action not in AUTHORITY_ACTIONS:
            continue
        elif action == "deleted":
            state.pop(subject, None)
        elif action == "changed" and subject in state:
            state[subject] = {**state[subject], **(after or {})}
        else:
            state[subject] = dict(after or {})
    return state


def authority_digest_of(state: dict[str, dict[str, Any]]) -> str:
    """SHA-256 (hex) of the RFC 8785 JSON of authority rows (subject -> recorded fields)."""
    return hashlib.sha256(rfc8785.dumps(state)).hexdigest()


# ---------------------------------------------------------------------------------------------
# Checkpoints: a Merkle tree (RFC 6962's shape) over the attempt chain heads a checkpoint seals,
# and a chain of checkpoints, each hashing the one before it.


def leaf_hash(attempt_id: str, length: int, head: str) -> bytes:
    """The tree hash of one sealed chain head (0x00 prefix: a leaf can never pass for a node)."""
    leaf = rfc8785.dumps({"attempt_id": attempt_id, "length": int(length), "head": head})
    return hashlib.sha256(b"\x00" + leaf).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


class MerkleTree:
    """The tree over leaf hashes in order; subtree roots are computed once and kept, so the root
    and every inclusion proof together cost about one hash per node."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.leaves = leaves
        self._roots: dict[tuple[int, int], bytes] = {}

    def _root(self, lo: int, hi: int) -> bytes:
        if hi - lo == 1:
            return self.leaves[lo]
        value = self._roots.get((lo, hi))
        if value is None:
            k = _split(hi - lo)
            value = _node(self._root(lo, lo + k), self._root(lo + k, hi))
            self._roots[(lo, hi)] = value
        return value

    def root(self) -> str:
        """The root as hex (SHA-256 of nothing for an empty tree)."""
        if not self.leaves:
            return hashlib.sha256(b"").hexdigest()
        return self._root(0, len(self.leaves)).hex()

    def proof(self, index: int) -> list[str]:
        """The sibling hashes (hex, from the leaf up) that prove leaf ``index`` is in the tree."""
        siblings: list[bytes] = []
        lo, hi = 0, len(self.leaves)
        while hi - lo > 1:
            k = _split(hi - lo)
            if index < lo + k:
                siblings.append(self._root(lo + k, hi))
                hi = lo + k
            else:
                siblings.append(self._root(lo, lo + k))
                lo = lo + k
        return [h.hex() for h in reversed(siblings)]


def merkle_root(leaves: list[bytes]) -> str:
    """The root (hex) of the tree over ``leaves``."""
    return MerkleTree(leaves).root()


def root_from_proof(leaf: bytes, index: int, size: int, proof: list[str]) -> str | None:
    """The root that ``proof`` leads to from ``leaf`` at ``index`` in a tree of ``size`` leaves,
    or None when the proof has the wrong length for that place."""
    if not 0 <= index < size:
        return None
    # Walk down to find which side each sibling is on, then fold from the leaf up.
    sides: list[bool] = []  # True: the sibling is on the right
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            sides.append(True)
            hi = lo + k
        else:
            sides.append(False)
            lo = lo + k
    if len(sides) != len(proof):
        return None
    value = leaf
    for sibling_hex, right in zip(proof, reversed(sides), strict=True):
        sibling = bytes.fromhex(sibling_hex)
        value = _node(value, sibling) if right else _node(sibling, value)
    return value.hex()


CHECKPOINT_FIELDS = ("seq", "prev_hash", "root", "size", "config_length", "config_head")


def checkpoint_hash(row: dict[str, Any]) -> str:
    """A checkpoint's hash: its sequence number, the previous checkpoint's hash, the Merkle root
    and size of what it sealed, the config chain's length and head, and when it was sealed."""
    payload = {name: row[name] for name in CHECKPOINT_FIELDS}
    payload.update(v=CHECKPOINT_FORMAT, sealed_at=chain_time(row["sealed_at"]))
    return hashlib.sha256(rfc8785.dumps(payload)).hexdigest()


def escape_cell(value: str) -> str:
    """Make a text cell safe to open in a spreadsheet (no formula injection), reversibly."""
    if value and value[0] in FORMULA_STARTS:
        return "'" + value
    return value


def unescape_cell(value: str) -> str:
    return value[1:] if value.startswith("'") else value


@dataclass(frozen=True)
class Problem:
    """One thing that does not verify, naming the event (or line) where it shows."""

    kind: str
    message: str
    event_id: int | None = None
    attempt_id: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.event_id is not None:
            where.append(f"event {self.event_id}")
        if self.attempt_id:
            where.append(f"attempt {self.attempt_id}")
        return f"[{self.kind}] {', '.join(where) + ': ' if where else ''}{self.message}"


@dataclass
class ChainChecker:
    """Walks format-1 events (the ledger-wide chain written before per-attempt chains) in id
    order by their links alone, and records every place the chain does not hold; it also
    collects problems for the database verifier."""

    start_prev: str = GENESIS
    max_problems: int = 50
    problems: list[Problem] = field(default_factory=list)
    last_id: int | None = None
    last_hash: str | None = None
    truncated: bool = False

    def problem(self, problem: Problem) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)
        else:
            self.truncated = True

    def link_only(self, event_id: int, prev_hash: str, stored_hash: str, *, line: int | None):
        """One event's place in the chain: ids rise, and it names the hash of the one before."""
        if self.last_id is not None and event_id <= self.last_id:
            self.problem(
                Problem(
                    "order",
                    f"event ids go backwards ({event_id} after {self.last_id}): "
                    "history was reordered",
                    event_id,
                    line=line,
                )
            )
        expected = self.last_hash if self.last_id is not None else self.start_prev
        if prev_hash != expected:
            if self.last_id is None:
                message = (
                    f"the first event's prev_hash is {prev_hash[:16]}…, not the chain's start "
                    f"{expected[:16]}…: events before it were deleted"
                )
            else:
                message = (
                    f"broken link after event {self.last_id}: this event records prev_hash "
                    f"{prev_hash[:16]}… but event {self.last_id} has hash {expected[:16]}…; "
                    f"event {self.last_id} or this one was changed, or events between them "
                    "were deleted, inserted or reordered"
                )
            self.problem(Problem("link", message, event_id, line=line))
        self.last_id, self.last_hash = event_id, stored_hash


# ---------------------------------------------------------------------------------------------
# Export files


@dataclass
class Report:
    """The outcome of a verification."""

    what: str
    problems: list[Problem]
    events: int = 0
    links: int = 0
    head_hash: str | None = None
    head_id: int | None = None
    checkpoint: tuple[int, str] | None = None  # (seq, hash) of the newest checkpoint verified
    notes: list[str] = field(default_factory=list)
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = []
        if self.ok:
            lines.append(
                f"OK: {self.what}: {self.events} events verify"
                + (f" (+{self.links} chain links outside the filter)" if self.links else "")
                + (f"; head {self.head_hash} (event {self.head_id})" if self.head_hash else "")
                + (
                    f"; newest checkpoint {self.checkpoint[0]}: {self.checkpoint[1]}"
                    if self.checkpoint
                    else ""
                )
            )
        else:
            lines.append(f"BROKEN: {self.what}: first broken link: {self.problems[0]}")
            for problem in self.problems[1:]:
                lines.append(f"  also: {problem}")
            if self.truncated:
                lines.append("  (more problems not listed)")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


@dataclass
class ExportChecker:
    """Checks an export's events, seals and checkpoints, streaming events in file order.

    Memory grows with the number of exported attempts (a counter and the last hash of each), not
    with the number of events."""

    complete_chains: bool
    whole_ledger: bool
    anchors: frozenset[str] = frozenset()
    max_problems: int = 50
    problems: list[Problem] = field(default_factory=list)
    truncated: bool = False
    count: int = 0
    first_event: dict[str, Any] | None = None
    last_event: dict[str, Any] | None = None
    found: set[str] = field(default_factory=set)
    checkpoints: dict[int, dict[str, Any]] = field(default_factory=dict)
    seals: dict[str, dict[str, Any]] = field(default_factory=dict)
    chains: dict[str, list[Any]] = field(default_factory=dict)  # attempt -> [count, last, whole]
    legacy_last: str | None = None
    last_id: int | None = None

    def problem(self, problem: Problem) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)
        else:
            self.truncated = True

    def checkpoint(self, record: dict[str, Any], line: int | None) -> None:
        seq = int(record["seq"])
        where = f"checkpoint {seq}"
        if checkpoint_hash(record) != record["hash"]:
            self.problem(Problem("checkpoint", f"{where}: fields do not match its hash", line=line))
        before = self.checkpoints.get(seq - 1)
        if self.checkpoints and before is None:
            self.problem(
                Problem("checkpoint", f"{where}: the checkpoint before it is missing", line=line)
            )
        if before is not None and record["prev_hash"] != before["hash"]:
            self.problem(
                Problem(
                    "checkpoint",
                    f"{where}: its prev_hash is not checkpoint {seq - 1}'s hash",
                    line=line,
                )
            )
        self.checkpoints[seq] = record
        if record["hash"] in self.anchors:
            self.found.add(record["hash"])

    def seal(self, record: dict[str, Any], line: int | None) -> None:
        attempt_id = record["attempt_id"]
        checkpoint = self.checkpoints.get(int(record["checkpoint"]))
        leaf = leaf_hash(attempt_id, int(record["length"]), record["head"])
        root = root_from_proof(
            leaf, int(record["index"]), int(record["size"]), list(record["proof"])
        )
        if checkpoint is None:
            self.problem(
                Problem(
                    "seal",
                    f"its checkpoint {record['checkpoint']} is not in the file",
                    attempt_id=attempt_id,
                    line=line,
                )
            )
        elif (
            root is None
            or root != checkpoint["root"]
            or int(record["size"]) != int(checkpoint["size"])
        ):
            self.problem(
                Problem(
                    "seal",
                    f"the proof does not lead to checkpoint {record['checkpoint']}'s root: the sealed head was changed",
                    attempt_id=attempt_id,
                    line=line,
                )
            )
        self.seals[attempt_id] = {**record, "line": line, "matched": False}

    def event(self, row: dict[str, Any], line: int | None) -> None:
        event_id = int(row["id"])
        attempt_id = row["attempt_id"]
        if self.last_id is not None and event_id <= self.last_id:
            self.problem(
                Problem(
                    "order",
                    f"event ids go backwards ({event_id} after {self.last_id})",
                    event_id,
                    attempt_id,
                    line,
                )
            )
        self.last_id = event_id
        try:
            recomputed = event_hash(row)
        except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError) as exc:
            recomputed = f"unhashable ({exc})"
        if recomputed != row["hash"]:
            self.problem(
                Problem(
                    "content",
                    f"the event's fields do not match its hash {str(row['hash'])[:16]}…: it was edited",
                    event_id,
                    attempt_id,
                    line,
                )
            )
        legacy = int(row.get("v", CHAIN_FORMAT)) == LEGACY_FORMAT
        if legacy and self.whole_ledger:
            expected = self.legacy_last if self.legacy_last is not None else GENESIS
            if row["prev_hash"] != expected:
                self.problem(
                    Problem(
                        "link",
                        "broken link to the ledger's event before it (format 1)",
                        event_id,
                        attempt_id,
                        line,
                    )
                )
            self.legacy_last = row["hash"]
        state = self.chains.get(attempt_id)
        if state is None:
            whole = row["action"] == "attempt.created"
            if not legacy and whole and row["prev_hash"] != GENESIS:
                self.problem(
                    Problem(
                        "link",
                        "the attempt's first event does not start its chain",
                        event_id,
                        attempt_id,
                        line,
                    )
                )
            if self.complete_chains and not whole:
                self.problem(
                    Problem(
                        "link",
                        "the attempt's history starts without its creation event: earlier events were removed",
                        event_id,
                        attempt_id,
                        line,
                    )
                )
            state = self.chains[attempt_id] = [0, None, whole]
        elif not legacy and row["prev_hash"] != state[1]:
            self.problem(
                Problem(
                    "link",
                    f"this event records prev_hash {str(row['prev_hash'])[:16]}… but the attempt's event before it has {str(state[1])[:16]}…: an event of this attempt was changed, deleted, inserted or reordered",
                    event_id,
                    attempt_id,
                    line,
                )
            )
        state[0] += 1
        state[1] = row["hash"]
        seal = self.seals.get(attempt_id)
        if seal is not None and state[2] and state[0] == int(seal["length"]):
            seal["matched"] = row["hash"] == seal["head"]
            if not seal["matched"]:
                self.problem(
                    Problem(
                        "seal",
                        f"the sealed head of this attempt is {str(seal['head'])[:16]}…, but its event {state[0]} has another hash: sealed history was rewritten",
                        event_id,
                        attempt_id,
                        line,
                    )
                )
            seal["checked"] = True
        if row["hash"] in self.anchors:
            self.found.add(row["hash"])
        if self.first_event is None:
            self.first_event = row
        self.last_event = row
        self.count += 1

    def finish(self) -> None:
        for attempt_id, seal in self.seals.items():
            chain = self.chains.get(attempt_id)
            if chain is None or not chain[2]:
                continue  # the date range left the sealed place out of the file
            if not seal.get("checked"):
                self.problem(
                    Problem(
                        "seal",
                        f"a checkpoint sealed {seal['length']} events of this attempt but the file holds {chain[0]}: sealed events were removed",
                        attempt_id=attempt_id,
                        line=seal["line"],
                    )
                )
        for anchor in sorted(self.anchors - self.found):
            self.problem(
                Problem(
                    "anchor",
                    f"the hash {anchor} kept elsewhere is not a checkpoint or event of this export: history up to it was rewritten or cut",
                )
            )


def _check_manifest(
    checker: ExportChecker,
    manifest: dict[str, Any],
    header: dict[str, Any],
    seals: int,
    checkpoints: int,
) -> None:
    def bad(message: str) -> None:
        checker.problem(Problem("manifest", message))

    if manifest.get("row_count") != checker.count:
        bad(
            f"the manifest counts {manifest.get('row_count')} events but the file holds {checker.count}: events were added or removed"
        )
    if "seal_count" in manifest and manifest.get("seal_count") != seals:
        bad(f"the manifest counts {manifest.get('seal_count')} seals, the file {seals}")
    if "checkpoint_count" in manifest and manifest.get("checkpoint_count") != checkpoints:
        bad(
            f"the manifest counts {manifest.get('checkpoint_count')} checkpoints, the file {checkpoints}"
        )
    for name, record in (("first_event", checker.first_event), ("last_event", checker.last_event)):
        claimed = manifest.get(name)
        actual = _event_ref(record)
        if (claimed and {"id": claimed.get("id"), "hash": claimed.get("hash")}) != actual:
            bad(f"the manifest's {name} {claimed} is not the file's {actual}")
    pinned = manifest.get("checkpoint")
    if checkpoints and (
        not pinned
        or checker.checkpoints.get(pinned.get("seq"), {}).get("hash") != pinned.get("hash")
    ):
        bad(f"the manifest's checkpoint {pinned} is not a checkpoint of the file")
    if checkpoints and pinned and max(checker.checkpoints) != pinned.get("seq"):
        bad("the file has checkpoints after the one the manifest pins")
    if header and manifest.get("filters") != header.get("filters"):
        bad("the manifest's filters differ from the header's")


@dataclass
class ConfigChecker:
    """Checks an export's ``config`` lines: the config chain (each change's hash, its link to
    the one before), that it holds what each checkpoint sealed, and, when every change is
    readable, that replaying it gives the authority digest the export was made with (a row
    changed outside the history shows as ``[config-drift]``)."""

    problem: Callable[[Problem], None]
    hashes: dict[int, str] = field(default_factory=dict)
    last: int = 0
    gaps: bool = False
    replayed: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any], line: int | None) -> None:
        seq = int(record["seq"])
        where = f"config change {seq}"
        if config_event_hash(record) != record["hash"]:
            self.problem(Problem("config", f"{where}: its fields do not match its hash", line=line))
        if seq <= self.last:
            self.problem(Problem("config", f"{where}: out of order", line=line))
        elif seq == self.last + 1:
            prev = self.hashes.get(self.last, GENESIS)
            if record["prev_hash"] != prev:
                self.problem(
                    Problem("config", f"{where}: broken link to the change before it", line=line)
                )
        else:
            self.gaps = True  # a scoped export: the changes between are someone else's
        self.last = max(self.last, seq)
        self.hashes[seq] = record["hash"]
        self.replayed.append(
            {"subject": record["subject"], "action": record["action"], "after": record["after"]}
        )

    def finish(self, checkpoints: dict[int, dict[str, Any]], manifest: dict[str, Any]) -> None:
        if "config_count" not in manifest:
            return  # an export made before config changes were exported
        if manifest["config_count"] != len(self.hashes):
            self.problem(
                Problem(
                    "manifest",
                    f"the manifest counts {manifest['config_count']} config changes, the file "
                    f"{len(self.hashes)}",
                )
            )
        if not manifest.get("config_complete"):
            return  # only each readable change's own hash can be checked
        if self.gaps:
            self.problem(
                Problem("config", "config changes are missing from a complete export's chain")
            )
        head = manifest.get("config_head")
        if (head and self.hashes.get(int(head["seq"])) != head["hash"]) or (
            head and int(head["seq"]) != self.last
        ):
            self.problem(
                Problem("manifest", f"the manifest's config head {head} is not the file's")
            )
        for seq, checkpoint in sorted(checkpoints.items()):
            length, sealed = int(checkpoint["config_length"]), checkpoint["config_head"]
            if length and self.hashes.get(length) != sealed:
                self.problem(
                    Problem(
                        "config",
                        f"checkpoint {seq} sealed {length} config changes ending "
                        f"{sealed[:16]}…, which the file's config chain does not have",
                    )
                )
        digest = manifest.get("authority_digest")
        if digest and authority_digest_of(authority_state(self.replayed)) != digest:
            self.problem(
                Problem(
                    "config-drift",
                    "the authority rows the export was made from differ from what its config "
                    "history says: a row was changed outside the history",
                )
            )


def verify_jsonl(path: Path, *, anchors: Iterable[str] = ()) -> Report:
    """Verify a JSON Lines export: header, checkpoints, seals, events, manifest."""
    checker: ExportChecker | None = None
    problems: list[Problem] = []
    report = Report(what=str(path), problems=problems)
    header: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    config: ConfigChecker | None = None
    seals = checkpoints = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as exc:
                (checker.problem if checker else problems.append)(
                    Problem("format", f"not JSON: {exc}", line=number)
                )
                continue
            if not isinstance(record, dict):
                (checker.problem if checker else problems.append)(
                    Problem("format", "a line that is not a JSON object", line=number)
                )
                continue
            kind = record.get("type")
            if checker is None:
                if kind != "header":
                    problems.append(Problem("format", "the header line is missing", line=number))
                    header = {}
                else:
                    header = record
                    if (
                        record.get("format") != EXPORT_FORMAT
                        or record.get("version") != EXPORT_VERSION
                    ):
                        problems.append(
                            Problem(
                                "format",
                                "not a ledgerweb audit export of this version (format/version)",
                                line=number,
                            )
                        )
                filters = (header or {}).get("filters") or {}
                checker = ExportChecker(
                    complete_chains=bool((header or {}).get("complete_chains")),
                    whole_ledger=not any(filters.values()),
                    anchors=frozenset(anchors),
                )
                checker.problems = problems
                if kind == "header":
                    continue
            if manifest is not None:
                checker.problem(
                    Problem(
                        "format", "lines after the manifest: the file was appended to", line=number
                    )
                )
                break
            try:
                if kind == "event":
                    missing = [
                        n for n in ("id", *HASHED_FIELDS, "prev_hash", "hash") if n not in record
                    ]
                    if missing:
                        checker.problem(
                            Problem(
                                "format",
                                f"event without {', '.join(missing)}",
                                record.get("id"),
                                record.get("attempt_id"),
                                number,
                            )
                        )
                        continue
                    checker.event(record, number)
                elif kind == "seal":
                    checker.seal(record, number)
                    seals += 1
                elif kind == "checkpoint":
                    checker.checkpoint(record, number)
                    checkpoints += 1
                elif kind == "config":
                    if config is None:
                        config = ConfigChecker(checker.problem)
                    config.add(record, number)
                elif kind == "manifest":
                    manifest = record
                elif kind == "header":
                    checker.problem(Problem("format", "a second header", line=number))
                else:
                    checker.problem(Problem("format", f"unknown record type {kind!r}", line=number))
            except (KeyError, TypeError, ValueError) as exc:
                checker.problem(Problem("format", f"malformed {kind} record: {exc}", line=number))
    if checker is None:
        problems.append(Problem("format", "the file is empty"))
        return report
    checker.finish()
    report.events = checker.count
    if checker.last_event is not None:
        report.head_hash, report.head_id = checker.last_event["hash"], int(checker.last_event["id"])
    if checker.checkpoints:
        newest = max(checker.checkpoints)
        report.checkpoint = (newest, checker.checkpoints[newest]["hash"])
    if manifest is None:
        checker.problem(
            Problem("manifest", "no manifest line at the end: the export was cut short or edited")
        )
    else:
        _check_manifest(checker, manifest, header or {}, seals, checkpoints)
        (config or ConfigChecker(checker.problem)).finish(checker.checkpoints, manifest)
    report.notes.append(
        f"{len(checker.chains)} attempts, {seals} sealed heads checked against {checkpoints} checkpoints"
    )
    report.truncated = checker.truncated
    return report


def _event_ref(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"id": int(record["id"]), "hash": record["hash"]}


def _csv_row(record: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {name: unescape_cell(record.get(name) or "") for name in CSV_COLUMNS}
    row["id"] = int(row.pop("event_id"))
    row["details"] = json.loads(row["details"] or "{}")
    row["v"] = int(row["v"] or CHAIN_FORMAT)
    return row


def verify_csv(
    path: Path, *, manifest_path: Path | None = None, anchors: Iterable[str] = ()
) -> Report:
    """Verify a CSV export and, when present, its ``.manifest.json``: each row's hash, each
    attempt's links, and the manifest's counts and SHA-256 of the file."""
    manifest_path = manifest_path or path.with_name(path.name + ".manifest.json")
    manifest: dict[str, Any] | None = None
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    filters = (manifest or {}).get("filters") or {}
    checker = ExportChecker(
        complete_chains=bool(manifest and manifest.get("complete_chains")),
        whole_ledger=bool(manifest) and not any(filters.values()),
        anchors=frozenset(anchors),
    )
    report = Report(what=str(path), problems=checker.problems)
    digest = hashlib.sha256()
    with path.open("rb") as binary:
        for chunk in iter(lambda: binary.read(1 << 20), b""):
            digest.update(chunk)
    csv.field_size_limit(1 << 30)  # details and reasons may be long; the default is 128 KiB
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
            checker.problem(
                Problem("format", "the header row is not a ledgerweb audit export", line=1)
            )
            report.truncated = checker.truncated
            return report
        for record in reader:
            number = reader.line_num
            try:
                row = _csv_row(record)
            except (ValueError, TypeError) as exc:
                checker.problem(Problem("format", f"malformed row: {exc}", line=number))
                continue
            checker.event(row, number)
    checker.finish()
    report.events = checker.count
    if checker.last_event is not None:
        report.head_hash, report.head_id = checker.last_event["hash"], int(checker.last_event["id"])
    if manifest is None:
        report.notes.append(
            f"no manifest at {manifest_path}: rows were checked one by one, but a removed row "
            "would not show"
        )
    else:
        _check_manifest(checker, manifest, {}, 0, 0)
        if manifest.get("sha256") and manifest["sha256"] != digest.hexdigest():
            checker.problem(
                Problem(
                    "manifest",
                    f"the file's SHA-256 {digest.hexdigest()} is not the manifest's "
                    f"{manifest['sha256']}: the file was changed after export",
                )
            )
    report.truncated = checker.truncated
    return report


def verify_file(
    path: Path, *, manifest_path: Path | None = None, anchors: Iterable[str] = ()
) -> Report:
    """Verify an export, choosing the reader by content (JSON Lines or CSV)."""
    with path.open("rb") as handle:
        start = handle.read(1)
    if start == b"{":
        return verify_jsonl(path, anchors=anchors)
    return verify_csv(path, manifest_path=manifest_path, anchors=anchors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="verify_export.py",
        description="Verify a ledgerweb audit export (JSON Lines or CSV) offline: recompute each "
        "event's hash, follow the chain, check the manifest, and name the first broken link.",
    )
    parser.add_argument("file", type=Path, help="the exported .jsonl or .csv file")
    parser.add_argument(
        "--manifest", type=Path, help="the CSV's manifest (default: FILE.manifest.json)"
    )
    parser.add_argument(
        "--expect-head",
        action="append",
        default=[],
        metavar="HASH",
        help="a checkpoint hash kept elsewhere (or an event hash) that must be in the export",
    )
    args = parser.parse_args(argv)
    try:
        report = verify_file(args.file, manifest_path=args.manifest, anchors=args.expect_head)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
