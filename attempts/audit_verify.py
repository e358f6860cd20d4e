"""Verify the tamper-evident history of a whole ledger database: every attempt's chain, every
checkpoint, the config chain, and each attempt row against its history.

Works on any DB-API connection that holds ledgerweb's tables (the live Django connection, or a
plain ``sqlite3`` connection to a backup copy), streaming rows so memory stays flat (one attempt's
events at a time). The hash formats are ``attempts.verify_export``'s, the code an auditor runs on
an export. Checks, each naming the first event, attempt or checkpoint where it fails:

1. ``[content]`` every event's stored hash equals the hash recomputed from its row;
2. ``[link]`` every event's ``prev_hash`` is its attempt's previous event's hash (GENESIS first);
   events written before per-attempt chains (format 1) link through the whole ledger in id
   order, as they always did;
3. ``[orphan]`` every event belongs to an existing attempt;
4. ``[attempt]`` every attempt row agrees with its history: creation event, key fields, args
   hash, state, provider request id, result reference, chain head and length;
5. ``[seal]`` each attempt's newest sealed head (its latest checkpoint leaf) is the hash at that
   place of its chain, and no sealed attempt is missing (``[missing]``);
6. ``[checkpoint]`` checkpoints run 1, 2, 3, ... each hashing the one before, each root is the
   Merkle root of its leaves; ``[config]`` the config chain links and matches every checkpoint;
7. ``[anchor]`` checkpoint hashes (or, for old ledgers, head hashes) kept elsewhere are still
   there; ``[window]`` optionally, nothing has stayed unsealed longer than allowed;
8. ``[approvals]`` every move out of AWAITING_APPROVAL (and each held claim, and each
   reviewer's approval out of MANUAL_REVIEW) had the approvals its policy version required in
   the attempt's own chain (``verify_export.approval_problems``), and every approvals-table row
   is one of those events.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import rfc8785

from attempts import jcs
from attempts.verify_export import (
    APPROVAL_EVENT,
    APPROVALS_CHECK,
    AWAITING,
    ERASED_ARGS,
    ERASED_TEXT,
    ERASURE_ACTION,
    GENESIS,
    LEGACY_FORMAT,
    LOG_FORMAT,
    PUBLIC_DETAILS,
    REVIEW,
    SALTED_FORMAT,
    ChainChecker,
    ErasureProof,
    MerkleTree,
    Problem,
    Report,
    approval_problems,
    args_commitment,
    authority_digest_of,
    cannot_hash,
    chain_time,
    checkpoint_hash,
    config_event_hash,
    leaf_hash,
    salted_payload,
    split_details,
    text_problem,
)

EVENTS = "attempts_attemptevent"
ATTEMPTS = "attempts_attempt"
LEAVES = "attempts_checkpointleaf"
CHECKPOINTS = "attempts_checkpoint"
CONFIG = "attempts_configevent"

# Format-1 events, in id order: the ledger-wide chain they were written into.
LEGACY_SQL = f"""
SELECT id, prev_hash, hash FROM {EVENTS} WHERE chain_format = {LEGACY_FORMAT} ORDER BY id
"""  # noqa: S608 -- constant table names only

# The attempts with ids in (lo, hi] with their newest checkpoint leaf, and (a second stream,
# merged by attempt id) their events in order: read apart, the attempt's columns (its args, a
# JSON value) are read once, not once per event. ``{since}`` narrows both to the attempts that
# changed after a checkpoint (``--since``).
ATTEMPT_SQL = f"""
SELECT a.id, a.attempt_id, a.state, a.tenant_id, a.task_id, a.tool_name, a.idempotency_key,
       a.args, a.args_hash, a.policy_version, a.credential_scope, p.attempt_id,
       a.provider_request_id, a.result_ref, a.chain_head, a.chain_length, a.sealed,
       l.length, l.head, l.checkpoint_id, a.args_salt
FROM {ATTEMPTS} a
LEFT JOIN {ATTEMPTS} p ON p.id = a.parent_id
LEFT JOIN {LEAVES} l ON l.attempt_id = a.attempt_id
     AND l.checkpoint_id = (SELECT MAX(l2.checkpoint_id) FROM {LEAVES} l2
                            WHERE l2.attempt_id = a.attempt_id)
WHERE a.id > {{lo}} AND a.id <= {{hi}}{{since}}
ORDER BY a.id
"""  # noqa: S608 -- constant table names and integers only
# PostgreSQL reads the newest leaf per attempt through the index (LATERAL); SQLite has no LATERAL,
# and plans the portable form above well.
ATTEMPT_SQL_POSTGRESQL = ATTEMPT_SQL.replace(
    f"""LEFT JOIN {LEAVES} l ON l.attempt_id = a.attempt_id
     AND l.checkpoint_id = (SELECT MAX(l2.checkpoint_id) FROM {LEAVES} l2
                            WHERE l2.attempt_id = a.attempt_id)""",  # noqa: S608
    f"""LEFT JOIN LATERAL (SELECT l2.length, l2.head, l2.checkpoint_id FROM {LEAVES} l2
     WHERE l2.attempt_id = a.attempt_id ORDER BY l2.checkpoint_id DESC LIMIT 1) l ON TRUE""",  # noqa: S608
)
if "LATERAL" not in ATTEMPT_SQL_POSTGRESQL:  # the portable query changed: keep the two in step
    raise AssertionError("ATTEMPT_SQL_POSTGRESQL no longer replaces the leaf join")
EVENT_SQL = f"""
SELECT e.attempt_id, e.id, e.action, e.actor_kind, e.actor, e.from_state, e.to_state, e.reason,
       e.details, e.created_at, e.prev_hash, e.hash, e.chain_format, e.text_digest
FROM {EVENTS} e
WHERE e.attempt_id > {{lo}} AND e.attempt_id <= {{hi}}{{since}}
ORDER BY e.attempt_id, e.id
"""  # noqa: S608 -- constant table names and integers only
# PostgreSQL writes each event's time in the chain's own text form (``chain_time``: UTC,
# microseconds, ``Z``), which the verifier would otherwise build from a datetime per event. Years
# before 1000 are the one place the two differ (see ``_created_text``).
EVENT_SQL_POSTGRESQL = EVENT_SQL.replace(
    "e.created_at,",
    """to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),""",
)
if "to_char" not in EVENT_SQL_POSTGRESQL:  # the portable query changed: keep the two in step
    raise AssertionError("EVENT_SQL_POSTGRESQL no longer replaces the event time")
EVENT_SINCE_SQL = f"""
 AND e.attempt_id IN (SELECT a.id FROM {ATTEMPTS} a
                      WHERE a.id > {{lo}} AND a.id <= {{hi}}{{since}})"""  # noqa: S608
# ATTEMPT_SQL's column of the attempt's salt (chain format 3), after the leaf's.
SALT = 20
SINCE_SQL = f"""
 AND (NOT a.sealed OR EXISTS (SELECT 1 FROM {LEAVES} l3 JOIN {CHECKPOINTS} c3
                              ON c3.id = l3.checkpoint_id
                              WHERE l3.attempt_id = a.attempt_id AND c3.seq > {{seq}}))"""  # noqa: S608
ID_RANGE_SQL = f"SELECT MIN(id), MAX(id) FROM {ATTEMPTS}"  # noqa: S608
ORPHAN_SQL = f"""
SELECT e.id FROM {EVENTS} e LEFT JOIN {ATTEMPTS} a ON a.id = e.attempt_id WHERE a.id IS NULL
ORDER BY e.id
"""  # noqa: S608
# The orphans outside the attempts' id range (lo, hi]: those inside it are found by the batch
# merge, which reads every event of the range anyway.
OUTSIDE_SQL = f"""
SELECT e.id FROM {EVENTS} e WHERE e.attempt_id <= {{lo}} OR e.attempt_id > {{hi}} ORDER BY e.id
"""  # noqa: S608 -- constant table names and integers only
MISSING_SQL = f"""
SELECT DISTINCT l.attempt_id FROM {LEAVES} l LEFT JOIN {ATTEMPTS} a ON a.attempt_id = l.attempt_id
WHERE a.id IS NULL ORDER BY l.attempt_id
"""  # noqa: S608
# [missing] once archives exist: a sealed attempt that is gone must be listed as archived.
ARCHIVED = "attempts_archivedattempt"
UNARCHIVED_SQL = f"""
SELECT DISTINCT l.attempt_id FROM {LEAVES} l LEFT JOIN {ATTEMPTS} a ON a.attempt_id = l.attempt_id
LEFT JOIN {ARCHIVED} x ON x.attempt_id = l.attempt_id
WHERE a.id IS NULL AND x.id IS NULL ORDER BY l.attempt_id
"""  # noqa: S608
CHECKPOINT_SQL = f"""
SELECT id, seq, prev_hash, root, size, config_length, config_head, sealed_at, hash, format,
       authority
FROM {CHECKPOINTS} WHERE seq >= {{seq}} ORDER BY seq
"""  # noqa: S608
# A ledger from before the transparency log: every checkpoint is format 1.
OLD_CHECKPOINT_SQL = f"""
SELECT id, seq, prev_hash, root, size, config_length, config_head, sealed_at, hash, 1, ''
FROM {CHECKPOINTS} WHERE seq >= {{seq}} ORDER BY seq
"""  # noqa: S608
LEAF_SQL = f"""
SELECT checkpoint_id, position, attempt_id, length, head FROM {LEAVES}
WHERE checkpoint_id > (SELECT COALESCE(MAX(id), 0) FROM {CHECKPOINTS} WHERE seq <= {{seq}})
ORDER BY checkpoint_id, position
"""  # noqa: S608
CONFIG_SQL = f"""
SELECT id, seq, subject, action, actor_kind, actor, before, after, reason, created_at,
       prev_hash, hash FROM {CONFIG} ORDER BY seq
"""  # noqa: S608

# [approvals]: approval rows (an index of the approval events) without their event.
APPROVAL_ROWS = "attempts_approval"
ORPHAN_APPROVAL_SQL = f"""
SELECT r.id, a.attempt_id, u.username FROM {APPROVAL_ROWS} r
JOIN {ATTEMPTS} a ON a.id = r.attempt_id
JOIN auth_user u ON u.id = r.approver_id
WHERE NOT EXISTS (SELECT 1 FROM {EVENTS} e WHERE e.attempt_id = r.attempt_id
                  AND e.action = 'attempt.approval' AND e.actor = u.username
                  AND e.created_at = r.created_at)
ORDER BY r.id
"""  # noqa: S608 -- constant table names only

# Attempt columns that must equal the creation event's details.
KEY_FIELDS = (
    "tenant",
    "task_id",
    "tool_name",
    "idempotency_key",
    "args_hash",
    "policy_version",
    "credential_scope",
    "parent_attempt_id",
)
# Attempt columns whose latest value the history records when they change.
TRACKED_FIELDS = ("provider_request_id", "result_ref")
CHUNK = 5000
# Attempt ids per keyset batch of one worker.
BATCH = 5000


_scan_json = json.JSONDecoder().scan_once


def load_json(value: Any) -> Any:
    """A JSON column as Python: SQLite gives text, psycopg may give text or parsed values."""
    if type(value) is str:
        # The decoder's C scanner, without ``json.loads``' per-call set-up: a column written by
        # the ledger is one JSON value with no surrounding space; anything else takes loads.
        try:
            parsed, end = _scan_json(value, 0)
        except StopIteration:
            return json.loads(value)  # raises the decoder's own error
        return parsed if end == len(value) else json.loads(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return load_json(bytes(value).decode("utf-8"))
    if isinstance(value, str):
        return json.loads(value)
    return value


def _moment(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(chain_time(value).replace("Z", "+00:00"))


def _rows(cursor: Any, sql: str) -> Iterator[tuple]:
    cursor.execute(sql)
    while True:
        chunk = cursor.fetchmany(CHUNK)
        if not chunk:
            return
        yield from chunk


class Cursors(NamedTuple):
    """How the verifier opens cursors: ``stream`` for reads of a whole table (a server-side
    cursor where the database has one, so memory stays flat), ``batch`` for the reads of one
    keyset batch of attempts, which are bounded (a plain cursor: one round trip, and no copy of
    the result kept on the server)."""

    stream: Callable[[], Any]
    batch: Callable[[], Any]


def _cursors(factory: Callable[[], Any] | Cursors) -> Cursors:
    return factory if isinstance(factory, Cursors) else Cursors(factory, factory)


class _Verifier:
    def __init__(
        self,
        cursor_factory: Callable[[], Any] | Cursors,
        *,
        anchors: Iterable[str],
        max_problems: int,
        max_unsealed_seconds: float | None,
        now: dt.datetime | None,
        since: tuple[int, str] | None = None,
        vendor: str = "sqlite",
    ) -> None:
        self.cursors = _cursors(cursor_factory)
        self.cursor_factory = self.cursors.stream
        self.since = since
        self.attempt_sql = ATTEMPT_SQL_POSTGRESQL if vendor == "postgresql" else ATTEMPT_SQL
        self.event_sql = EVENT_SQL_POSTGRESQL if vendor == "postgresql" else EVENT_SQL
        self.vendor = vendor
        self.anchors = frozenset(anchors)
        self.found: set[str] = set()
        self.checker = ChainChecker(start_prev=GENESIS, max_problems=max_problems)
        self.max_unsealed_seconds = max_unsealed_seconds
        self.now = now or dt.datetime.now(dt.UTC)
        self.events = 0
        self.attempts = 0
        self.unsealed_attempts = 0
        self.oldest_unsealed: dt.datetime | None = None
        self.checkpoint: tuple[int, str] | None = None
        # The salted digest of "no free text" for the attempt being checked (format 3).
        self.no_text_digests: dict[bytes, str] = {}

    def bad(self, kind: str, message: str, event_id: int | None = None, attempt_id=None) -> None:
        self.checker.problem(Problem(kind, message, event_id, attempt_id))

    def stream(self, sql: str, *, batch: bool = False) -> Iterator[tuple]:
        cursor = self.cursors.batch() if batch else self.cursor_factory()
        try:
            yield from _rows(cursor, sql)
        finally:
            cursor.close()

    def has_archives(self) -> bool:
        """Whether the database has the archive tables (a backup from before them has not)."""
        if self.vendor == "postgresql":
            sql = f"SELECT to_regclass('{ARCHIVED}') IS NOT NULL"
        else:
            sql = f"SELECT count(*) > 0 FROM sqlite_master WHERE name = '{ARCHIVED}'"  # noqa: S608
        return bool(next(iter(self.stream(sql)))[0])

    def has_log(self) -> bool:
        """Whether the database has the transparency log (a backup from before it has not)."""
        cursor = self.cursor_factory()
        try:
            cursor.execute(f"SELECT * FROM {CHECKPOINTS} WHERE 1 = 0")  # noqa: S608
            return "format" in [column[0] for column in cursor.description]
        finally:
            cursor.close()

    # -- 2 (format 1): the ledger-wide chain of events written before per-attempt chains
    def legacy(self) -> None:
        legacy = ChainChecker(start_prev=GENESIS, max_problems=self.checker.max_problems)
        for event_id, prev_hash, stored in self.stream(LEGACY_SQL):
            legacy.link_only(int(event_id), prev_hash, stored, line=None)
            if stored in self.anchors:
                self.found.add(stored)
        for problem in legacy.problems:
            self.checker.problem(problem)

    # -- 1, 2, 4, 5: attempts and their chains
    def attempts_and_events(self, lo: int, hi: int) -> None:
        """The attempts with ids in (lo, hi], read in keyset batches of BATCH ids so memory
        stays flat (one attempt's events at a time)."""
        since = SINCE_SQL.format(seq=int(self.since[0])) if self.since else ""
        for start in range(lo, hi, BATCH):
            bounds = {"lo": int(start), "hi": int(min(start + BATCH, hi))}
            events_since = EVENT_SINCE_SQL.format(**bounds, since=since) if since else ""
            events = self.stream(self.event_sql.format(**bounds, since=events_since), batch=True)
            pending = next(events, None)
            for row in self.stream(self.attempt_sql.format(**bounds, since=since), batch=True):
                pk = row[0]
                while pending is not None and pending[0] < pk:
                    self.orphan(pending[1])  # its attempt is gone
                    pending = next(events, None)
                group = []
                while pending is not None and pending[0] == pk:
                    group.append(pending)
                    pending = next(events, None)
                self.attempt(row, group)
            while pending is not None:
                self.orphan(pending[1])
                pending = next(events, None)

    def orphan(self, event_id: int) -> None:
        self.bad("orphan", "the event's attempt no longer exists: it was deleted", event_id)

    def orphans_and_missing(self, lo: int, hi: int) -> None:
        """[orphan] events whose attempt is gone, and [missing] sealed attempts that are gone.
        A whole run's batch merge has found the orphans among the attempts' ids (lo, hi]; an
        incremental one (``since``) reads only changed attempts' events, so looks at all."""
        sql = ORPHAN_SQL if self.since else OUTSIDE_SQL.format(lo=int(lo), hi=int(hi))
        for (event_id,) in self.stream(sql):
            self.orphan(event_id)
        for (attempt_id,) in self.stream(
            MISSING_SQL if not self.has_archives() else UNARCHIVED_SQL
        ):
            self.bad(
                "missing",
                "a checkpoint sealed this attempt's history but the attempt is gone: it was "
                "deleted with its history",
                attempt_id=attempt_id,
            )

    def id_range(self) -> tuple[int, int]:
        rows = list(self.stream(ID_RANGE_SQL))
        low, high = rows[0] if rows else (None, None)
        return (int(low) - 1, int(high)) if low is not None else (0, 0)

    def attempt(self, row: tuple, events: list[tuple]) -> None:
        """One attempt (``row``: ATTEMPT_SQL's columns) and its events in order (EVENT_SQL's)."""
        attempt_id = row[1]
        chain_head, chain_length, sealed = row[14], row[15], row[16]
        leaf_length, leaf_head = row[17], row[18]
        self.attempts += 1
        self.events += len(events)
        hashes: list[str] = []
        details_seen: list[Any] = []
        prev = GENESIS
        salt = row[SALT]
        try:
            key = bytes.fromhex(salt) if salt else None
        except ValueError:
            key = None  # an edited salt: the args check says so, the text checks use the reference
        # The attempt id and the previous event's hash go into every event's payload: the id is
        # encoded once per attempt, and a prev_hash equal to a digest this verifier computed is
        # hex, which JSON writes as it is (``prev_known``).
        quoted_id = _string(attempt_id) if type(attempt_id) is str else None
        prev_known = True  # GENESIS
        for event in events:
            (_, event_id, _, _, _, _, _, _, text, created_at, prev_hash, stored, v, _) = event
            quoted_prev = f'"{prev}"' if prev_known and prev_hash == prev else None
            unhashable = ""
            try:
                details, plain = _load_details(text)
                if v is not None and v >= SALTED_FORMAT:
                    recomputed = self.salted_event(
                        attempt_id, event, details, plain, salt, key, (quoted_id, quoted_prev)
                    )
                else:
                    recomputed = _event_digest(
                        attempt_id, event, details, plain, quoted=(quoted_id, quoted_prev)
                    )
                if recomputed != stored:  # the reference encoder has the last word
                    recomputed = hashlib.sha256(
                        rfc8785.dumps(_event_payload(attempt_id, event, details))
                    ).hexdigest()
            except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError) as exc:
                recomputed, unhashable = None, cannot_hash(exc)
                details = None
            prev_known = recomputed is not None and recomputed == stored
            if not prev_known:
                self.bad(
                    "content",
                    f"the event's fields do not match its hash {str(stored)[:16]}…: it was "
                    f"edited{unhashable}",
                    event_id,
                    attempt_id,
                )
            if prev_hash != prev and v != LEGACY_FORMAT:
                self.bad(
                    "link",
                    f"event {len(hashes) + 1} of this attempt records prev_hash "
                    f"{str(prev_hash)[:16]}… but the attempt's event before it has "
                    f"{prev[:16]}…: an event of this attempt was changed, deleted, inserted or "
                    "reordered",
                    event_id,
                    attempt_id,
                )
            prev = stored
            hashes.append(stored)
            details_seen.append(details)
        self.check_row(row, events, details_seen)
        self.erased_texts(attempt_id, events, details_seen, salt)
        self.approvals(attempt_id, events, details_seen)
        if (chain_head, chain_length) != ((hashes[-1] if hashes else ""), len(hashes)):
            self.bad(
                "attempt",
                f"its chain head says {chain_length} events ending {str(chain_head)[:16]}… but "
                f"its history has {len(hashes)}: events were deleted or the row was edited",
                attempt_id=attempt_id,
            )
        # 5: the newest sealed head is the hash at that place of the chain.
        sealed_length = 0
        if leaf_length is not None:
            sealed_length = int(leaf_length)
            if sealed_length > len(hashes) or hashes[sealed_length - 1] != leaf_head:
                self.bad(
                    "seal",
                    f"checkpoint {row[19]} sealed this attempt at {sealed_length} events ending "
                    f"{str(leaf_head)[:16]}…, but its history "
                    + (
                        f"has only {len(hashes)} events: sealed events were deleted"
                        if sealed_length > len(hashes)
                        else f"has {hashes[sealed_length - 1][:16]}… there: sealed history "
                        "was rewritten"
                    ),
                    attempt_id=attempt_id,
                )
        if len(hashes) > sealed_length:
            self.unsealed_attempts += 1
            moment = _moment(events[sealed_length][9])
            if self.oldest_unsealed is None or moment < self.oldest_unsealed:
                self.oldest_unsealed = moment
            if sealed and leaf_length is not None:
                self.bad(
                    "seal",
                    f"marked sealed, but events after the first {sealed_length} are in no "
                    "checkpoint: the row was edited so the sealer would pass them over",
                    attempt_id=attempt_id,
                )

    def erased_texts(
        self, attempt_id: Any, events: list[tuple], details: list[Any], salt: str | None
    ) -> None:
        """Format 3: an event whose free text is the erasure marker is erased only with a
        four-eyes erasure after it in the attempt's history (``verify_export.ErasureProof``);
        without one it was edited (``[content]``), e.g. by one plain UPDATE the append-only
        guard lets through because it looks like an erasure's."""
        proof: ErasureProof | None = None
        for event, detail in zip(events, details, strict=True):
            action, reason = event[2], event[7]
            if action != ERASURE_ACTION and reason != ERASED_TEXT:
                continue  # the common case: nothing erased, nothing erasing
            proof = proof or ErasureProof()
            row = {
                "id": event[1],
                "action": action,
                "actor_kind": event[3],
                "actor": event[4],
                "reason": reason,
                "details": detail,
                "v": event[12] if event[12] is not None else LEGACY_FORMAT,
                "text_digest": event[13],
            }
            for problem in proof.event(attempt_id, row, salt):
                self.checker.problem(problem)
        if proof is not None:
            for problem in proof.finish():
                self.checker.problem(problem)

    def salted_event(
        self,
        attempt_id: Any,
        event: tuple,
        details: Any,
        plain: bool | None,
        salt: str | None,
        key: bytes | None,
        quoted: tuple[str | None, str | None] = (None, None),
    ) -> str:
        """Format 3: the event's hash (covering its salted text digest, not the text), after
        checking its free text against that digest with the attempt's salt (``key``). The fast
        encoder first; the reference has the last word before a problem is reported."""
        if type(details) is dict and details.keys() <= PUBLIC_DETAILS:
            public, private = details, {}  # the common case: no free text in the details
        else:
            public, private = split_details(details)
        reason, text = event[7], event[13] or ""
        if salt and not (reason == ERASED_TEXT and not private):
            try:
                if not private and not reason and key is not None:
                    # No free text at all: one digest per attempt, whichever events have none.
                    fast = self.no_text_digests.get(key)
                    if fast is None:
                        fast = hmac.digest(key, NO_TEXT, "sha256").hex()
                        self.no_text_digests = {key: fast}
                else:
                    covered = {"details": private, "reason": reason}
                    committed = jcs.encode_plain(covered) if plain else jcs.dumps(covered)
                    fast = hmac.digest(key, committed, "sha256").hex() if key is not None else None
            except (TypeError, ValueError, UnicodeEncodeError, rfc8785.CanonicalizationError):
                fast = None
            if fast != text:
                row = {"v": event[12], "reason": reason, "details": details, "text_digest": text}
                problem = text_problem(row, salt)
                if problem:
                    self.bad("content", problem, event[1], attempt_id)
        return _event_digest(attempt_id, event, public, plain, text=text, quoted=quoted)

    def salted_row(
        self, row: tuple, events: list[tuple], created: dict[str, Any], args: _Args
    ) -> bool:
        """Format 3: the attempt's args are what its creation event's salted digest committed
        to, or were erased by an erasure its history records. Returns whether they were erased
        (then they hash to nothing, and the unsalted args_hash is no longer in the history)."""
        attempt_id = row[1]
        erasures = [event[1] for event in events if event[2] == ERASURE_ACTION]
        value = args.value()
        if value == ERASED_ARGS:
            if not erasures:
                self.bad(
                    "attempt",
                    "its args are the erasure marker but its history records no erasure: "
                    "the args were deleted behind the ledger's back",
                    attempt_id=attempt_id,
                )
            return True
        if erasures:
            self.bad(
                "attempt",
                "its history records an erasure but it has args again: the row was edited",
                erasures[-1],
                attempt_id,
            )
            return False
        salt = row[SALT]
        recorded = created.get("args_digest")
        try:
            matches = bool(salt) and (
                args.commitment(salt) == recorded
                or args_commitment(salt, value) == recorded  # the reference has the last word
            )
        except (TypeError, ValueError, rfc8785.CanonicalizationError):
            matches = False  # a salt that is not hex, or args JCS cannot carry
        if not matches:
            self.bad(
                "attempt",
                "its args (with its salt) are not what its creation event committed to: the "
                "args or the salt were edited",
                events[0][1],
                attempt_id,
            )
        return False

    def check_row(self, row: tuple, events: list[tuple], details: list[Any]) -> None:
        (
            _pk,
            attempt_id,
            state,
            tenant,
            task_id,
            tool_name,
            key,
            args,
            args_hash,
            policy_version,
            scope,
            parent_attempt_id,
            provider_request_id,
            result_ref,
        ) = row[:14]
        first_event_id, first_action = (events[0][1], events[0][2]) if events else (None, None)
        parsed = _Args(args)

        def bad(message: str, event_id: int | None = None) -> None:
            self.bad("attempt", message, event_id, attempt_id)

        erased = False
        if first_event_id is None:
            bad(
                "the attempt has no history: it was inserted without one or its history was deleted"
            )
            return
        if first_action != "attempt.created":
            bad(
                f"its first event is {first_action!r}, not 'attempt.created': its creation event "
                "was deleted",
                first_event_id,
            )
        else:
            try:
                created = details[0] or {}
                actual = {
                    "tenant": tenant,
                    "task_id": task_id,
                    "tool_name": tool_name,
                    "idempotency_key": key,
                    "args_hash": args_hash,
                    "policy_version": policy_version,
                    "credential_scope": load_json(scope),
                    "parent_attempt_id": parent_attempt_id,
                }
            except ValueError as exc:
                bad(f"unreadable JSON in the attempt or its creation event: {exc}")
                return
            salted = events[0][12] is not None and int(events[0][12]) >= SALTED_FORMAT
            erased = salted and self.salted_row(row, events, created, parsed)
            for name in KEY_FIELDS:
                if erased and name == "args_hash":
                    continue  # committed as free text, erased with it
                if created.get(name) != actual[name]:
                    bad(
                        f"{name} is {actual[name]!r} but its creation event recorded "
                        f"{created.get(name)!r}: the attempt row was edited",
                        first_event_id,
                    )
        if not erased:  # erased args hash to nothing: the history's erasure event says so
            try:
                value = parsed.value()
                if parsed.digest() != args_hash and _reference_digest(value) != args_hash:
                    bad("its args no longer hash to its args_hash: the args were edited")
            except (ValueError, TypeError, rfc8785.CanonicalizationError) as exc:
                bad(f"its args cannot be hashed: {exc}")
        last = events[-1]
        last_event_id, last_to_state = last[1], last[6]
        if state != last_to_state:
            bad(
                f"its state is {state} but its last event (id {last_event_id}) moved it to "
                f"{last_to_state}: the state was edited or its latest events were deleted",
                last_event_id,
            )
        recorded = {"provider_request_id": "", "result_ref": ""}
        for detail in details:
            if isinstance(detail, dict):
                for name in TRACKED_FIELDS:
                    if name in detail and isinstance(detail[name], str):
                        recorded[name] = detail[name]
        for name, value in (
            ("provider_request_id", provider_request_id),
            ("result_ref", result_ref),
        ):
            if (value or "") != recorded[name]:
                bad(
                    f"its {name} is {value!r} but its history last recorded "
                    f"{recorded[name]!r}: the attempt row was edited",
                    last_event_id,
                )

    # -- 8: approvals (invariant 13), from the chain alone, as the offline verifier checks them
    def approvals(self, attempt_id: Any, events: list[tuple], details: list[Any]) -> None:
        """``[approvals]`` (``verify_export.approval_problems``): every move that needed
        approvals had them in the attempt's own chain. Most attempts never waited for one:
        only chains with an approval event or a move out of a hold or of review are read."""
        if not any(e[2] == APPROVAL_EVENT or e[5] in (AWAITING, REVIEW) for e in events):
            return
        rows = [
            {
                "id": e[1],
                "action": e[2],
                "actor_kind": e[3],
                "actor": e[4],
                "from_state": e[5],
                "to_state": e[6],
                "details": d,
                "created_at": e[9],
            }
            for e, d in zip(events, details, strict=True)
        ]
        for event_id, message in approval_problems(rows):
            self.bad(APPROVALS_CHECK, message, event_id, attempt_id)

    def approval_rows(self) -> None:
        """``[approvals]``: every row of the approvals table (an index) is one approval event
        of its attempt's chain, by the same person at the same moment. A row without its event
        decides nothing, but says that someone wrote behind the ledger's back."""
        if not self.has_table(APPROVAL_ROWS):
            return
        for row_id, attempt_id, who in self.stream(ORPHAN_APPROVAL_SQL):
            self.bad(
                APPROVALS_CHECK,
                f"approval row {row_id} (by {who}) has no approval event in the attempt's "
                "chain: it was written behind the ledger's back, and counts for nothing",
                attempt_id=attempt_id,
            )

    def has_table(self, table: str) -> bool:
        if self.vendor == "postgresql":
            sql = f"SELECT to_regclass('{table}') IS NOT NULL"
        else:
            sql = f"SELECT count(*) > 0 FROM sqlite_master WHERE name = '{table}'"  # noqa: S608
        return bool(next(iter(self.stream(sql)))[0])

    # -- 6: checkpoints and the config chain
    def checkpoints(self) -> None:
        config_hashes: list[str] = []
        prev = GENESIS
        for values in self.stream(CONFIG_SQL):
            row = dict(
                zip(
                    (
                        "id",
                        "seq",
                        "subject",
                        "action",
                        "actor_kind",
                        "actor",
                        "before",
                        "after",
                        "reason",
                        "created_at",
                        "prev_hash",
                        "hash",
                    ),
                    values,
                    strict=True,
                )
            )
            where = f"config change {row['seq']} ({row['subject']})"
            unhashable = ""
            try:
                row["before"], row["after"] = load_json(row["before"]), load_json(row["after"])
                recomputed = config_event_hash(row)
            except (TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
                recomputed, unhashable = None, cannot_hash(exc)
            if recomputed is None or recomputed != row["hash"]:
                self.bad(
                    "config",
                    f"{where}: its fields do not match its hash: it was edited{unhashable}",
                )
            if row["seq"] != len(config_hashes) + 1:
                self.bad(
                    "config",
                    f"{where}: expected change {len(config_hashes) + 1}: changes were deleted, "
                    "inserted or reordered",
                )
            if row["prev_hash"] != prev:
                self.bad("config", f"{where}: broken link to the change before it")
            prev = row["hash"]
            config_hashes.append(row["hash"])

        start = self.since[0] if self.since else 0
        leaves = self.stream(LEAF_SQL.format(seq=int(start)))
        pending: tuple | None = next(leaves, None)
        prev = GENESIS
        expected_seq = start or 1
        checkpoint_sql = CHECKPOINT_SQL if self.has_log() else OLD_CHECKPOINT_SQL
        for values in self.stream(checkpoint_sql.format(seq=int(start))):
            pk, seq, prev_hash, root, size, config_length, config_head, sealed_at, stored = values[
                :9
            ]
            if self.since and seq == start:
                # Verified by the run that printed it; everything after must chain to it.
                if stored != self.since[1]:
                    self.bad(
                        "anchor",
                        f"checkpoint {seq} is {str(stored)[:16]}…, not the {self.since[1][:16]}… "
                        "verified before (--since): history up to it was rewritten",
                    )
                prev, expected_seq, self.checkpoint = stored, seq + 1, (seq, stored)
                continue
            fields = {
                "format": values[9],
                "authority": values[10],
                "seq": seq,
                "prev_hash": prev_hash,
                "root": root,
                "size": size,
                "config_length": config_length,
                "config_head": config_head,
                "sealed_at": sealed_at,
            }
            where = f"checkpoint {seq}"
            if checkpoint_hash(fields) != stored:
                self.bad("checkpoint", f"{where}: its fields do not match its hash: it was edited")
            if seq != expected_seq:
                self.bad(
                    "checkpoint",
                    f"{where}: expected checkpoint {expected_seq}: checkpoints were deleted or "
                    "inserted",
                )
            if prev_hash != prev:
                self.bad(
                    "checkpoint",
                    f"{where}: its prev_hash is not the hash of the checkpoint before it: an "
                    "earlier checkpoint was changed, deleted or inserted",
                )
            mine: list[bytes] = []
            logged = values[9] >= LOG_FORMAT  # its leaves are hashed once, by log_checks()
            while pending is not None and pending[0] == pk:
                _, position, attempt_id, length, head = pending
                if position != len(mine):
                    self.bad("checkpoint", f"{where}: leaf {position} is out of place")
                mine.append(b"" if logged else _leaf_digest(attempt_id, length, head))
                pending = next(leaves, None)
            if logged:
                pass  # the log's root over every leaf: checked by log_checks()
            elif len(mine) != size or MerkleTree(mine).root() != root:
                self.bad(
                    "checkpoint",
                    f"{where}: its {len(mine)} leaves do not give its root over {size}: sealed "
                    "heads were edited, deleted or added",
                )
            if config_length > len(config_hashes) or (
                config_length and config_hashes[config_length - 1] != config_head
            ):
                self.bad(
                    "config",
                    f"{where} sealed {config_length} config changes ending "
                    f"{str(config_head)[:16]}…, which the config chain no longer has",
                )
            if stored in self.anchors:
                self.found.add(stored)
            prev = stored
            expected_seq = seq + 1
            self.checkpoint = (seq, stored)
        leaves.close()
        if self.since and (self.checkpoint is None or self.checkpoint[0] < start):
            self.bad(
                "anchor",
                f"checkpoint {start} (--since) is not in this ledger: the checkpoints after it "
                "were cut, or this is another ledger",
            )

    def finish(self, report: Report) -> None:
        for anchor in sorted(self.anchors - self.found):
            self.bad(
                "anchor",
                f"the hash {anchor} kept elsewhere is neither a checkpoint nor a head of this "
                "ledger: history up to it was rewritten, or the checkpoints after it were cut",
            )
        age = (
            (self.now - self.oldest_unsealed).total_seconds()
            if self.oldest_unsealed is not None
            else 0.0
        )
        if self.max_unsealed_seconds is not None and age > self.max_unsealed_seconds:
            self.bad(
                "window",
                f"{self.unsealed_attempts} attempts have history that no checkpoint seals, the "
                f"oldest for {age:.0f}s (allowed {self.max_unsealed_seconds:.0f}s): the sealer "
                "is not running, or checkpoints were removed",
            )
        report.events = self.events
        report.checkpoint = self.checkpoint
        report.notes.append(f"{self.attempts} attempts checked against their history")
        report.notes.append(
            f"unsealed: {self.unsealed_attempts} attempts"
            + (f", oldest unsealed change {age:.0f}s ago" if self.unsealed_attempts else "")
            + " (detected from the next checkpoint on; keep the newest checkpoint hash elsewhere)"
        )
        report.truncated = self.checker.truncated


def verify_database(
    cursor_factory: Callable[[], Any] | Cursors,
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    now: dt.datetime | None = None,
    what: str = "database",
    jobs: int = 1,
    connect: Callable[[], Callable[[], Any] | Cursors] | None = None,
    before_fork: Callable[[], None] | None = None,
    since: tuple[int, str] | None = None,
    log_keys: Iterable[Any] = (),
    witness_keys: Iterable[Any] = (),
    vendor: str = "sqlite",
    archive_dir: Path | None = None,
    trust: Trust | None = None,
) -> Report:
    """Verify the history and every attempt row. ``cursor_factory`` returns a fresh DB-API
    cursor (``dbadapter.streaming_cursor`` streams on PostgreSQL), or is a
    ``Cursors`` pair that also says how to read one bounded batch.
    ``before_fork`` closes this process's connection before workers start: a connection must
    never be shared with a forked process. ``vendor`` ("sqlite", "postgresql") picks the form
    of the queries that reads best there (any form works on both).

    With ``jobs`` > 1 and ``connect`` (called in each worker process, returns that process's
    cursor factory), the attempts' chains, which are independent, are verified by that many
    processes, each over ranges of attempt ids; problems are reported in the same order as by
    one process. ``since`` (seq, hash) of a checkpoint an earlier run verified: only attempts
    that changed after it, and the checkpoints after it, are checked (the config chain and the
    orphan checks always run whole). ``trust``: what configuration says the newest checkpoint
    must carry (``checkpoint_trust``); None checks only the signatures stored."""
    verifier = _Verifier(
        cursor_factory,
        anchors=anchors,
        max_problems=max_problems,
        max_unsealed_seconds=max_unsealed_seconds,
        now=now,
        since=since,
        vendor=vendor,
    )
    report = Report(what=what, problems=verifier.checker.problems)
    lo, hi = verifier.id_range()

    def rest() -> None:  # everything but the attempts' chains, in the order it is reported
        verifier.orphans_and_missing(lo, hi)
        verifier.approval_rows()
        verifier.checkpoints()
        log_checks(verifier, log_keys=log_keys, witness_keys=witness_keys)
        if trust is not None:
            checkpoint_trust(verifier, report, trust)

    if jobs > 1 and connect is not None and hi - lo > BATCH:
        if before_fork is not None:
            before_fork()
        _parallel(verifier, lo, hi, jobs=jobs, connect=connect, rest=rest)
    else:
        verifier.legacy()
        verifier.attempts_and_events(lo, hi)
        rest()
    if verifier.has_archives():
        archive_checks(verifier, report, archive_dir=archive_dir, log_keys=log_keys)
    verifier.finish(report)
    if since:
        report.notes.append(f"incremental: attempts changed after checkpoint {since[0]} only")
    if verifier.checkpoint:
        seq, digest = verifier.checkpoint
        report.notes.append(f"to resume from here: --since {seq}:{digest}")
    return report


# -- The transparency log (checkpoint format 2, attempts/log.py): separate from the chain walk.

LOG_ENTRY_SQL = """
SELECT e."index", l.attempt_id, l.length, l.head, n.hash
FROM attempts_logentry e JOIN attempts_checkpointleaf l ON l.id = e.leaf_id
LEFT JOIN attempts_lognode n ON n.level = 0 AND n."index" = e."index"
ORDER BY e."index"
"""
LOG_CHECKPOINT_SQL = """
SELECT id, seq, size, root, config_length, config_head, authority, note FROM attempts_checkpoint
WHERE format >= 2 ORDER BY seq
"""
LOG_SIGNATURE_SQL = """
SELECT checkpoint_id, kind, line FROM attempts_checkpointsignature ORDER BY checkpoint_id, id
"""


def log_checks(verifier: _Verifier, *, log_keys=(), witness_keys=()) -> None:
    """``[log]``: the log's leaves, in order, are the sealed heads, and the tree over them has
    each format-2 checkpoint's root at its size; each checkpoint's note states its own size,
    root, config head and authority digest. ``[signature]``: with the log's verifier keys, every
    stored log signature verifies; with witness keys, every stored cosignature does."""
    from attempts.verify_export import (
        EXT_AUTHORITY,
        EXT_CHECKPOINT,
        EXT_CONFIG,
        LogBuilder,
        LogCheckpoint,
        NoteError,
        note_signed_by,
        split_note,
    )

    if not verifier.has_log():
        return
    checkpoints = list(verifier.stream(LOG_CHECKPOINT_SQL))
    if not checkpoints:
        return
    by_size: dict[int, list[tuple]] = {}
    for row in checkpoints:
        by_size.setdefault(row[2], []).append(row)
    builder = LogBuilder()

    def at_size() -> None:
        for row in by_size.pop(builder.size, ()):
            if builder.root().hex() != row[3]:
                verifier.bad(
                    "log",
                    f"checkpoint {row[1]}: its root is not the log's root at size {row[2]}: "
                    "logged heads were edited, removed or inserted",
                )

    at_size()  # checkpoints that sealed only configuration changes before any leaf
    expected_index = 0
    for index, attempt_id, length, head, stored in verifier.stream(LOG_ENTRY_SQL):
        if index != expected_index:
            verifier.bad("log", f"log leaf {expected_index} is missing (next is {index})")
            expected_index = index
        value = _leaf_digest(attempt_id, length, head)
        if stored is None or bytes(stored) != value:
            verifier.bad(
                "log",
                f"log leaf {index}'s stored hash is not the hash of its sealed head "
                f"({attempt_id} at {length}): the log was edited",
            )
        builder.append(value)
        expected_index += 1
        at_size()
    for rows in by_size.values():
        for row in rows:
            verifier.bad(
                "log", f"checkpoint {row[1]} covers {row[2]} leaves; the log holds {builder.size}"
            )
    signatures: dict[int, list[tuple[str, str]]] = {}
    for checkpoint_id, kind, line in verifier.stream(LOG_SIGNATURE_SQL):
        signatures.setdefault(checkpoint_id, []).append((kind, line))
    log_keys, witness_keys = list(log_keys), list(witness_keys)
    for pk, seq, size, root, config_length, config_head, authority, note in checkpoints:
        where = f"checkpoint {seq}"
        try:
            body = LogCheckpoint.parse(note)
        except NoteError as exc:
            verifier.bad("log", f"{where}: its note does not parse: {exc}")
            continue
        claims = (
            body.size == size
            and body.root.hex() == root
            and body.extension(EXT_CHECKPOINT) == [str(seq)]
            and body.extension(EXT_CONFIG) == [str(config_length), config_head]
            and (body.extension(EXT_AUTHORITY) or [""]) == [authority]
        )
        if not claims:
            verifier.bad("log", f"{where}: its note does not state its own size, root and heads")
        for kind, line in signatures.get(pk, ()):
            keys = log_keys if kind == "log" else witness_keys
            if not keys:
                continue
            try:
                _, (signature,) = split_note("x\n\n" + line)
            except (NoteError, ValueError):
                verifier.bad("signature", f"{where}: a malformed {kind} signature line")
                continue
            known = [k for k in keys if k.name == signature.name and k.id == signature.id]
            if known and not any(note_signed_by(note, signature, k) for k in known):
                verifier.bad(
                    "signature",
                    f"{where}: the {kind} signature of {signature.name} does not verify: the "
                    "checkpoint was changed after it was signed",
                )


# -- The newest checkpoint verifies on its own (docs/audit-chain.md, "What stands on keys"):
# decided from configuration and keys, never from rows an attacker can edit. A database writer
# can recompute every hash, but not make a signature of the log's key or of a witness, nor
# change the signer's memory (a file beside the key) or this process's configuration.


@dataclass(frozen=True)
class Trust:
    """What the newest checkpoint must carry, from configuration: the log's verifier keys (the
    current one and the old ones still trusted), the witnesses' keys and their quorum, and the
    newest tree the signer remembers signing (``memory``: where, ``signed``: (size, root), or
    None when it has signed nothing there yet). ``require_signed``: with no log key
    configured, unsigned checkpoints fail instead of being a note. ``restored``: the database
    is a restored copy (a backup), older than the signer's memory may be: a remembered tree
    larger than its log is then a note, not a rollback."""

    log_keys: tuple[Any, ...] = ()
    witness_keys: tuple[Any, ...] = ()
    quorum: int = 0
    memory: str = ""
    signed: tuple[int, bytes] | None = None
    require_signed: bool = False
    restored: bool = False


def configured_trust(*, require_signed: bool = False, restored: bool = False) -> Trust:
    """``Trust`` from the settings (``LEDGERWEB_TLOG_*``) and the signer's memory. Raises
    ``log.LogKeyError`` / ``NoteError`` for a key that is malformed or unreadable."""
    from attempts import log

    kept = log.signed_tree()
    return Trust(
        log_keys=tuple(log.verifier_keys()),
        witness_keys=tuple(w.key for w in log.witnesses()),
        quorum=log.quorum(),
        memory=str(kept[0]) if kept else "",
        signed=kept[1] if kept else None,
        require_signed=require_signed,
        restored=restored,
    )


TRUST_CHECKPOINT_SQL = """
SELECT id, seq, size, root, note FROM attempts_checkpoint WHERE format >= 2 ORDER BY seq
"""
# Problems of one kind listed before "and N more".
TRUST_LISTED = 5


def checkpoint_trust(verifier: _Verifier, report: Report, trust: Trust) -> None:
    """``[signature]``: with a log key configured, checkpoints are signed by a configured key
    (or an old verifier key) up to the newest signed one, which is where the signer's memory
    outside the database says; a log signature by any other key is reported. ``[witness]``:
    with witnesses configured, a signed checkpoint is cosigned by the quorum of their keys.
    The newest checkpoints wait a moment for their signature and cosignatures (the worker adds
    them after sealing): those are a note. Rows (signatures, ``WitnessState``) are evidence
    checked with the keys, never trusted for what they say."""
    from attempts.verify_export import NoteError, note_signed_by, split_note

    if not verifier.has_log():
        return
    checkpoints = list(verifier.stream(TRUST_CHECKPOINT_SQL))
    if not checkpoints:
        return
    if not trust.log_keys:
        message = (
            "checkpoints are not signed: no log key is configured (LEDGERWEB_TLOG_KEY_FILE or "
            "LEDGERWEB_TLOG_SIGN_COMMAND), so a rewrite of the whole database is seen only "
            "against a checkpoint hash kept elsewhere (--expect-head)"
        )
        if trust.require_signed:
            verifier.bad("signature", message)
        else:
            report.notes.append(message)
        return
    lines: dict[int, list[tuple[str, str]]] = {}
    for checkpoint_id, kind, line in verifier.stream(LOG_SIGNATURE_SQL):
        lines.setdefault(checkpoint_id, []).append((kind, line))
    signed: set[int] = set()
    cosigners: dict[int, set[str]] = {}
    strangers: list[str] = []
    unconfigured_witnesses: set[str] = set()
    for pk, seq, _size, _root, note in checkpoints:
        for kind, line in lines.get(pk, ()):
            try:
                _, (signature,) = split_note("x\n\n" + line)
            except (NoteError, ValueError):
                continue  # reported by log_checks
            if kind == "log":
                keys = [
                    k for k in trust.log_keys if (k.name, k.id) == (signature.name, signature.id)
                ]
                if not keys:
                    strangers.append(
                        f"checkpoint {seq}: signed by {signature.name} (key id "
                        f"{signature.id.hex()}), which is neither the log's configured key nor "
                        "a listed old verifier key (LEDGERWEB_TLOG_OLD_VERIFIER_KEYS)"
                    )
                elif any(note_signed_by(note, signature, k) for k in keys):
                    signed.add(seq)
            else:
                keys = [
                    k
                    for k in trust.witness_keys
                    if (k.name, k.id) == (signature.name, signature.id)
                ]
                if not keys:
                    unconfigured_witnesses.add(signature.name)
                elif any(note_signed_by(note, signature, k) for k in keys):
                    cosigners.setdefault(seq, set()).add(signature.name)
    for message in strangers[:TRUST_LISTED]:
        verifier.bad("signature", message)
    if len(strangers) > TRUST_LISTED:
        verifier.bad("signature", f"and {len(strangers) - TRUST_LISTED} more such signatures")
    names = ", ".join(sorted({k.name for k in trust.log_keys}))
    seqs = [row[1] for row in checkpoints]
    if not signed:
        verifier.bad(
            "signature",
            f"no checkpoint carries a valid signature of the log's key ({names}): the "
            f"{len(seqs)} checkpoints were made without it, or history was rewritten and the "
            "signatures deleted",
        )
    else:
        newest = max(signed)
        gaps = [seq for seq in seqs if seq < newest and seq not in signed]
        for seq in gaps[:TRUST_LISTED]:
            verifier.bad(
                "signature",
                f"checkpoint {seq} carries no valid signature of the log's key, though "
                f"checkpoint {newest} after it does: its signature was deleted, or it was "
                "inserted",
            )
        if len(gaps) > TRUST_LISTED:
            verifier.bad("signature", f"and {len(gaps) - TRUST_LISTED} more unsigned checkpoints")
        waiting = sum(1 for seq in seqs if seq > newest)
        if waiting:
            report.notes.append(
                f"{waiting} checkpoints after checkpoint {newest} wait for the log's signature "
                "(the worker signs each after sealing)"
            )
    _signer_memory(verifier, report, trust, checkpoints, signed)
    _witness_quorum(verifier, report, trust, seqs, signed, cosigners)
    if unconfigured_witnesses:
        report.notes.append(
            "cosignatures by witnesses that are not configured are not counted: "
            + ", ".join(sorted(unconfigured_witnesses))
        )


def _signer_memory(
    verifier: _Verifier, report: Report, trust: Trust, checkpoints: list[tuple], signed: set[int]
) -> None:
    """The newest tree the signer signed (its memory, outside the database) is a signed
    checkpoint of this log: deleting the newest signatures, rolling back, or rewriting what
    they covered shows here even when older signatures were left alone."""
    if trust.signed is None:
        report.notes.append(
            f"the signer's memory of the newest tree it signed ({trust.memory or 'none'}) is "
            "not on this host or empty: the newest signed checkpoint is pinned by its "
            "signature and the witnesses only"
        )
        return
    size, root = trust.signed
    if any(s == size and r == root.hex() and seq in signed for _, seq, s, r, _ in checkpoints):
        return
    if trust.restored and size > max(row[2] for row in checkpoints):
        report.notes.append(
            f"the log's signer has since signed a tree of {size} leaves: this restored copy is "
            "older, as a backup is (its own checkpoints verify with the keys)"
        )
        return
    verifier.bad(
        "signature",
        f"the log's signer last signed a tree of {size} leaves with root {root.hex()[:16]}… "
        f"(its memory outside the database, {trust.memory}), and no checkpoint here is that "
        "tree with a valid signature: history was rewritten or rolled back, or the signatures "
        "were deleted",
    )


def _witness_quorum(
    verifier: _Verifier,
    report: Report,
    trust: Trust,
    seqs: list[int],
    signed: set[int],
    cosigners: dict[int, set[str]],
) -> None:
    """With witnesses configured, a signed checkpoint is cosigned by the quorum of their keys;
    the newest wait for them a moment (a note)."""
    if not trust.witness_keys or trust.quorum < 1 or not signed:
        return
    witnessed = [
        seq for seq in seqs if seq in signed and len(cosigners.get(seq, ())) >= trust.quorum
    ]
    names = ", ".join(sorted({k.name for k in trust.witness_keys}))
    if not witnessed:
        verifier.bad(
            "witness",
            f"no checkpoint is cosigned by {trust.quorum} of the configured witnesses ({names}): "
            "they are down or behind, or their cosignatures were deleted",
        )
        return
    waiting = sum(1 for seq in seqs if seq > witnessed[-1])
    if waiting:
        report.notes.append(
            f"{waiting} checkpoints after checkpoint {witnessed[-1]} wait for the witnesses' "
            "cosignatures"
        )


# The worker processes' context (set in the parent before the fork, read in the children).
_WORKER: dict[str, Any] = {}


def _range_worker(task: tuple[int, int]) -> tuple:
    if "factory" not in _WORKER:
        _WORKER["factory"] = _WORKER["connect"]()
    verifier = _Verifier(
        _WORKER["factory"],
        anchors=(),
        max_problems=_WORKER["max_problems"],
        max_unsealed_seconds=None,
        now=_WORKER["now"],
        since=_WORKER["since"],
        vendor=_WORKER["vendor"],
    )
    verifier.attempts_and_events(*task)
    checker = verifier.checker
    return (
        verifier.events,
        verifier.attempts,
        verifier.unsealed_attempts,
        verifier.oldest_unsealed,
        checker.problems,
        checker.truncated,
    )


def _parallel(
    verifier: _Verifier,
    lo: int,
    hi: int,
    *,
    jobs: int,
    connect: Callable[[], Any],
    rest: Callable[[], None],
) -> None:
    """Verify attempts (lo, hi] in ``jobs`` processes, merging their results in id order, while
    this process checks the format-1 chain and then the ``rest``. Problems are listed in the
    order one process finds them: format 1, the attempts, the rest."""
    import multiprocessing

    pieces = jobs * 8
    step = max(BATCH, -(-(hi - lo) // pieces))
    tasks = [(start, min(start + step, hi)) for start in range(lo, hi, step)]
    _WORKER.update(
        connect=connect,
        max_problems=verifier.checker.max_problems,
        now=verifier.now,
        since=verifier.since,
        vendor=verifier.vendor,
    )
    _WORKER.pop("factory", None)
    # fork: the workers start at once with the code loaded; each opens its own connection.
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        results = pool.imap(_range_worker, tasks)
        checker = verifier.checker
        earlier, checker.problems = checker.problems, []
        verifier.legacy()
        first, checker.problems = checker.problems, []
        rest()
        later, checker.problems = checker.problems, earlier
        for problem in first:
            checker.problem(problem)
        for events, attempts, unsealed, oldest, problems, truncated in results:
            verifier.events += events
            verifier.attempts += attempts
            verifier.unsealed_attempts += unsealed
            if oldest is not None and (
                verifier.oldest_unsealed is None or oldest < verifier.oldest_unsealed
            ):
                verifier.oldest_unsealed = oldest
            for problem in problems:
                checker.problem(problem)
            checker.truncated |= truncated
    for problem in later:
        checker.problem(problem)


_string = jcs.encode_string
# What a format-3 event with no reason and no private details commits to (salted per attempt).
NO_TEXT = jcs.dumps({"details": {}, "reason": ""})


class _NotPlain(Exception):
    pass


def _no_float(text: str) -> Any:
    raise _NotPlain


def _small_int(text: str) -> int:
    # 15 digits are always within JCS's range (below 2**53); longer ones ask jcs.plain.
    if len(text) > 15:
        raise _NotPlain
    return int(text)


_scan_plain = json.JSONDecoder(
    parse_float=_no_float, parse_int=_small_int, parse_constant=_no_float
).scan_once


def _load_details(value: Any) -> tuple[Any, bool | None]:
    """An event's ``details`` column as Python, and whether the fast encoder writes it exactly as
    RFC 8785 does (``jcs.plain``), told from the text where that is cheap: ASCII JSON with no
    ``\\u`` escape (so no astral or lone surrogate characters), no number with a fraction or an
    exponent, no integer that could be out of range. None: not known, ask ``jcs.plain``."""
    if type(value) is str and value.isascii() and "\\u" not in value:
        try:
            parsed, end = _scan_plain(value, 0)
        except (_NotPlain, StopIteration):
            return load_json(value), None
        if end == len(value):
            return parsed, True
    return load_json(value), None


def _event_payload(attempt_id: Any, event: tuple, details: Any) -> dict[str, Any]:
    """What an event's hash covers (``verify_export.event_payload``), from EVENT_SQL's columns,
    for the reference encoder."""
    payload = {
        "v": int(event[12]),
        "attempt_id": attempt_id,
        "action": event[2],
        "actor_kind": event[3],
        "actor": event[4],
        "from_state": event[5],
        "to_state": event[6],
        "reason": event[7],
        "details": details,
        "created_at": _created_text(chain_time(event[9])),
        "prev_hash": event[10],
    }
    if payload["v"] >= SALTED_FORMAT:
        return salted_payload(payload, event[13] or "")
    return payload


def _event_digest(
    attempt_id: Any,
    event: tuple,
    details: Any,
    plain: bool | None,
    *,
    text: str | None = None,
    quoted: tuple[str | None, str | None] = (None, None),
) -> str:
    """The event's hash with the fast encoder: the payload's keys are fixed, so its canonical
    text is written in their sorted order here (the bytes ``jcs.encode_plain`` gives for
    ``_event_payload``, held to the reference by the tests) rather than sorting the keys of
    every event again. ``text``: a format-3 event's salted text digest (``details`` are then
    its public details; ``quoted``: the attempt id and the prev_hash already written as JSON
    strings, or None). Every field but ``details`` is text (or the format number) as read from
    the database, which the C encoder writes as RFC 8785 does, so only ``details`` needs
    checking (``plain``: known from its text, None: ask ``jcs.plain``); anything else, and a
    field that is not text, goes through ``jcs.dumps``. A mismatch is always recomputed with
    the reference encoder before it is reported."""
    if plain or (plain is None and jcs.plain(details)):
        try:
            quoted_id, quoted_prev = quoted
            prev = quoted_prev or _string(event[10])
            if text is not None:  # format 3: public details and the text digest, no reason
                body = (
                    f'"from_state":{_string(event[5])},"prev_hash":{prev},'
                    f'"text":{_string(text)},"to_state":{_string(event[6])},'
                )
            else:
                body = (
                    f'"from_state":{_string(event[5])},"prev_hash":{prev},'
                    f'"reason":{_string(event[7])},"to_state":{_string(event[6])},'
                )
            payload = (
                f'{{"action":{_string(event[2])},"actor":{_string(event[4])},'
                f'"actor_kind":{_string(event[3])},"attempt_id":{quoted_id or _string(attempt_id)},'
                f'"created_at":{_string(chain_time(event[9]))},'
                f'"details":{jcs.encode_plain_text(details)},{body}"v":{int(event[12])}}}'
            )
            return hashlib.sha256(payload.encode("utf-8")).hexdigest()
        except (TypeError, UnicodeEncodeError):
            pass  # a field that is not text (NULL, say), or a lone surrogate
    return hashlib.sha256(jcs.dumps(_event_payload(attempt_id, event, details))).hexdigest()


def _created_text(text: Any) -> Any:
    """The writer's text for an event time PostgreSQL gave as ``to_char`` text: the same, except
    a year before 1000, which ``chain_time`` writes unpadded."""
    if isinstance(text, str) and text.startswith("0") and len(text) == 27:
        return chain_time(_moment(text))
    return text


def _leaf_digest(attempt_id: Any, length: Any, head: Any) -> bytes:
    """``leaf_hash`` with the fast encoder (text and a small integer, as JCS writes them)."""
    if type(attempt_id) is str and type(head) is str and attempt_id.isascii() and head.isascii():
        leaf = f'\x00{{"attempt_id":{_string(attempt_id)},"head":{_string(head)},"length":{int(length)}}}'
        return hashlib.sha256(leaf.encode()).digest()
    return leaf_hash(attempt_id, length, head)


def _reference_digest(args: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(args)).hexdigest()


class _Args:
    """An attempt's args column, read and encoded once for the checks that hash it (the
    unsalted args_hash and format 3's salted commitment, ``{"args": ...}`` around the same
    canonical bytes); each raises what reading or encoding raises."""

    def __init__(self, column: Any) -> None:
        self.column = column
        self._value: Any = _Args
        self._encoded: bytes | None = None

    def value(self) -> Any:
        if self._value is _Args:
            self._value = load_json(self.column)
        return self._value

    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = jcs.dumps(self.value())
        return self._encoded

    def digest(self) -> str:
        return hashlib.sha256(self.encoded()).hexdigest()

    def commitment(self, salt: str) -> str:
        message = b'{"args":' + self.encoded() + b"}"
        return hmac.digest(bytes.fromhex(salt), message, "sha256").hex()


def verify_django_database(
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    using: str = "default",
    jobs: int = 1,
    since: tuple[int, str] | None = None,
    log_keys: Iterable[Any] = (),
    witness_keys: Iterable[Any] = (),
    archive_dir: Path | None = None,
    trust: Trust | None = None,
) -> Report:
    """Verify the database Django is configured with (in ``jobs`` processes: see
    ``verify_database``; ``log_keys``/``witness_keys``: verifier keys the stored signatures and
    cosignatures are checked with; ``trust``: what the newest checkpoint must carry, from
    configuration, ``configured_trust()``)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    from attempts import dbadapter

    connection = connections[using]
    name = connection.settings_dict.get("NAME")
    notes = []
    in_memory = connection.vendor == "sqlite" and connection.is_in_memory_db()
    if jobs > 1 and (dbadapter.in_atomic_block(connection) or in_memory):
        # Other processes could not see this transaction's rows, or this in-memory database.
        notes.append(f"verified in one process, not {jobs}: the database is not shareable here")
        jobs = 1

    def cursors() -> Cursors:
        # Whole tables stream through a server-side cursor; a batch is read in one go.
        db = connections[using]
        return Cursors(functools.partial(dbadapter.streaming_cursor, db), db.cursor)

    serial = connection.vendor == "postgresql" and not dbadapter.in_atomic_block(connection)
    if serial:
        # One plan per batch: the verifier already runs a process per core (--jobs), and a
        # parallel plan for a keyset batch of a few thousand rows costs more (starting its
        # workers, gathering, sorting again) than it saves. For this process's connection and
        # those its workers open.
        connection_created.connect(_serial_plans)
        if dbadapter.is_connected(connection):
            _serial_plans(connection=connection)
    try:
        report = verify_database(
            cursors(),
            anchors=anchors,
            max_problems=max_problems,
            max_unsealed_seconds=max_unsealed_seconds,
            what=f"{connection.vendor} database {name}",
            log_keys=log_keys,
            witness_keys=witness_keys,
            jobs=jobs,
            connect=cursors,
            # Each worker opens its own connection; one open here would be shared after the fork.
            before_fork=connection.close,
            since=since,
            vendor=connection.vendor,
            archive_dir=archive_dir,
            trust=trust,
        )
    finally:
        if serial:
            connection_created.disconnect(_serial_plans)
            if dbadapter.is_connected(connection):
                with connection.cursor() as cursor:
                    cursor.execute("RESET max_parallel_workers_per_gather")
    report.notes.extend(notes)
    check_config_drift(report, max_problems=max_problems)
    return report


def _serial_plans(connection: Any, **_: Any) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET max_parallel_workers_per_gather = 0")


def check_config_drift(report: Report, *, max_problems: int = 50) -> None:
    """``[config-drift]``: the live authority rows (tenants, people, roles, tokens, tools,
    grants, ...) are what the configuration history says they are. A row changed by SQL, or by
    a code path that bypassed the model's signals, shows here. Records a baseline first on a
    ledger from before its models were declared (``config_history.ensure_baseline``)."""
    from attempts import config_history

    baselined = config_history.ensure_baseline(force=True)
    if baselined:
        report.notes.append(
            "recorded a baseline of the authority rows the history did not hold yet: "
            + ", ".join(baselined)
        )
    live = config_history.live_authority()
    lines = config_history.drift(live, config_history.history_authority())
    for line in lines[:max_problems]:
        report.problems.append(
            Problem("config-drift", f"{line}: changed outside the recorded history")
        )
    if len(lines) > max_problems:
        report.truncated = True
    report.notes.append(
        f"authority rows match their history ({len(live)} rows, digest "
        f"{authority_digest_of(live)[:16]}…)"
        if not lines
        else f"{len(lines)} authority rows differ from their history"
    )


def verify_sqlite_file(
    path: str,
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    max_unsealed_seconds: float | None = None,
    jobs: int = 1,
    since: tuple[int, str] | None = None,
    archive_dir: Path | None = None,
) -> Report:
    """Verify a SQLite ledger file (a backup or a restored copy), opened read-only."""
    import sqlite3
    from pathlib import Path

    uri = Path(path).resolve().as_uri() + "?mode=ro"

    def connect() -> Callable[[], Any]:
        return sqlite3.connect(uri, uri=True).cursor

    conn = sqlite3.connect(uri, uri=True)
    try:
        return verify_database(
            conn.cursor,
            anchors=anchors,
            max_problems=max_problems,
            max_unsealed_seconds=max_unsealed_seconds,
            what=f"SQLite file {path}",
            jobs=jobs,
            connect=connect,
            since=since,
            archive_dir=archive_dir,
        )
    finally:
        conn.close()


# -- Archives (reconciliation/archive): attempts a checkpoint sealed and that were moved out.

ARCHIVE_SQL = "SELECT id, name, manifest_sha256, checkpoint_seq FROM attempts_archive ORDER BY id"
ARCHIVE_HISTORY_SQL = """
SELECT subject, after FROM attempts_configevent
WHERE action = 'archived' AND subject LIKE 'archive:%' ORDER BY seq
"""
ARCHIVED_ROWS_SQL = """
SELECT x.attempt_id, x.chain_length, x.chain_head, l.length, l.head
FROM attempts_archivedattempt x
LEFT JOIN attempts_checkpointleaf l ON l.attempt_id = x.attempt_id
     AND l.checkpoint_id = (SELECT MAX(l2.checkpoint_id) FROM attempts_checkpointleaf l2
                            WHERE l2.attempt_id = x.attempt_id)
WHERE x.archive_id = {archive} ORDER BY x.attempt_id
"""
ARCHIVE_NOTE_SQL = "SELECT note FROM attempts_checkpoint WHERE seq = {seq}"


def archive_checks(
    verifier: _Verifier,
    report: Report,
    *,
    archive_dir: Path | None,
    log_keys: Iterable[Any] = (),
) -> None:
    """``[archive]``: every archive is recorded in the configuration history with its manifest's
    SHA-256, and every removed attempt was sealed as its archive says. With ``archive_dir``
    (the folder holding the archive folders), each archive is read: the manifest is the one the
    history recorded, each file is whole, each attempt's history recomputes to the chain head a
    checkpoint sealed (its newest leaf here) and its receipt proves it into the archive's
    checkpoint, which is this ledger's checkpoint of that number. A tampered or missing file is
    named."""
    from attempts.verify_export import LogTrust, check_archive, read_folder, split_note

    recorded: dict[str, str] = {}
    for subject, after in verifier.stream(ARCHIVE_HISTORY_SQL):
        recorded[subject.removeprefix("archive:")] = str(
            (load_json(after) or {}).get("manifest_sha256", "")
        )
    archives = list(verifier.stream(ARCHIVE_SQL))
    removed = 0
    for pk, name, manifest_sha256, seq in archives:
        if recorded.get(name) != manifest_sha256:
            verifier.bad(
                "archive",
                f"{name}: the history does not record this archive with manifest SHA-256 "
                f"{manifest_sha256[:16]}…: its record was added or changed outside the history",
            )
        rows = list(verifier.stream(ARCHIVED_ROWS_SQL.format(archive=int(pk))))
        removed += len(rows)
        for attempt_id, length, head, leaf_length, leaf_head in rows:
            if (leaf_length, leaf_head) != (length, head):
                verifier.bad(
                    "archive",
                    f"{name}: the archived attempt's chain head is not the one its newest "
                    "checkpoint leaf sealed",
                    attempt_id=attempt_id,
                )
        if archive_dir is None:
            continue
        check = check_archive(
            read_folder(Path(archive_dir) / name),
            name=name,
            expect_sha256=recorded.get(name) or manifest_sha256,
            trust=LogTrust(log_keys=list(log_keys)),
        )
        for problem in check.problems:
            verifier.checker.problem(problem)
        if not check.ok and not check.leaves:
            continue
        notes = [row[0] for row in verifier.stream(ARCHIVE_NOTE_SQL.format(seq=int(seq)))]
        if (
            check.manifest
            and notes
            and split_note(check.manifest["checkpoint"]["note"])[0] != (notes[0])
        ):
            verifier.bad(
                "archive",
                f"{name}: the archive's checkpoint is not this ledger's checkpoint {seq}",
            )
        for attempt_id, length, head, _leaf_length, _leaf_head in rows:
            if check.leaves.get(attempt_id) != (length, head):
                if any(p.attempt_id == attempt_id for p in check.problems):
                    continue
                verifier.bad(
                    "archive",
                    f"{name}: the attempt is not in the archive as it was sealed",
                    attempt_id=attempt_id,
                )
    if archives:
        report.notes.append(
            f"{removed} removed attempts are archived in {len(archives)} archives"
            + (
                f", read from {archive_dir}"
                if archive_dir is not None
                else " (not read: give --archive FOLDER to check their histories and receipts)"
            )
        )
