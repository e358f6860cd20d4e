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

The server's one implementation of the hash formats: ``attempts.chain`` writes with them and
``attempts.audit_verify`` checks the live database with them. The Python client's receipt
checker (``ledgerweb_client/receipts.py``) is a second, independent one on purpose (an agent
need not trust the server's code); tests/client/test_receipts_formats.py holds the two to the
same bytes. See docs/audit-chain.md.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import gzip
import hashlib
import hmac
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
# Format 3: like 2, but free text (the reason, and every detail not named in PUBLIC_DETAILS) is
# committed by a salted digest (``text``), and the creation event records a salted digest of the
# arguments (``args_digest``), so the plaintext and the salt can be erased and the chain still
# verifies. Written for every attempt with a salt (``Attempt.args_salt``).
SALTED_FORMAT = 3
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
    "text_digest",
)
# The columns of CSV exports written before chain format 3 (no ``text_digest``): still read.
CSV_COLUMNS_V2 = CSV_COLUMNS[:-1]
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
    payload = {
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
    if payload["v"] >= SALTED_FORMAT:
        return salted_payload(payload, row["text_digest"])
    return payload


def event_hash(row: dict[str, Any], *, dumps: Callable[[Any], bytes] = rfc8785.dumps) -> str:
    """Recompute an event's hash from its fields. ``dumps`` is the RFC 8785 encoder: the
    reference here; the writer passes its faster twin (``attempts.jcs``), held to the same
    bytes by tests, and every verifier recomputes with the reference."""
    return hashlib.sha256(dumps(event_payload(row))).hexdigest()


# ---------------------------------------------------------------------------------------------
# Format 3: free text and arguments committed by salted digests, so they can be erased

# The details an event of format 3 keeps in the clear (structure: ids, states, who, counts); every
# other detail is free text or a provider's raw answer, committed by the salted ``text`` digest.
# Unknown keys are private by default, so a new kind of detail is never left in the clear.
PUBLIC_DETAILS = frozenset(
    {
        "tenant",
        "task_id",
        "tool_name",
        "idempotency_key",
        "args_digest",
        "policy_version",
        "credential_scope",
        "parent_attempt_id",
        "owner_id",
        "previous_owner_id",
        "traceparent",
        "provider_request_id",
        "result_ref",
        "approvals",
        "approvals_needed",
        "linked_attempt_id",
        "http_status",
        "retryable",
        "retry_after",
        "count",
        "kind",
        "erasure",
        # Approvals in the chain (invariant 13): a hold's policy, version, count and approver
        # rule; an approval's expiry; the issuer of the agent token that recorded an intent.
        "hold",
        "valid_until",
        "token_issuer",
        "recorders",
    }
)
# What erased free text, and erased arguments, are replaced by.
ERASED_TEXT = "[erased]"
ERASED_ARGS = {ERASED_TEXT: True}
ERASURE_ACTION = "attempt.erased"


# ---------------------------------------------------------------------------------------------
# Approvals (protocol invariant 13): the check ``[approvals]``, online (attempts.audit_verify)
# and offline (this file) alike, from an attempt's chain alone.

APPROVALS_CHECK = "approvals"
APPROVAL_EVENT = "attempt.approval"
HELD_APPROVAL_KINDS = ("held", "edit_and_approve")
AWAITING = "AWAITING_APPROVAL"
REVIEW = "MANUAL_REVIEW"
# Moves that need approvals: out of a hold, the claim of a held attempt (its event records the
# approvals it relied on), and a reviewer's approval out of review (a linked retry, a linked
# attempt).
HELD_MOVES = frozenset({(AWAITING, "INTENT_RECORDED"), ("INTENT_RECORDED", "DISPATCHED")})
REVIEW_MOVES = frozenset({(REVIEW, "RECONCILED"), (REVIEW, "INTENT_RECORDED")})


# What of a creation event's details ``approval_problems`` reads.
CREATION_KEYS = ("recorders", "token_issuer", "args_hash", "hold", "approval")


def _slim(row: dict[str, Any], details: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row.get("id"),
        "action": row.get("action"),
        "actor_kind": row.get("actor_kind"),
        "actor": row.get("actor"),
        "from_state": row.get("from_state"),
        "to_state": row.get("to_state"),
        "created_at": row.get("created_at"),
        "details": details,
    }


def _moment_of(value: Any) -> dt.datetime | None:
    """A chain time, an ISO text or a datetime as an aware datetime (None if unreadable)."""
    try:
        if isinstance(value, dt.datetime):
            moment = value
        else:
            moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def approval_problems(events: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    """``[approvals]``: every move of this attempt that needed approvals had them, in its own
    chain (``events``: its events in order, each with ``id``, ``action``, ``actor_kind``,
    ``actor``, ``from_state``, ``to_state``, ``details`` and ``created_at``). Returns
    (event id, message) for each move that did not.

    - A move out of AWAITING_APPROVAL (and the claim of a held attempt, whose event records
      the approvals it relied on): approval events before it, each by a person, bound to the
      attempt's args_hash (while it is not erased) and to the policy version the move records
      (else the hold's), unexpired at the move, from distinct people, none of them the
      recorders (the creation event's actor and its agent token's issuer, or for a linked
      attempt its original's, ``recorders``); at least as many as the hold (or, for another
      policy version, the move) records the version required.
    - A reviewer's approval out of MANUAL_REVIEW (a linked retry approved, a linked attempt
      approved): approval events since the attempt's last move, distinct people, none of
      them the recorders, as many as the move records the tool required.
    Every approver a move names must be among those counted. Events written before approvals
    were chain-only (no ``hold``, no ``needed`` on the move) are checked with what they carry:
    the hold's count from its details while they are not erased, and for a linked retry the
    deciding reviewer as its last approval."""
    if not events or events[0].get("action") != "attempt.created":
        return []  # the [attempt] check says so
    created = events[0]
    record = _as_dict(created.get("details"))
    named = record.get("recorders")
    recorders = set(named) if isinstance(named, list) else {created.get("actor")}
    if record.get("token_issuer"):
        recorders.add(record["token_issuer"])
    args_hash = record.get("args_hash")  # absent once erased: the binding is not checkable
    hold = _hold_of(record)
    problems: list[tuple[Any, str]] = []
    approvals: list[dict[str, Any]] = []
    last_move = 0
    for index, event in enumerate(events[1:], start=1):
        details = _as_dict(event.get("details"))
        move = (event.get("from_state"), event.get("to_state"))
        if event.get("action") == APPROVAL_EVENT and move[0] == move[1]:
            approvals.append({**event, "index": index, "details": details})
            continue
        if move[0] == move[1]:
            continue
        if move[1] == AWAITING and _hold_of(details) is not None:
            hold = _hold_of(details)  # waiting again: the hold as it is now
        relied = _as_dict(details.get("approvals"))
        if move in HELD_MOVES and (move[0] == AWAITING or relied):
            problems += _held_move_problems(event, relied, hold, approvals, recorders, args_hash)
        elif move in REVIEW_MOVES:
            recent = [a for a in approvals if a["index"] > last_move]
            problems += _review_move_problems(event, relied, recent, recorders)
        last_move = index
    return problems


def _hold_of(details: dict[str, Any]) -> dict[str, Any] | None:
    """A hold's policy version and count: its clear ``hold`` record, or an older event's
    private ``approval`` details while they are not erased."""
    hold = details.get("hold")
    if isinstance(hold, dict):
        return {"version": hold.get("version"), "needed": hold.get("needed")}
    old = details.get("approval")
    if isinstance(old, dict) and "policy_version" in old:
        return {"version": old.get("policy_version"), "needed": old.get("approvals_needed")}
    return None


def _held_move_problems(
    event: dict[str, Any],
    relied: dict[str, Any],
    hold: dict[str, Any] | None,
    approvals: list[dict[str, Any]],
    recorders: set[Any],
    args_hash: Any,
) -> list[tuple[Any, str]]:
    version = relied.get("policy_version", hold.get("version") if hold else None)
    needed = relied.get("needed")
    if hold is not None and hold.get("version") == version and isinstance(hold.get("needed"), int):
        needed = max(hold["needed"], needed if isinstance(needed, int) else 0)
    at = _moment_of(event.get("created_at"))
    valid: list[Any] = []
    why_not: dict[Any, str] = {}
    for approval in approvals:
        details, who = approval["details"], approval.get("actor")
        if details.get("kind") not in HELD_APPROVAL_KINDS:
            continue
        expires = _moment_of(details.get("valid_until") or details.get("expires_at"))
        erased_expiry = "valid_until" not in details and "expires_at" not in details
        if approval.get("actor_kind") != "user":
            why_not[who] = "not a person"
        elif who in recorders:
            why_not[who] = "a recorder of the intent"
        elif details.get("policy_version") != version:
            why_not[who] = f"for policy version {details.get('policy_version')}, not {version}"
        elif args_hash and details.get("args_hash") not in (None, args_hash):
            why_not[who] = "for other arguments"
        elif not erased_expiry and (expires is None or at is None or expires <= at):
            why_not[who] = "expired before the move"
        elif who not in valid:
            valid.append(who)
    return _verdict_problems(event, relied, valid, needed, why_not, recorders)


def _review_move_problems(
    event: dict[str, Any],
    relied: dict[str, Any],
    recent: list[dict[str, Any]],
    recorders: set[Any],
) -> list[tuple[Any, str]]:
    valid: list[Any] = []
    why_not: dict[Any, str] = {}
    needed = relied.get("needed")
    for approval in recent:
        who = approval.get("actor")
        if approval.get("actor_kind") != "user":
            why_not[who] = "not a person"
        elif who in recorders:
            why_not[who] = "a recorder of the intent"
        elif who not in valid:
            valid.append(who)
    if "needed" not in relied:
        # Written before every approval was its event: the deciding reviewer's approval was
        # the move itself, and the count the first approval recorded (one when there was none).
        if event.get("actor_kind") == "user" and event.get("actor") not in recorders:
            if event.get("actor") not in valid:
                valid.append(event.get("actor"))
        counts = [a["details"].get("needed") for a in recent]
        needed = max([n for n in counts if isinstance(n, int)] or [1])
    return _verdict_problems(event, relied, valid, needed, why_not, recorders)


def _verdict_problems(
    event: dict[str, Any],
    relied: dict[str, Any],
    valid: list[Any],
    needed: Any,
    why_not: dict[Any, str],
    recorders: set[Any],
) -> list[tuple[Any, str]]:
    move = f"{event.get('from_state')} -> {event.get('to_state')}"
    problems = []
    if isinstance(needed, int) and len(valid) < needed:
        void = "; ".join(f"{who}: {why}" for who, why in why_not.items() if who not in valid)
        problems.append(
            (
                event.get("id"),
                f"the move {move} had {len(valid)} valid approval(s) in the chain of the "
                f"{needed} required"
                + (f" (not counted: {void})" if void else "")
                + ": an approval event was deleted or edited, or the move was forced",
            )
        )
    named = relied.get("approvers")
    for who in named if isinstance(named, list) else []:
        if who in recorders:
            problems.append(
                (
                    event.get("id"),
                    f"the move {move} names {who}, a recorder of the intent, as an approver",
                )
            )
        elif who not in valid:
            problems.append(
                (
                    event.get("id"),
                    f"the move {move} names {who} as an approver, but the chain has no valid "
                    f"approval by {who} before it"
                    + (f" ({why_not[who]})" if who in why_not else ""),
                )
            )
    return problems


def split_details(details: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, private) parts of an event's details (format 3)."""
    if not isinstance(details, dict):
        raise TypeError("an event's details must be a JSON object")
    public = dict(details)
    # One pass over the names: what is not public is moved out of the copy.
    private = {k: public.pop(k) for k in details if k not in PUBLIC_DETAILS}
    return public, private


def cannot_hash(exc: Exception) -> str:
    """What a problem's message adds when a row could not be hashed at all: no stored hash
    matches such a row, whatever it says."""
    return f" (they cannot be hashed: {exc})"


def salted_digest(salt: str, value: Any, *, dumps: Callable[[Any], bytes] = rfc8785.dumps) -> str:
    """HMAC-SHA256 keyed by the attempt's salt (hex) over the RFC 8785 JSON of ``value``."""
    return _salted(salt, dumps(value))


def _salted(salt: str, data: bytes) -> str:
    return hmac.digest(bytes.fromhex(salt), data, "sha256").hex()


def text_digest(
    salt: str, reason: str, details: Any, *, dumps: Callable[[Any], bytes] = rfc8785.dumps
) -> str:
    """The digest a format-3 event's hash covers in place of its free text: the reason and the
    private details, salted."""
    _, private = split_details(details)
    return salted_digest(salt, {"reason": reason, "details": private}, dumps=dumps)


def args_commitment(
    salt: str,
    args: Any,
    *,
    dumps: Callable[[Any], bytes] = rfc8785.dumps,
    canonical: bytes | None = None,
) -> str:
    """The salted digest of the normalized arguments a format-3 creation event records.
    ``canonical``: the RFC 8785 bytes of ``args``, when the caller has them already (the
    writer, which hashed the arguments it normalized): the committed document ``{"args": ...}``
    is written around them (an object of one member is its key, a colon and its value's bytes,
    in braces) instead of encoding the arguments again."""
    if canonical is not None:
        return _salted(salt, b'{"args":' + canonical + b"}")
    return salted_digest(salt, {"args": args}, dumps=dumps)


def salted_payload(payload: dict[str, Any], text: str) -> dict[str, Any]:
    """What a format-3 event's hash covers, from the fields of ``event_payload``: no free text,
    only its salted digest ``text`` and the public details."""
    public, _ = split_details(payload["details"])
    covered = {name: value for name, value in payload.items() if name != "reason"}
    covered["details"], covered["text"] = public, text
    return covered


def is_erased_event(row: dict[str, Any]) -> bool:
    """Whether a format-3 event's free text was erased (only the marker and public details)."""
    details = row.get("details")
    return (
        row.get("reason") == ERASED_TEXT
        and isinstance(details, dict)
        and not split_details(details)[1]
    )


def text_problem(row: dict[str, Any], salt: str | None) -> str | None:
    """Why a format-3 event's stored free text is not what its ``text`` digest commits to, or
    None. An erased event has nothing left to check; without the salt (an export that does not
    carry it) the text cannot be checked and is not reported."""
    if int(row.get("v", CHAIN_FORMAT)) < SALTED_FORMAT or is_erased_event(row) or not salt:
        return None
    try:
        if text_digest(salt, row["reason"], row["details"]) == row["text_digest"]:
            return None
    except (TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
        return f"its free text cannot be hashed: {exc}"
    return "its reason or details are not the text its hash committed to: they were edited"


# -- Erased text must be proven erased (docs/audit-chain.md, "Erasure"): the marker in an
# event's free text is what a four-eyes erasure writes, and what one plain UPDATE could write
# too (the append-only guard lets the erasure's UPDATE through). Its proof is in the chain: an
# ``attempt.erased`` event after it, asked for by one person and approved by another.


def erasure_problem(row: dict[str, Any]) -> str | None:
    """Why an ``attempt.erased`` event does not record a four-eyes erasure, or None: it names
    who asked and who approved, two different people, and its actor is the approver."""
    erasure = (
        row.get("details", {}).get("erasure") if isinstance(row.get("details"), dict) else None
    )
    if not isinstance(erasure, dict):
        return "records no erasure request (who asked, who approved)"
    asked, approved = erasure.get("requested_by"), erasure.get("approved_by")
    if not (isinstance(asked, str) and asked and isinstance(approved, str) and approved):
        return "does not name who asked for it and who approved it"
    if asked == approved:
        return f"was asked for and approved by the same person ({asked}): not four eyes"
    if row.get("actor_kind") != "user" or row.get("actor") != approved:
        return f"was written by {row.get('actor')!r}, not by its approver {approved!r}"
    return None


def unproven_marker(row: dict[str, Any], salt: str | None) -> bool:
    """Whether a format-3 event carries the erasure marker as its free text, other than as text
    its salted digest committed to (a note that says ``[erased]``, checked when the salt is
    there): such text needs an erasure after it in the attempt's history."""
    if int(row.get("v", CHAIN_FORMAT)) < SALTED_FORMAT or not is_erased_event(row):
        return False
    if salt:
        try:
            return text_digest(salt, row["reason"], row["details"]) != row.get("text_digest")
        except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError):
            return True
    return True


ERASED_WITHOUT_ERASURE = (
    "its free text is the erasure marker, but no four-eyes erasure (an attempt.erased event "
    "approved by a second person) follows it in its history: the text was edited"
)


@dataclass
class ErasureProof:
    """Follows each attempt's events in order: every event whose free text is the erasure
    marker waits for a valid ``attempt.erased`` event after it; ``finish`` reports those that
    none came for (``[content]``: the event was edited). An erasure event that is not four-eyes
    is ``[erasure]``."""

    waiting: dict[Any, list[tuple[int | None, int | None]]] = field(default_factory=dict)

    def event(
        self, attempt_id: Any, row: dict[str, Any], salt: str | None, *, line: int | None = None
    ) -> list[Problem]:
        found = []
        event_id = int(row["id"]) if row.get("id") is not None else None
        if row.get("action") == ERASURE_ACTION:
            why = erasure_problem(row)
            if why:
                found.append(Problem("erasure", f"the erasure {why}", event_id, attempt_id, line))
            else:
                self.waiting.pop(attempt_id, None)
        if unproven_marker(row, salt):
            self.waiting.setdefault(attempt_id, []).append((event_id, line))
        return found

    def finish(self, attempt_id: Any = None) -> list[Problem]:
        """The events still waiting (of one attempt, or of all)."""
        keys = list(self.waiting) if attempt_id is None else [attempt_id]
        return [
            Problem("content", ERASED_WITHOUT_ERASURE, event_id, key, line)
            for key in keys
            for event_id, line in self.waiting.pop(key, [])
        ]


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
    and size of what it sealed (format 1) or of the whole log (format 2), the config chain's
    length and head, when it was sealed, and (format 2) the authority digest."""
    payload = {name: row[name] for name in CHECKPOINT_FIELDS}
    version = int(row.get("format") or CHECKPOINT_FORMAT)
    payload.update(v=version, sealed_at=chain_time(row["sealed_at"]))
    if version >= LOG_FORMAT:
        # Format 2: root and size are the whole log's; it also commits to the authority digest.
        payload["authority"] = row["authority"]
    return hashlib.sha256(rfc8785.dumps(payload)).hexdigest()


# ---------------------------------------------------------------------------------------------
# The transparency log (checkpoint format 2): one append-only Merkle tree over every sealed leaf,
# in the order the sealer appended them (RFC 9162's tree, the same leaf and node hashes as
# above). A format-2 checkpoint's root and size are the whole tree's, so any two have a
# consistency proof and every sealed leaf an inclusion proof. Its signed form is a C2SP
# ``tlog-checkpoint`` note (``signed-note``, Ed25519), cosigned by witnesses (``tlog-cosignature``).

LOG_FORMAT = 2
ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
# Extension lines of a ledgerweb checkpoint note, after origin, size and root.
EXT_CHECKPOINT = "ledgerweb-checkpoint"
EXT_CONFIG = "ledgerweb-config"
EXT_AUTHORITY = "ledgerweb-authority"


def node_hash(left: bytes, right: bytes) -> bytes:
    """An interior node of the tree (RFC 9162, 2.1.1)."""
    return _node(left, right)


def inclusion_root(leaf: bytes, index: int, size: int, proof: list[bytes]) -> bytes | None:
    """The root an inclusion proof leads to (RFC 9162, 2.1.3.2), or None if it cannot be one."""
    if not 0 <= index < size:
        return None
    fn, sn, value = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            value = _node(sibling, value)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            value = _node(value, sibling)
        fn, sn = fn >> 1, sn >> 1
    return value if sn == 0 else None


def consistent(
    old_size: int, old_root: bytes, new_size: int, new_root: bytes, proof: list[bytes]
) -> bool:
    """Whether ``proof`` shows the tree (old_size, old_root) is a prefix of (new_size, new_root)
    (RFC 9162, 2.1.4.2)."""
    if old_size < 0 or old_size > new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for value in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(value, fr), _node(value, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = _node(sr, value)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == new_root


class LogBuilder:
    """The tree's root at every size, from its leaves in order, with memory for one hash per
    level: what a verifier holding every leaf (a whole-ledger export) recomputes."""

    def __init__(self) -> None:
        self.size = 0
        self._frontier: list[tuple[int, bytes]] = []  # (level, hash), left to right

    def append(self, leaf: bytes) -> None:
        level, value = 0, leaf
        while self._frontier and self._frontier[-1][0] == level:
            value = _node(self._frontier.pop()[1], value)
            level += 1
        self._frontier.append((level, value))
        self.size += 1

    def root(self) -> bytes:
        if not self._frontier:
            return hashlib.sha256(b"").digest()
        value = self._frontier[-1][1]
        for _, left in reversed(self._frontier[:-1]):
            value = _node(left, value)
        return value


# -- Ed25519 verification (RFC 8032). ``cryptography`` when it is installed; otherwise the RFC's
# own arithmetic in plain Python, slower but enough for the few signatures an export carries,
# so this file still needs nothing beyond the standard library and rfc8785.

_P = 2**255 - 19
_Q = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _x_from_y(y: int, sign: int) -> int | None:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return _P - x if (x & 1) != sign else x


def _point(data: bytes) -> tuple[int, int, int, int] | None:
    y = int.from_bytes(data, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _x_from_y(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    aa = (a[1] - a[0]) * (b[1] - b[0]) % _P
    bb = (a[1] + a[0]) * (b[1] + b[0]) % _P
    cc = 2 * a[3] * b[3] * _D % _P
    dd = 2 * a[2] * b[2] % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _times(scalar: int, point: tuple[int, ...]) -> tuple[int, ...]:
    result: tuple[int, ...] = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


_BASE = _point((4 * pow(5, _P - 2, _P) % _P).to_bytes(32, "little"))


def _ed25519_plain(public: bytes, message: bytes, signature: bytes) -> bool:
    a, r = _point(public), _point(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _Q or _BASE is None:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % _Q
    left, right = _times(s, _BASE), _add(r, _times(k, a))
    return (left[0] * right[2] - right[0] * left[2]) % _P == 0 and (
        left[1] * right[2] - right[1] * left[2]
    ) % _P == 0


def ed25519_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``message``."""
    if len(public) != 32 or len(signature) != 64:
        return False
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        return _ed25519_plain(public, message, signature)
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# -- Signed notes (C2SP signed-note) and checkpoints (C2SP tlog-checkpoint)


class NoteError(ValueError):
    """A note, key or checkpoint that is malformed or does not verify."""


def key_id(name: str, alg: int, public: bytes) -> bytes:
    """A signed-note key id: the first 4 bytes of SHA-256(name, newline, algorithm, key)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public).digest()[:4]


@dataclass(frozen=True)
class VerifierKey:
    """A public key in signed-note form ``NAME+KEYID+BASE64(ALG || KEY)``."""

    name: str
    id: bytes
    alg: int
    public: bytes

    @classmethod
    def parse(cls, text: str) -> VerifierKey:
        parts = text.strip().split("+", 2)  # base64 may hold "+" too
        if len(parts) != 3 or not parts[0] or len(parts[1]) != 8:
            raise NoteError(f"not a verifier key (NAME+KEYID+BASE64): {text.strip()[:60]!r}")
        try:
            wanted = bytes.fromhex(parts[1])
            raw = base64.b64decode(parts[2], validate=True)
        except ValueError:
            raise NoteError("a verifier key's id or key is not hex / base64") from None
        if len(raw) != 33 or raw[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
            raise NoteError("only Ed25519 verifier keys (algorithm 1 or 4) are supported")
        key = cls(parts[0], wanted, raw[0], raw[1:])
        if key_id(key.name, key.alg, key.public) != wanted:
            raise NoteError(f"the verifier key {parts[0]}'s id does not match its key")
        return key

    def __str__(self) -> str:
        encoded = base64.b64encode(bytes([self.alg]) + self.public).decode()
        return f"{self.name}+{self.id.hex()}+{encoded}"


@dataclass(frozen=True)
class NoteSignature:
    name: str
    id: bytes
    signature: bytes

    def line(self) -> str:
        return f"\u2014 {self.name} {base64.b64encode(self.id + self.signature).decode()}\n"


def split_note(note: str) -> tuple[str, list[NoteSignature]]:
    """A signed note's text (ending in a newline) and its signature lines."""
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise NoteError("not a signed note: no blank line before the signatures")
    text, block = note[: cut + 1], note[cut + 2 :]
    signatures = []
    for line in block.splitlines():
        prefix = "\u2014 "
        parts = line[len(prefix) :].split(" ") if line.startswith(prefix) else []
        if len(parts) != 2 or not parts[0]:
            raise NoteError(f"a malformed signature line: {line[:60]!r}")
        try:
            raw = base64.b64decode(parts[1], validate=True)
        except ValueError:
            raise NoteError("a signature line is not base64") from None
        if len(raw) < 5:
            raise NoteError("a signature line is too short")
        signatures.append(NoteSignature(parts[0], raw[:4], raw[4:]))
    if not signatures:
        raise NoteError("the note has no signature")
    return text, signatures


def note_signed_by(text: str, signature: NoteSignature, key: VerifierKey) -> bool:
    """Whether ``signature`` is ``key``'s signature over the note ``text``: a plain signed-note
    signature (algorithm 1), or a witness's timestamped cosignature/v1 (algorithm 4)."""
    if signature.name != key.name or signature.id != key.id:
        return False
    if key.alg == ALG_ED25519:
        return ed25519_verify(key.public, text.encode(), signature.signature)
    if len(signature.signature) != 72:
        return False
    stamp = int.from_bytes(signature.signature[:8], "big")
    message = f"cosignature/v1\ntime {stamp}\n{text}".encode()
    return ed25519_verify(key.public, message, signature.signature[8:])


@dataclass(frozen=True)
class LogCheckpoint:
    """The body of a checkpoint note: origin, tree size, root hash, extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LogCheckpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or not lines[0]:
            raise NoteError("a checkpoint has an origin, a size and a root line")
        size_text = lines[1]
        if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
            raise NoteError(f"a checkpoint's size is not a decimal: {size_text[:20]!r}")
        try:
            root = base64.b64decode(lines[2], validate=True)
        except ValueError:
            raise NoteError("a checkpoint's root is not base64") from None
        if len(root) != 32:
            raise NoteError("a checkpoint's root is not a SHA-256 hash")
        if any(not line for line in lines[3:-1]):
            raise NoteError("a checkpoint has an empty extension line")
        return cls(lines[0], int(size_text), root, tuple(lines[3:-1]))

    def text(self) -> str:
        root = base64.b64encode(self.root).decode()
        return "".join(
            f"{line}\n" for line in (self.origin, str(self.size), root, *self.extensions)
        )

    def extension(self, name: str) -> list[str] | None:
        """The words after ``name`` on its extension line, or None."""
        for line in self.extensions:
            words = line.split(" ")
            if words[0] == name:
                return words[1:]
        return None


def open_checkpoint(
    note: str,
    keys: Iterable[VerifierKey],
    *,
    witnesses: Iterable[VerifierKey] = (),
    quorum: int = 0,
) -> tuple[LogCheckpoint, list[str]]:
    """Verify a signed checkpoint note: signed by one of the log's ``keys`` (old keys stay
    valid after a rotation) and cosigned by at least ``quorum`` of ``witnesses``. Returns the
    checkpoint and the names of the witnesses whose cosignature verified; raises NoteError."""
    text, signatures = split_note(note)
    checkpoint = LogCheckpoint.parse(text)
    keys = list(keys)
    if not any(note_signed_by(text, s, k) for s in signatures for k in keys):
        names = ", ".join(sorted({k.name for k in keys})) or "no key given"
        raise NoteError(f"the checkpoint is not signed by the log's key ({names})")
    cosigned = sorted({w.name for w in witnesses for s in signatures if note_signed_by(text, s, w)})
    if len(cosigned) < quorum:
        raise NoteError(
            f"the checkpoint is cosigned by {len(cosigned)} known witnesses "
            f"({', '.join(cosigned) or 'none'}), fewer than the quorum of {quorum}"
        )
    return checkpoint, cosigned


def b64_hashes(values: Iterable[str]) -> list[bytes]:
    """Hashes given as base64 text (as proofs travel), checked to be SHA-256 sized."""
    out = []
    for value in values:
        raw = base64.b64decode(value, validate=True)
        if len(raw) != 32:
            raise NoteError("a proof hash is not 32 bytes")
        out.append(raw)
    return out


# What a creation event names in the clear that an agent chose: a receipt is checked against
# what the agent sent (``sent``) on these, and on the arguments (``history_problems``).
SENT_FIELDS = ("tenant", "task_id", "tool_name", "idempotency_key")


def _sent_problems(created: dict[str, Any], salt: str | None, sent: dict[str, Any]) -> list[str]:
    details = created.get("details")
    if created.get("action") != "attempt.created" or not isinstance(details, dict):
        return ["the history's first event is not the attempt's creation"]
    found = [
        f"the history records {name} {details.get(name)!r}, not the {sent[name]!r} sent"
        for name in SENT_FIELDS
        if name in sent and details.get(name) != sent[name]
    ]
    if "args" not in sent:
        return found
    if int(created.get("v", CHAIN_FORMAT)) >= SALTED_FORMAT:
        if not salt:
            found.append("the receipt carries no salt: the arguments cannot be checked (erased?)")
        elif details.get("args_digest") != args_commitment(salt, sent["args"]):
            found.append("the history does not commit to the arguments sent")
    elif details.get("args_hash") != args_hash_of(sent["args"]):
        found.append("the history does not commit to the arguments sent")
    return found


def history_problems(
    attempt_id: str,
    length: int,
    head: str,
    events: list[dict[str, Any]],
    *,
    salt: str | None = None,
    sent: dict[str, Any] | None = None,
) -> list[str]:
    """What is wrong with the history a receipt carries (empty when it holds): each event, as its
    hash covers it (``event_payload``), hashes to the ``prev_hash`` of the next, from GENESIS, and
    the last is the leaf's ``head`` after ``length`` events, all of ``attempt_id``. With ``sent``
    (what the agent sent: any of ``SENT_FIELDS`` and ``args``), the creation event must record
    exactly that (the arguments through their digest, salted with ``salt`` in format 3)."""
    if len(events) != length:
        return [f"the receipt carries {len(events)} events for a leaf of {length}"]
    prev = GENESIS
    for number, covered in enumerate(events, 1):
        try:
            if covered["attempt_id"] != attempt_id:
                return [f"event {number} of the receipt is another attempt's"]
            if covered["prev_hash"] != prev:
                return [f"event {number} of the receipt does not follow the one before it"]
            prev = hashlib.sha256(rfc8785.dumps(covered)).hexdigest()
        except (KeyError, TypeError, rfc8785.CanonicalizationError) as exc:
            return [f"event {number} of the receipt cannot be hashed: {exc!r}"]
    if prev != head:
        return ["the receipt's events do not hash to the leaf's head"]
    if sent is not None and events:
        return _sent_problems(events[0], salt, sent)
    return []


def receipt_problems(
    receipt: dict[str, Any],
    keys: Iterable[VerifierKey],
    *,
    witnesses: Iterable[VerifierKey] = (),
    quorum: int = 0,
    sent: dict[str, Any] | None = None,
) -> list[str]:
    """What is wrong with an attempt's receipt (empty when it verifies): the checkpoint note is
    signed (and cosigned), the leaf (attempt id, chain length, head) is in its tree, and (receipt
    version 2) the events it carries hash to that head and, with ``sent``, record what the agent
    sent (``history_problems``)."""
    if receipt.get("events") is not None:
        try:
            leaf = receipt["leaf"]
            found = history_problems(
                str(leaf["attempt_id"]),
                int(leaf["length"]),
                str(leaf["head"]),
                list(receipt["events"]),
                salt=receipt.get("args_salt"),
                sent=sent,
            )
        except (KeyError, TypeError, ValueError) as exc:
            return [f"malformed receipt: {exc}"]
        if found:
            return found
    elif sent is not None:
        return [
            "the receipt carries no events (a version 1 receipt): what was sent cannot be checked"
        ]
    try:
        checkpoint, _ = open_checkpoint(
            receipt["checkpoint"], keys, witnesses=witnesses, quorum=quorum
        )
        leaf = receipt["leaf"]
        value = leaf_hash(str(leaf["attempt_id"]), int(leaf["length"]), str(leaf["head"]))
        proof = b64_hashes(receipt["inclusion_proof"])
        index = int(receipt["index"])
    except (KeyError, TypeError, ValueError) as exc:
        return [f"malformed receipt: {exc}"]
    root = inclusion_root(value, index, checkpoint.size, proof)
    if root != checkpoint.root:
        return [
            f"the inclusion proof of leaf {index} does not lead to the signed root of the tree "
            f"of {checkpoint.size}: the leaf or the history behind it was changed"
        ]
    return []


def unescape_cell(value: str) -> str:
    """A CSV text cell as it was before the export escaped a formula-like start (a leading
    quote before one of FORMULA_STARTS)."""
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
    # The transparency log: the log's verifier keys, witness keys and quorum, and checkpoints
    # kept elsewhere (notes) that the export must be consistent with.
    log_keys: list[VerifierKey] = field(default_factory=list)
    witness_keys: list[VerifierKey] = field(default_factory=list)
    quorum: int = 0
    kept: list[LogCheckpoint] = field(default_factory=list)
    log: LogBuilder = field(default_factory=LogBuilder)
    log_roots: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # size -> seq, root
    kept_roots: dict[int, bytes] = field(default_factory=dict)
    signed: set[int] = field(default_factory=set)
    erasures: ErasureProof = field(default_factory=ErasureProof)
    cosigned: dict[int, int] = field(default_factory=dict)  # seq -> given witnesses' cosignatures
    unknown_witnesses: set[str] = field(default_factory=set)
    archived: dict[str, dict[str, Any]] = field(default_factory=dict)  # attempt -> its line
    # [approvals]: each whole chain's creation (what decides who recorded it and what a hold
    # required), and of the few attempts that wait for approvals, their approval events and the
    # moves into, out of and relying on a hold or review (``approval_problems``).
    creations: dict[str, dict[str, Any]] = field(default_factory=dict)
    approval_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def problem(self, problem: Problem) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)
        else:
            self.truncated = True

    def log_checkpoint(self, record: dict[str, Any], line: int | None) -> None:
        """A format-2 checkpoint's note states its record's size and root, and (with the log's
        keys) is signed by the log and cosigned by the quorum of witnesses."""
        seq = int(record["seq"])
        where = f"checkpoint {seq}"
        try:
            body = LogCheckpoint.parse(record["note"])
        except NoteError as exc:
            self.problem(Problem("log", f"{where}: its note does not parse: {exc}", line=line))
            return
        if (
            body.size != int(record["size"])
            or body.root.hex() != record["root"]
            or body.extension(EXT_CHECKPOINT) != [str(seq)]
        ):
            self.problem(
                Problem("log", f"{where}: its note does not state its size and root", line=line)
            )
        self.log_roots.setdefault(body.size, []).append((seq, record["root"]))
        lines = record.get("signatures") or []
        if self.log_keys and lines:
            try:
                _, cosigned = open_checkpoint(
                    record["note"] + "\n" + "".join(lines),
                    self.log_keys,
                    witnesses=self.witness_keys,
                    quorum=0,
                )
                self.signed.add(seq)
                self.cosigned[seq] = len(cosigned)
            except NoteError as exc:
                self.problem(Problem("signature", f"{where}: {exc}", line=line))
            self.strange_signatures(seq, lines, line)

    def strange_signatures(self, seq: int, lines: list[str], line: int | None) -> None:
        """A log signature (plain Ed25519, 64 bytes) by a key not given with ``--log-key`` is
        reported, not ignored; a cosignature (cosignature/v1) by a witness not given is not
        counted (a note)."""
        given = {(k.name, k.id) for k in [*self.log_keys, *self.witness_keys]}
        for text in lines:
            try:
                _, signatures = split_note("x\n\n" + text)
            except NoteError:
                continue  # open_checkpoint said so
            for signature in signatures:
                if (signature.name, signature.id) in given:
                    continue
                if len(signature.signature) == 64:
                    self.problem(
                        Problem(
                            "signature",
                            f"checkpoint {seq}: signed by {signature.name} (key id "
                            f"{signature.id.hex()}), a key not given with --log-key (nor "
                            "--witness-key)",
                            line=line,
                        )
                    )
                else:
                    self.unknown_witnesses.add(signature.name)

    def log_leaf(self, record: dict[str, Any], line: int | None) -> None:
        index = int(record["index"])
        if index != self.log.size:
            self.problem(
                Problem(
                    "log", f"log leaf {index} out of place (expected {self.log.size})", line=line
                )
            )
            return
        self.log.append(leaf_hash(record["attempt_id"], int(record["length"]), record["head"]))
        size = self.log.size
        for seq, root in self.log_roots.get(size, ()):
            if self.log.root().hex() != root:
                self.problem(
                    Problem(
                        "log",
                        f"checkpoint {seq}: its root is not the root of the exported log at "
                        f"size {size}: logged heads were changed",
                        line=line,
                    )
                )
        if any(kept.size == size for kept in self.kept):
            self.kept_roots[size] = self.log.root()

    def finish_log(self, newest: dict[str, Any] | None) -> None:
        """The newest checkpoint is signed (when keys are given) and every checkpoint kept
        elsewhere is consistent with the export."""
        if newest is None or int(newest.get("format") or 1) < LOG_FORMAT:
            if self.kept:
                self.problem(Problem("log", "the export has no transparency-log checkpoint"))
            return
        seq, size = int(newest["seq"]), int(newest["size"])
        if self.log_keys and seq not in self.signed:
            self.problem(
                Problem(
                    "signature",
                    f"the export's newest checkpoint {seq} carries no signature of the log's "
                    "key: it was made without the key, or the history behind it was rewritten",
                )
            )
        self.witness_quorum()
        if self.log.size and self.log.size != size:
            self.problem(Problem("log", f"the export holds {self.log.size} log leaves, not {size}"))
        for kept in self.kept:
            if kept.size > size:
                self.problem(
                    Problem(
                        "consistency",
                        f"a checkpoint kept elsewhere covers {kept.size} leaves but the export's "
                        f"newest covers {size}: the log was rolled back",
                    )
                )
                continue
            root = self.kept_roots.get(kept.size)
            if root is None and kept.size == size:
                root = bytes.fromhex(newest["root"])
            if root is None:
                self.problem(
                    Problem(
                        "consistency",
                        f"cannot check the kept checkpoint of size {kept.size}: only a "
                        "whole-ledger export carries the log's leaves",
                    )
                )
            elif root != kept.root:
                self.problem(
                    Problem(
                        "consistency",
                        f"the kept (witnessed) checkpoint of size {kept.size} has root "
                        f"{kept.root.hex()[:16]}…, the exported log {root.hex()[:16]}…: history "
                        "was rewritten after it was witnessed (a fork)",
                    )
                )

    def witness_quorum(self) -> None:
        """``[witness]``: with the log's key, witness keys and a quorum, a signed checkpoint of
        the export (the newest one its witnesses cosigned, which the export carries) is
        cosigned by that many of the given witnesses; newer ones may wait for them."""
        if not (self.log_keys and self.witness_keys and self.quorum > 0):
            return
        if not any(self.cosigned.get(seq, 0) >= self.quorum for seq in self.signed):
            self.problem(
                Problem(
                    "witness",
                    f"no checkpoint of the export is cosigned by {self.quorum} of the given "
                    "witnesses: they were down or behind, or their cosignatures were removed",
                )
            )

    def checkpoint(self, record: dict[str, Any], line: int | None) -> None:
        seq = int(record["seq"])
        where = f"checkpoint {seq}"
        if checkpoint_hash(record) != record["hash"]:
            self.problem(Problem("checkpoint", f"{where}: fields do not match its hash", line=line))
        if int(record.get("format") or 1) >= LOG_FORMAT:
            self.log_checkpoint(record, line)
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
        unhashable = ""
        try:
            recomputed = event_hash(row)
        except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError) as exc:
            recomputed, unhashable = None, cannot_hash(exc)
        if recomputed is None or recomputed != row["hash"]:
            self.problem(
                Problem(
                    "content",
                    f"the event's fields do not match its hash {str(row['hash'])[:16]}…: it was "
                    f"edited{unhashable}",
                    event_id,
                    attempt_id,
                    line,
                )
            )
        else:
            self.salted_text(row, line)
        self.erased_text(row, line)
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
        self.note_approval_event(row, state)
        if row["hash"] in self.anchors:
            self.found.add(row["hash"])
        if self.first_event is None:
            self.first_event = row
        self.last_event = row
        self.count += 1

    def note_approval_event(self, row: dict[str, Any], state: list[Any]) -> None:
        """Keep what ``[approvals]`` needs of this event (most events: nothing)."""
        details = row.get("details") if isinstance(row.get("details"), dict) else {}
        moved = row.get("from_state") != row.get("to_state")
        if row.get("action") == "attempt.created" and state[0] == 1 and state[2]:
            kept = {k: details[k] for k in CREATION_KEYS if k in details}
            self.creations[row["attempt_id"]] = _slim(row, kept)
            if row.get("to_state") not in (AWAITING, REVIEW):
                return
        elif row.get("action") == APPROVAL_EVENT and not moved:
            pass
        elif not moved or not (
            row.get("to_state") in (AWAITING, REVIEW)
            or row.get("from_state") in (AWAITING, REVIEW)
            or isinstance(details.get("approvals"), dict)
        ):
            return
        self.approval_events.setdefault(row["attempt_id"], []).append(_slim(row, details))

    def approvals(self) -> None:
        """``[approvals]`` of every attempt whose whole chain is in the file."""
        for attempt_id, events in self.approval_events.items():
            created = self.creations.get(attempt_id)
            if created is None:
                continue  # the date range left its creation out of the file
            chain = (
                events
                if events[0] is created or events[0]["id"] == created["id"]
                else [
                    created,
                    *events,
                ]
            )
            for event_id, message in approval_problems(chain):
                self.problem(Problem(APPROVALS_CHECK, message, event_id, attempt_id))

    def salted_text(self, row: dict[str, Any], line: int | None) -> None:
        """Format 3: the event's free text is what its salted digest committed to (when the
        export carries the attempt's salt; erased text has nothing left to check)."""
        problem = text_problem(row, row.get("salt"))
        if problem:
            self.problem(Problem("content", problem, int(row["id"]), row["attempt_id"], line))

    def erased_text(self, row: dict[str, Any], line: int | None) -> None:
        """Format 3: free text that is the erasure marker needs a four-eyes erasure after it
        (``ErasureProof``); reported at the end, once every attempt's events are read."""
        for problem in self.erasures.event(row["attempt_id"], row, row.get("salt"), line=line):
            self.problem(problem)

    def archived_line(self, record: dict[str, Any], line: int | None) -> None:
        """An attempt removed from the database by ``ledgerweb archive run``: which archive
        holds it, and the chain head it was archived at (checked against its seal)."""
        self.archived[str(record["attempt_id"])] = {
            "archive": str(record["archive"]),
            "length": int(record["length"]),
            "head": str(record["head"]),
            "line": line,
        }

    def sealed_without_events(self, manifest: dict[str, Any] | None, *, lenient: bool) -> int:
        """``[missing]``: every attempt a checkpoint sealed has its events in an export of whole
        chains, or an ``archived`` line that says which archive holds it, at the head its seal
        proves. ``lenient``: an export from before archived lines, of a ledger with archives,
        where the two cannot be told apart; returns how many seals went unaccounted for."""
        if not self.complete_chains:
            return 0  # a date range may leave an attempt's every event out of the file
        unaccounted = 0
        for attempt_id, seal in self.seals.items():
            if attempt_id in self.chains:
                continue
            listed = self.archived.get(attempt_id)
            if listed is not None:
                if (listed["length"], listed["head"]) != (int(seal["length"]), seal["head"]):
                    self.problem(
                        Problem(
                            "archive",
                            f"archived in {listed['archive']} at {listed['length']} events, but "
                            f"its seal proves {seal['length']} ending {str(seal['head'])[:16]}…",
                            attempt_id=attempt_id,
                            line=listed["line"],
                        )
                    )
                continue
            if lenient:
                unaccounted += 1
                continue
            self.problem(
                Problem(
                    "missing",
                    "a checkpoint sealed this attempt's history, but the export holds none of "
                    "its events and no archive lists it: it was deleted with its history",
                    attempt_id=attempt_id,
                    line=seal["line"],
                )
            )
        if manifest and "archived_count" in manifest:
            if manifest["archived_count"] != len(self.archived):
                self.problem(
                    Problem(
                        "manifest",
                        f"the manifest counts {manifest['archived_count']} archived attempts, "
                        f"the file {len(self.archived)}",
                    )
                )
        return unaccounted

    def finish(self) -> None:
        if self.complete_chains:  # a date range may have cut the erasure out of the file
            for problem in self.erasures.finish():
                self.problem(problem)
        self.approvals()
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


@dataclass
class LogTrust:
    """What an auditor brings to check the transparency log: the log's verifier keys, witness
    keys and quorum, and checkpoint notes kept elsewhere (verified with them)."""

    log_keys: list[VerifierKey] = field(default_factory=list)
    witness_keys: list[VerifierKey] = field(default_factory=list)
    quorum: int = 0
    kept: list[str] = field(default_factory=list)


def verify_jsonl(
    path: Path, *, anchors: Iterable[str] = (), trust: LogTrust | None = None
) -> Report:
    """Verify a JSON Lines export: header, checkpoints, seals, log leaves, events, manifest."""
    trust = trust or LogTrust()
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
                    log_keys=trust.log_keys,
                    witness_keys=trust.witness_keys,
                    quorum=trust.quorum,
                )
                checker.problems = problems
                _open_kept(checker, trust)
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
                elif kind == "log_leaf":
                    checker.log_leaf(record, number)
                elif kind == "archived":
                    checker.archived_line(record, number)
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
    checker.finish_log(
        checker.checkpoints[max(checker.checkpoints)] if checker.checkpoints else None
    )
    report.events = checker.count
    if checker.last_event is not None:
        report.head_hash, report.head_id = checker.last_event["hash"], int(checker.last_event["id"])
    if checker.log.size:
        report.notes.append(f"the log's {checker.log.size} leaves rebuilt; every root checked")
    if checker.kept:
        report.notes.append(f"{len(checker.kept)} checkpoints kept elsewhere checked")
    if checker.checkpoints and not checker.log_keys:
        report.notes.append(
            "checkpoint signatures not checked: give the log's verifier key (--log-key), and "
            "the witnesses' (--witness-key, --quorum), to check the newest checkpoint on its own"
        )
    if checker.unknown_witnesses:
        report.notes.append(
            "cosignatures by witnesses not given are not counted: "
            + ", ".join(sorted(checker.unknown_witnesses))
        )
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
    # An export from before ``archived`` lines cannot tell archived attempts from deleted ones
    # once the ledger has archives; every export since can, and one without archives always.
    has_archives = config is not None and any(
        str(r["subject"]).startswith("archive:") for r in config.replayed
    )
    lenient = has_archives and "archived_count" not in (manifest or {})
    unaccounted = checker.sealed_without_events(manifest, lenient=lenient)
    if unaccounted:
        report.notes.append(
            f"{unaccounted} sealed attempts have no events here: archived or deleted (an export "
            "from before archived lines cannot tell; verify_audit on the database can)"
        )
    report.notes.append(
        f"{len(checker.chains)} attempts, {seals} sealed heads checked against {checkpoints} checkpoints"
    )
    report.truncated = checker.truncated
    return report


def _open_kept(checker: ExportChecker, trust: LogTrust) -> None:
    """Verify each checkpoint kept elsewhere with the log's keys (and the witness quorum)."""
    for note in trust.kept:
        try:
            checkpoint, _ = open_checkpoint(
                note, trust.log_keys, witnesses=trust.witness_keys, quorum=trust.quorum
            )
        except NoteError as exc:
            checker.problem(Problem("consistency", f"the checkpoint kept elsewhere: {exc}"))
            continue
        checker.kept.append(checkpoint)


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
        if tuple(reader.fieldnames or ()) not in (CSV_COLUMNS, CSV_COLUMNS_V2):
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
    path: Path,
    *,
    manifest_path: Path | None = None,
    anchors: Iterable[str] = (),
    trust: LogTrust | None = None,
) -> Report:
    """Verify an export, choosing the reader by content (JSON Lines or CSV)."""
    with path.open("rb") as handle:
        start = handle.read(1)
    if start == b"{":
        return verify_jsonl(path, anchors=anchors, trust=trust)
    return verify_csv(path, manifest_path=manifest_path, anchors=anchors)


# ---------------------------------------------------------------------------------------------
# Archives (reconciliation/archive, docs/archive.md): attempts moved out of the database, each
# with its events and its receipt (the signed checkpoint and the inclusion proof of its sealed
# chain head). An archive is a folder: ``manifest.json`` and gzip-compressed JSON Lines files,
# one attempt a line; the manifest lists each file's SHA-256 and counts, and the manifest's own
# SHA-256 is recorded in the configuration history when the archive is made.

ARCHIVE_FORMAT = "ledgerweb-archive"
ARCHIVE_VERSION = 1
ARCHIVE_MANIFEST = "manifest.json"


def args_hash_of(args: Any) -> str:
    """``args_hash``: SHA-256 of the RFC 8785 canonical JSON of the arguments."""
    return hashlib.sha256(rfc8785.dumps(args)).hexdigest()


def archived_attempt_problems(record: dict[str, Any]) -> list[str]:
    """What is wrong with one archived attempt (empty when its history verifies on its own):
    every event's hash recomputes and links to the one before (GENESIS first), the attempt's
    chain head and length, state and ``args_hash`` are its history's, and its receipt's leaf is
    that chain head. The receipt's proof is checked against the archive's checkpoint by
    ``check_archive``."""
    try:
        attempt, events, receipt = record["attempt"], record["events"], record["receipt"]
        attempt_id = str(attempt["attempt_id"])
        found: list[str] = []
        prev = GENESIS
        salt = attempt.get("args_salt") or None
        for number, event in enumerate(events, start=1):
            row = {**event, "attempt_id": attempt_id}
            if int(event.get("v", CHAIN_FORMAT)) >= SALTED_FORMAT:
                row.setdefault("text_digest", "")
                problem = text_problem(row, salt)
                if problem:
                    found.append(f"event {number}: {problem}")
            recomputed = event_hash(row)
            if recomputed != event["hash"]:
                found.append(f"event {number}'s fields do not match its hash: it was edited")
            if int(event.get("v", CHAIN_FORMAT)) != LEGACY_FORMAT and event["prev_hash"] != prev:
                found.append(f"event {number} does not link to the event before it")
            prev = event["hash"]
        proof = ErasureProof()
        for number, event in enumerate(events, start=1):
            row = {**event, "id": number}
            found += [f"event {number}: {p.message}" for p in proof.event(attempt_id, row, salt)]
        found += [f"event {p.event_id}: {p.message}" for p in proof.finish()]
        head, length = (events[-1]["hash"] if events else ""), len(events)
        if (attempt["chain_head"], int(attempt["chain_length"])) != (head, length):
            found.append("the attempt's chain head and length are not its events'")
        if events and attempt["state"] != events[-1]["to_state"]:
            found.append("the attempt's state is not its last event's to_state")
        erased = attempt["args"] == ERASED_ARGS and any(
            event.get("action") == ERASURE_ACTION for event in events
        )
        if not erased and args_hash_of(attempt["args"]) != attempt["args_hash"]:
            found.append("the arguments do not hash to the attempt's args_hash")
        leaf = receipt["leaf"]
        if (str(leaf["attempt_id"]), int(leaf["length"]), str(leaf["head"])) != (
            attempt_id,
            length,
            head,
        ):
            found.append("the receipt's leaf is not the attempt's chain head")
        return found
    except (KeyError, TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
        return [f"malformed archived attempt: {exc!r}"]


@dataclass
class ArchiveCheck:
    """What ``check_archive`` found: the manifest, the attempts (id -> (length, head)), the
    checkpoint their receipts prove inclusion in, and the problems."""

    name: str
    problems: list[Problem] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    manifest_sha256: str = ""
    leaves: dict[str, tuple[int, str]] = field(default_factory=dict)
    checkpoint: LogCheckpoint | None = None
    events: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def bad(self, message: str, *, attempt_id: str | None = None) -> None:
        self.problems.append(Problem("archive", f"{self.name}: {message}", attempt_id=attempt_id))


def check_archive(
    read: Callable[[str], bytes | None],
    *,
    name: str,
    expect_sha256: str | None = None,
    trust: LogTrust | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> ArchiveCheck:
    """Verify one archive read through ``read(file name) -> bytes`` (None: the file is not
    there): the manifest (its SHA-256 is ``expect_sha256`` when given: the one the history
    recorded), each file's SHA-256 and counts, each attempt's history, and each receipt's
    inclusion proof into the manifest's checkpoint (signed by one of ``trust.log_keys`` when
    given). ``on_record`` sees every attempt that verifies (restore loads them)."""
    trust = trust or LogTrust()
    check = ArchiveCheck(name=name)
    raw = read(ARCHIVE_MANIFEST)
    if raw is None:
        check.bad(f"{ARCHIVE_MANIFEST} is missing")
        return check
    check.manifest_sha256 = hashlib.sha256(raw).hexdigest()
    if expect_sha256 and check.manifest_sha256 != expect_sha256:
        check.bad(
            f"{ARCHIVE_MANIFEST} has SHA-256 {check.manifest_sha256[:16]}…, not the "
            f"{expect_sha256[:16]}… the history recorded: it was changed or replaced"
        )
        return check
    try:
        manifest = json.loads(raw)
        if manifest.get("format") != ARCHIVE_FORMAT or manifest.get("version") != ARCHIVE_VERSION:
            check.bad(f"not a {ARCHIVE_FORMAT} manifest of version {ARCHIVE_VERSION}")
            return check
        note = manifest["checkpoint"]["note"]
        files = list(manifest["files"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        check.bad(f"the manifest cannot be read: {exc!r}")
        return check
    check.manifest = manifest
    try:
        if trust.log_keys:
            check.checkpoint, _ = open_checkpoint(
                note, trust.log_keys, witnesses=trust.witness_keys, quorum=trust.quorum
            )
        else:
            check.checkpoint = LogCheckpoint.parse(split_note(note)[0])
    except NoteError as exc:
        check.bad(f"the manifest's checkpoint does not verify: {exc}")
        return check
    for entry in files:
        file_name = str(entry.get("name", ""))
        data = read(file_name)
        if data is None:
            check.bad(f"file {file_name} is missing")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.get("sha256"):
            check.bad(
                f"file {file_name} has SHA-256 {digest[:16]}…, not the manifest's "
                f"{str(entry.get('sha256'))[:16]}…: it was changed"
            )
            continue
        try:
            lines = gzip.decompress(data).decode("utf-8").splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            check.bad(f"file {file_name} is not gzip-compressed UTF-8: {exc}")
            continue
        events = 0
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                attempt_id = str(record["attempt"]["attempt_id"])
            except (ValueError, KeyError, TypeError) as exc:
                check.bad(f"file {file_name} line {number} cannot be read: {exc!r}")
                continue
            found = archived_attempt_problems(record)
            if not found:
                receipt = record["receipt"]
                if receipt.get("checkpoint") != note:
                    found.append("the receipt's checkpoint is not the manifest's")
                else:
                    try:
                        leaf = receipt["leaf"]
                        value = leaf_hash(attempt_id, int(leaf["length"]), str(leaf["head"]))
                        root = inclusion_root(
                            value,
                            int(receipt["index"]),
                            check.checkpoint.size,
                            b64_hashes(receipt["inclusion_proof"]),
                        )
                    except (KeyError, TypeError, ValueError) as exc:
                        root = None
                        found.append(f"malformed receipt: {exc!r}")
                    if root is not None and root != check.checkpoint.root:
                        found.append(
                            "the receipt's inclusion proof does not lead to the checkpoint's "
                            "root: the attempt or its history was changed"
                        )
            for message in found:
                check.bad(f"file {file_name} line {number}: {message}", attempt_id=attempt_id)
            if found:
                continue
            events += len(record["events"])
            check.leaves[attempt_id] = (
                int(record["attempt"]["chain_length"]),
                str(record["attempt"]["chain_head"]),
            )
            if on_record is not None:
                on_record(record)
        if (len(lines), events) != (entry.get("attempts"), entry.get("events")):
            check.bad(
                f"file {file_name} holds {len(lines)} attempts and {events} events, the "
                f"manifest says {entry.get('attempts')} and {entry.get('events')}"
            )
        check.events += events
    if check.ok and (len(check.leaves), check.events) != (
        manifest.get("attempts"),
        manifest.get("events"),
    ):
        check.bad(
            f"the archive holds {len(check.leaves)} attempts and {check.events} events, the "
            f"manifest says {manifest.get('attempts')} and {manifest.get('events')}"
        )
    return check


def read_folder(folder: Path) -> Callable[[str], bytes | None]:
    """``read`` for an archive in a local folder (file names never leave it)."""

    def read(name: str) -> bytes | None:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            return None
        try:
            return (folder / name).read_bytes()
        except FileNotFoundError:
            return None

    return read


def verify_archives(folders: Iterable[Path], *, trust: LogTrust | None = None) -> Report:
    """The standalone check of archive folders (``verify_export.py --archive FOLDER``)."""
    problems: list[Problem] = []
    report = Report(what="archives", problems=problems)
    for folder in folders:
        check = check_archive(read_folder(folder), name=folder.name, trust=trust)
        problems.extend(check.problems)
        report.events += check.events
        size = check.checkpoint.size if check.checkpoint else "?"
        report.notes.append(
            f"archive {folder.name}: {len(check.leaves)} attempts, manifest SHA-256 "
            f"{check.manifest_sha256} (compare with the history's record), receipts into the "
            f"checkpoint of tree size {size}"
            + ("" if (trust and trust.log_keys) else " (signature not checked: give --log-key)")
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="verify_export.py",
        description="Verify a ledgerweb audit export (JSON Lines or CSV) offline: recompute each "
        "event's hash, follow the chain, check the manifest, and name the first broken link.",
    )
    parser.add_argument("file", type=Path, nargs="?", help="the exported .jsonl or .csv file")
    parser.add_argument(
        "--archive",
        action="append",
        default=[],
        type=Path,
        metavar="FOLDER",
        help="an archive folder (manifest.json and its files) to verify: each attempt's "
        "history and its receipt into the archive's signed checkpoint",
    )
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
    parser.add_argument(
        "--log-key",
        action="append",
        default=[],
        metavar="VKEY",
        help="the log's verifier key NAME+KEYID+BASE64 (`manage.py ledger_log key`); repeat "
        "for keys used before a rotation. Checkpoint signatures are checked with it",
    )
    parser.add_argument(
        "--witness-key", action="append", default=[], metavar="VKEY", help="a witness's key"
    )
    parser.add_argument(
        "--quorum", type=int, default=0, help="witness cosignatures a kept checkpoint needs"
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a signed (witnessed) checkpoint note kept elsewhere, e.g. saved from "
        "/log/checkpoint: the export's log must be consistent with it",
    )
    args = parser.parse_args(argv)
    try:
        trust = LogTrust(
            log_keys=[VerifierKey.parse(k) for k in args.log_key],
            witness_keys=[VerifierKey.parse(k) for k in args.witness_key],
            quorum=args.quorum,
            kept=[p.read_text(encoding="utf-8") for p in args.checkpoint],
        )
        if trust.kept and not trust.log_keys:
            parser.error(
                "--checkpoint needs --log-key (a kept checkpoint is checked by its signature)"
            )
        if args.file is None and not args.archive:
            parser.error("give an exported file, or --archive FOLDER, or both")
        reports = []
        if args.file is not None:
            reports.append(
                verify_file(
                    args.file, manifest_path=args.manifest, anchors=args.expect_head, trust=trust
                )
            )
        if args.archive:
            reports.append(verify_archives(args.archive, trust=trust))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"cannot read {args.file or args.archive}: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.render())
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
