"""Checks 1 to 5 and 8 of ``attempts.audit_verify``: each attempt's chain of events and its row
against that history, the ledger-wide chain of format 1, orphans and missing attempts, and the
approvals, read in keyset batches of attempt ids (``Verifier``, which also holds what every check
found)."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import hashlib
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

import rfc8785

from attempts import jcs
from attempts.audit_verify.digests import (
    KEY_FIELDS,
    NO_TEXT,
    Args,
    Quoted,
    SaltKey,
    common_events,
    event_digest,
    event_payload,
    event_time,
    load_details,
    load_json,
    reference_digest,
)
from attempts.verify_export import (
    APPROVAL_EVENT,
    APPROVALS_CHECK,
    AWAITING,
    ERASED_ARGS,
    ERASED_TEXT,
    ERASURE_ACTION,
    GENESIS,
    LEGACY_FORMAT,
    PUBLIC_DETAILS,
    REVIEW,
    SALTED_FORMAT,
    ChainChecker,
    ErasureProof,
    Problem,
    Report,
    approval_problems,
    args_commitment,
    cannot_hash,
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
# merged by attempt id) their events: read apart, the attempt's columns (its args, a JSON value)
# are read once, not once per event. ``{since}`` narrows both to the attempts that changed after
# a checkpoint (``--since``). The parent's id is a subquery: as a join, PostgreSQL hashed every
# attempt of the ledger for each batch; most attempts have no parent, and skip it.
ATTEMPT_SQL = f"""
SELECT a.id, a.attempt_id, a.state, a.tenant_id, a.task_id, a.tool_name, a.idempotency_key,
       a.args, a.args_hash, a.policy_version, a.credential_scope,
       CASE WHEN a.parent_id IS NOT NULL
            THEN (SELECT p.attempt_id FROM {ATTEMPTS} p WHERE p.id = a.parent_id) END,
       a.provider_request_id, a.result_ref, a.chain_head, a.chain_length, a.sealed,
       l.length, l.head, l.checkpoint_id, a.args_salt
FROM {ATTEMPTS} a
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
"""  # noqa: S608 -- constant table names and integers only
# No ORDER BY: a batch's events are put in (attempt, id) order by the verifier (``_in_order``),
# which costs one pass when they come in that order already (SQLite reads them in the order of
# (attempt_id, id) index). PostgreSQL, asked to order them, sorted every batch, on disk once
# it outgrew work_mem, rather than read that index.
# SQLite: the time as stored (text), which Django's connection would otherwise turn into a
# datetime for the verifier to turn back into text.
EVENT_SQL_SQLITE = EVENT_SQL.replace("e.created_at,", "CAST(e.created_at AS TEXT),")
if "CAST" not in EVENT_SQL_SQLITE:  # the portable query changed: keep the two in step
    raise AssertionError("EVENT_SQL_SQLITE no longer replaces the event time")
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
# Sealed attempt ids whose attempt is gone, as anti-joins (NOT EXISTS): PostgreSQL plans them as
# one hash anti-join over the leaves, where the LEFT JOIN ... IS NULL form with the archives
# beside it looked up each leaf's attempt through the index.
MISSING_SQL = f"""
SELECT DISTINCT l.attempt_id FROM {LEAVES} l
WHERE NOT EXISTS (SELECT 1 FROM {ATTEMPTS} a WHERE a.attempt_id = l.attempt_id)
ORDER BY l.attempt_id
"""  # noqa: S608
# [missing] once archives exist: a sealed attempt that is gone must be listed as archived.
ARCHIVED = "attempts_archivedattempt"
UNARCHIVED_SQL = f"""
SELECT DISTINCT l.attempt_id FROM {LEAVES} l
WHERE NOT EXISTS (SELECT 1 FROM {ATTEMPTS} a WHERE a.attempt_id = l.attempt_id)
  AND NOT EXISTS (SELECT 1 FROM {ARCHIVED} x WHERE x.attempt_id = l.attempt_id)
ORDER BY l.attempt_id
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

# Attempt columns whose latest value the history records when they change.
TRACKED_FIELDS = ("provider_request_id", "result_ref")
# A chain with none of these has nothing for the erasure and approval checks to read.
_SPECIAL_ACTIONS = frozenset({ERASURE_ACTION, APPROVAL_EVENT})
_HELD = frozenset({AWAITING, REVIEW})
CHUNK = 5000
# Attempt ids per keyset batch of one worker.
BATCH = 5000


def _rows(cursor: Any, sql: str) -> Iterator[tuple]:
    cursor.execute(sql)
    while True:
        chunk = cursor.fetchmany(CHUNK)
        if not chunk:
            return
        yield from chunk


def _in_order(events: list[tuple]) -> list[tuple]:
    """One batch's events (EVENT_SQL's rows) by (attempt, id), sorted in place."""
    # Rows compare by attempt, then id (unique): the columns after them are never compared.
    events.sort()
    return events


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cycle collector off for one batch: the batch's rows, read at once, set it off several
    times a batch to walk the rows just read, though rows, details and digests form no cycles
    and are freed by their reference counts. It is on again after the batch (as it was), and
    collects anything cyclic made meanwhile as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Cursors(NamedTuple):
    """How the verifier opens cursors: ``stream`` for reads of a whole table (a server-side
    cursor where the database has one, so memory stays flat), ``batch`` for the reads of one
    keyset batch of attempts, which are bounded (a plain cursor: one round trip, and no copy of
    the result kept on the server)."""

    stream: Callable[[], Any]
    batch: Callable[[], Any]


def _cursors(factory: Callable[[], Any] | Cursors) -> Cursors:
    return factory if isinstance(factory, Cursors) else Cursors(factory, factory)


class Verifier:
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
        self.event_sql = EVENT_SQL_POSTGRESQL if vendor == "postgresql" else EVENT_SQL_SQLITE
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
        self.no_text_digests: dict[SaltKey, str] = {}
        self.quoted = Quoted()

    def bad(self, kind: str, message: str, event_id: int | None = None, attempt_id=None) -> None:
        self.checker.problem(Problem(kind, message, event_id, attempt_id))

    def stream(self, sql: str) -> Iterator[tuple]:
        cursor = self.cursor_factory()
        try:
            yield from _rows(cursor, sql)
        finally:
            cursor.close()

    def batch_rows(self, sql: str) -> list[tuple]:
        """Every row of a bounded read (one keyset batch) at once, from a plain cursor: no
        generator step per row, as the batch is held whole anyway."""
        cursor = self.cursors.batch()
        try:
            cursor.execute(sql)
            return cursor.fetchall()
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
            with _collector_paused():
                self.batch({"lo": int(start), "hi": int(min(start + BATCH, hi))}, since)

    def batch(self, bounds: dict[str, int], since: str) -> None:
        """One keyset batch: its attempts (ids in (lo, hi] of ``bounds``) and their events."""
        events_since = EVENT_SINCE_SQL.format(**bounds, since=since) if since else ""
        # Each attempt's events, grouped by attempt (``groupby``'s (pk, events) pairs).
        groups = groupby(
            _in_order(self.batch_rows(self.event_sql.format(**bounds, since=events_since))),
            itemgetter(0),
        )
        pending = next(groups, None)
        for row in self.batch_rows(self.attempt_sql.format(**bounds, since=since)):
            pk = row[0]
            while pending is not None and pending[0] < pk:
                self.orphans(pending[1])  # their attempt is gone
                pending = next(groups, None)
            if pending is not None and pending[0] == pk:
                self.attempt(row, list(pending[1]))
                pending = next(groups, None)
            else:
                self.attempt(row, [])
        while pending is not None:
            self.orphans(pending[1])
            pending = next(groups, None)

    def orphans(self, events: Iterable[tuple]) -> None:
        for event in events:
            self.orphan(event[1])

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
        chain_head, chain_length = row[14], row[15]
        self.attempts += 1
        self.events += len(events)
        hashes: list[str] = []
        details_seen: list[Any] = []
        salt = row[SALT]
        try:
            key = SaltKey(bytes.fromhex(salt)) if salt else None
        except ValueError:
            key = None  # an edited salt: the args check says so, the text checks use the reference
        # The attempt id and the previous event's hash go into every event's payload: the id is
        # encoded once per attempt, and a prev_hash equal to a digest this verifier computed is
        # hex, which JSON writes as it is (``prev_known``).
        quoted_id = jcs.encode_string(attempt_id) if type(attempt_id) is str else None
        prev_known = True  # GENESIS
        # Most events have no free text: their text digest is this one, for every such event.
        no_text = None
        if key is not None:
            no_text = key.hex(NO_TEXT)
            self.no_text_digests = {key: no_text}
        index, count = 0, len(events)
        while index < count:
            if prev_known and key is not None and no_text is not None and quoted_id is not None:
                # The short path, as far as it goes; the general one for the event it stops at.
                index = common_events(
                    self.quoted, quoted_id, events, index, key, no_text, hashes, details_seen
                )
                if index == count:
                    break
            event, index = events[index], index + 1
            prev = hashes[-1] if hashes else GENESIS
            event_id, prev_hash, stored, v = event[1], event[10], event[11], event[12]
            recomputed, details, unhashable = self.event_hash(
                attempt_id,
                event,
                salt,
                key,
                (quoted_id, f'"{prev}"') if prev_known and prev_hash == prev else (quoted_id, None),
            )
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
            hashes.append(stored)
            details_seen.append(details)
        for event in events:  # most chains erase nothing and waited for no approval
            if event[2] in _SPECIAL_ACTIONS or event[5] in _HELD or event[7] == ERASED_TEXT:
                self.check_row(row, events, details_seen, salt_key=key)
                self.erased_texts(attempt_id, events, details_seen, salt)
                self.approvals(attempt_id, events, details_seen)
                break
        else:
            if not _row_holds(row, events, details_seen, key):
                self.check_row(row, events, details_seen, salt_key=key)
        if (chain_head, chain_length) != ((hashes[-1] if hashes else ""), len(hashes)):
            self.bad(
                "attempt",
                f"its chain head says {chain_length} events ending {str(chain_head)[:16]}… but "
                f"its history has {len(hashes)}: events were deleted or the row was edited",
                attempt_id=attempt_id,
            )
        self.sealed(row, events, hashes)

    def sealed(self, row: tuple, events: list[tuple], hashes: list[str]) -> None:
        """5: the newest sealed head is the hash at that place of the chain; what came after it
        is unsealed (counted for ``[window]``) and the row does not say otherwise."""
        attempt_id, sealed = row[1], row[16]
        leaf_length, leaf_head = row[17], row[18]
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
            moment = event_time(events[sealed_length][9])
            if self.oldest_unsealed is None or moment < self.oldest_unsealed:
                self.oldest_unsealed = moment
            if sealed and leaf_length is not None:
                self.bad(
                    "seal",
                    f"marked sealed, but events after the first {sealed_length} are in no "
                    "checkpoint: the row was edited so the sealer would pass them over",
                    attempt_id=attempt_id,
                )

    def event_hash(
        self,
        attempt_id: Any,
        event: tuple,
        salt: str | None,
        key: SaltKey | None,
        quoted: tuple[str | None, str | None],
    ) -> tuple[str | None, Any, str]:
        """Any event's hash recomputed (the fast encoder first, the reference on a mismatch),
        its details, and why it cannot be hashed ("" when it can)."""
        text, v = event[8], event[12]
        try:
            details, plain = load_details(text)
            if v is not None and v >= SALTED_FORMAT:
                recomputed = self.salted_event(attempt_id, event, details, plain, salt, key, quoted)
            else:
                recomputed = event_digest(attempt_id, event, details, plain, quoted=quoted)
            if recomputed != event[11]:  # the reference encoder has the last word
                recomputed = hashlib.sha256(
                    rfc8785.dumps(event_payload(attempt_id, event, details))
                ).hexdigest()
        except (TypeError, ValueError, KeyError, rfc8785.CanonicalizationError) as exc:
            return None, None, cannot_hash(exc)
        return recomputed, details, ""

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
        key: SaltKey | None,
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
                        fast = key.hex(NO_TEXT)
                        self.no_text_digests = {key: fast}
                else:
                    covered = {"details": private, "reason": reason}
                    committed = jcs.encode_plain(covered) if plain else jcs.dumps(covered)
                    fast = key.hex(committed) if key is not None else None
            except (TypeError, ValueError, UnicodeEncodeError, rfc8785.CanonicalizationError):
                fast = None
            if fast != text:
                row = {"v": event[12], "reason": reason, "details": details, "text_digest": text}
                problem = text_problem(row, salt)
                if problem:
                    self.bad("content", problem, event[1], attempt_id)
        return event_digest(attempt_id, event, public, plain, text=text, quoted=quoted)

    def salted_row(
        self,
        row: tuple,
        events: list[tuple],
        created: dict[str, Any],
        args: Args,
        key: SaltKey | None = None,
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
                (key is not None and args.commitment(key) == recorded)
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

    def check_row(
        self,
        row: tuple,
        events: list[tuple],
        details: list[Any],
        salt_key: SaltKey | None = None,
    ) -> None:
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
        parsed = Args(args)

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
                actual = (
                    tenant,
                    task_id,
                    tool_name,
                    key,
                    args_hash,
                    policy_version,
                    load_json(scope),
                    parent_attempt_id,
                )  # KEY_FIELDS' values
            except ValueError as exc:
                bad(f"unreadable JSON in the attempt or its creation event: {exc}")
                return
            salted = events[0][12] is not None and int(events[0][12]) >= SALTED_FORMAT
            erased = salted and self.salted_row(row, events, created, parsed, salt_key)
            if tuple(map(created.get, KEY_FIELDS)) != actual:  # then say which differ
                for name, value in zip(KEY_FIELDS, actual, strict=True):
                    if erased and name == "args_hash":
                        continue  # committed as free text, erased with it
                    if created.get(name) != value:
                        bad(
                            f"{name} is {value!r} but its creation event recorded "
                            f"{created.get(name)!r}: the attempt row was edited",
                            first_event_id,
                        )
        if not erased:  # erased args hash to nothing: the history's erasure event says so
            _args_still_hash(parsed, args_hash, bad)
        last_event_id, last_to_state = events[-1][1], events[-1][6]
        if state != last_to_state:
            bad(
                f"its state is {state} but its last event (id {last_event_id}) moved it to "
                f"{last_to_state}: the state was edited or its latest events were deleted",
                last_event_id,
            )
        self.tracked(attempt_id, (provider_request_id, result_ref), details, last_event_id)

    def tracked(
        self, attempt_id: Any, values: tuple[Any, Any], details: list[Any], event_id: int
    ) -> None:
        """The row's provider request id and result reference are the latest its history
        recorded."""
        provider_request_id, result_ref = values
        recorded = {"provider_request_id": "", "result_ref": ""}
        for detail in details:
            # Most details name neither field: told in C, without a loop over the names here.
            if isinstance(detail, dict) and not detail.keys().isdisjoint(TRACKED_FIELDS):
                for name in TRACKED_FIELDS:
                    if name in detail and isinstance(detail[name], str):
                        recorded[name] = detail[name]
        for name, value in (
            ("provider_request_id", provider_request_id),
            ("result_ref", result_ref),
        ):
            if (value or "") != recorded[name]:
                self.bad(
                    "attempt",
                    f"its {name} is {value!r} but its history last recorded "
                    f"{recorded[name]!r}: the attempt row was edited",
                    event_id,
                    attempt_id,
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


def _row_holds(row: tuple, events: list[tuple], details: list[Any], key: SaltKey | None) -> bool:
    """``check_row``'s verdict, with fewer steps, for the attempts most of a ledger is made of
    (no erasure in their history, which the caller has looked for): a format-3 creation event
    first, whose key fields and args commitment the row matches, args in the plain form
    ``load_details`` recognizes that hash to the row's args_hash, and the state and tracked
    fields the history last recorded. False for anything else: ``check_row`` then decides,
    and says what is wrong."""
    if not events or key is None:
        return False
    first = events[0]
    created = details[0]
    if first[2] != "attempt.created" or first[12] != SALTED_FORMAT or type(created) is not dict:
        return False
    state, tenant, task_id, tool_name, idem, args, args_hash, policy, scope, parent = row[2:12]
    if state != events[-1][6]:
        return False
    try:
        value, plain = load_details(args)
        if not plain or value == ERASED_ARGS:
            return False
        actual = (tenant, task_id, tool_name, idem, args_hash, policy, load_json(scope), parent)
        if tuple(map(created.get, KEY_FIELDS)) != actual:
            return False
        encoded = jcs.encode_plain(value)
    except (TypeError, ValueError, UnicodeEncodeError):
        return False
    if hashlib.sha256(encoded).hexdigest() != args_hash:
        return False
    if key.hex(b'{"args":' + encoded + b"}") != created.get("args_digest"):
        return False
    provider_request_id = result_ref = ""
    for detail in details:  # the tracked fields' latest values (``Verifier.tracked``)
        if type(detail) is dict and not detail.keys().isdisjoint(TRACKED_FIELDS):
            if isinstance(text := detail.get("provider_request_id"), str):
                provider_request_id = text
            if isinstance(text := detail.get("result_ref"), str):
                result_ref = text
    return (row[12] or "") == provider_request_id and (row[13] or "") == result_ref


def _args_still_hash(parsed: Args, args_hash: str, bad: Callable[[str], None]) -> None:
    """Whether an attempt's args still hash to its ``args_hash`` (``bad`` says why not)."""
    try:
        value = parsed.value()
        if parsed.digest() != args_hash and reference_digest(value) != args_hash:
            bad("its args no longer hash to its args_hash: the args were edited")
    except (ValueError, TypeError, rfc8785.CanonicalizationError) as exc:
        bad(f"its args cannot be hashed: {exc}")
