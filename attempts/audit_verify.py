"""Verify the audit chain of a whole ledger database, and each attempt row against its history.

Works on any DB-API connection that holds ledgerweb's tables (the live Django connection, or a
plain ``sqlite3`` connection to a backup copy), reading with raw SQL in event-id order so memory
stays flat however long the history is. The chain itself is walked by
``attempts.verify_export.ChainChecker``, the same code an auditor runs on an export.

Checks, each naming the first event (or attempt) where it fails:

1. every event's stored hash equals the hash recomputed from its row (edits show here);
2. every event's ``prev_hash`` is the hash of the event before it by id, starting from GENESIS
   (deletions, insertions, reordering, and deleting a whole attempt with its history show here);
3. every event belongs to an existing attempt;
4. every attempt row agrees with its history: it has a creation event; its tenant, task, tool,
   key, args hash, policy version, scope and parent equal what the creation event recorded; its
   args still hash to ``args_hash``; its state is the last event's ``to_state``; its provider
   request id and result reference are the last ones its history recorded;
5. optionally, head hashes kept elsewhere (``anchors``) are still in the chain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import rfc8785

from attempts.verify_export import GENESIS, ChainChecker, Problem, Report, anchor_check

EVENTS = "attempts_attemptevent"
ATTEMPTS = "attempts_attempt"

EVENT_SQL = f"""
SELECT e.id, a.attempt_id, e.action, e.actor_kind, e.actor, e.from_state, e.to_state, e.reason,
       e.details, e.created_at, e.prev_hash, e.hash
FROM {EVENTS} e LEFT JOIN {ATTEMPTS} a ON a.id = e.attempt_id
ORDER BY e.id
"""  # noqa: S608 -- constant table names only
EVENT_COLUMNS = (
    "id",
    "attempt_id",
    "action",
    "actor_kind",
    "actor",
    "from_state",
    "to_state",
    "reason",
    "details",
    "created_at",
    "prev_hash",
    "hash",
)

ATTEMPT_SQL = f"""
SELECT a.id, a.attempt_id, a.state, a.tenant_id, a.task_id, a.tool_name, a.idempotency_key,
       a.args, a.args_hash, a.policy_version, a.credential_scope, p.attempt_id,
       a.provider_request_id, a.result_ref, e.id, e.action, e.to_state, e.details
FROM {ATTEMPTS} a
LEFT JOIN {ATTEMPTS} p ON p.id = a.parent_id
LEFT JOIN {EVENTS} e ON e.attempt_id = a.id
ORDER BY a.id, e.id
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


def load_json(value: Any) -> Any:
    """A JSON column as Python: SQLite gives text, psycopg may give text or parsed values."""
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8")
    if isinstance(value, str):
        return json.loads(value)
    return value


def _rows(cursor: Any, sql: str) -> Iterator[tuple]:
    cursor.execute(sql)
    while True:
        chunk = cursor.fetchmany(CHUNK)
        if not chunk:
            return
        yield from chunk


def verify_database(
    cursor_factory: Callable[[], Any],
    *,
    anchors: Iterable[str] = (),
    max_problems: int = 50,
    what: str = "database",
) -> Report:
    """Verify the chain and every attempt row. ``cursor_factory`` returns a fresh DB-API cursor
    (``django.db.connection.chunked_cursor`` streams on PostgreSQL)."""
    checker = ChainChecker(
        start_prev=GENESIS, max_problems=max_problems, anchors=frozenset(anchors)
    )
    report = Report(what=what, problems=checker.problems)
    cursor = cursor_factory()
    try:
        for values in _rows(cursor, EVENT_SQL):
            row = dict(zip(EVENT_COLUMNS, values, strict=True))
            try:
                row["details"] = load_json(row["details"])
            except ValueError as exc:
                checker.problem(
                    Problem("content", f"details are not JSON: {exc}", row["id"], row["attempt_id"])
                )
                row["details"] = None
            checker.full(row)
    finally:
        cursor.close()
    report.events = checker.count
    report.head_hash, report.head_id = checker.last_hash, checker.last_id

    cursor = cursor_factory()
    attempts = 0
    try:
        group: list[tuple] = []
        for values in _rows(cursor, ATTEMPT_SQL):
            if group and values[0] != group[0][0]:
                _check_attempt(checker, group)
                attempts += 1
                group = []
            group.append(values)
        if group:
            _check_attempt(checker, group)
            attempts += 1
    finally:
        cursor.close()
    report.notes.append(f"{attempts} attempts checked against their history")

    anchor_check(checker)
    report.truncated = checker.truncated
    return report


def args_digest(args: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(args)).hexdigest()


def _check_attempt(checker: ChainChecker, group: list[tuple]) -> None:
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
        first_event_id,
        first_action,
        _,
        first_details,
    ) = group[0]

    def bad(kind: str, message: str, event_id: int | None = None) -> None:
        checker.problem(Problem(kind, message, event_id, attempt_id))

    if first_event_id is None:
        bad(
            "attempt",
            "the attempt has no history: it was inserted without one or its history was deleted",
        )
        return
    if first_action != "attempt.created":
        bad(
            "attempt",
            f"its first event is {first_action!r}, not 'attempt.created': its creation event "
            "was deleted",
            first_event_id,
        )
    else:
        try:
            created = load_json(first_details) or {}
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
            bad("attempt", f"unreadable JSON in the attempt or its creation event: {exc}")
            return
        for name in KEY_FIELDS:
            if created.get(name) != actual[name]:
                bad(
                    "attempt",
                    f"{name} is {actual[name]!r} but its creation event recorded "
                    f"{created.get(name)!r}: the attempt row was edited",
                    first_event_id,
                )
    try:
        if args_digest(load_json(args)) != args_hash:
            bad("attempt", "its args no longer hash to its args_hash: the args were edited")
    except (ValueError, TypeError, rfc8785.CanonicalizationError) as exc:
        bad("attempt", f"its args cannot be hashed: {exc}")

    last_event_id, last_to_state = group[-1][14], group[-1][16]
    if state != last_to_state:
        bad(
            "attempt",
            f"its state is {state} but its last event (id {last_event_id}) moved it to "
            f"{last_to_state}: the state was edited or its latest events were deleted",
            last_event_id,
        )
    recorded = {"provider_request_id": "", "result_ref": ""}
    for values in group:
        if values[17] is None:
            continue
        try:
            details = load_json(values[17])
        except ValueError:
            continue  # the chain walk already named this event
        if isinstance(details, dict):
            for name in TRACKED_FIELDS:
                if name in details and isinstance(details[name], str):
                    recorded[name] = details[name]
    for name, value in (("provider_request_id", provider_request_id), ("result_ref", result_ref)):
        if (value or "") != recorded[name]:
            bad(
                "attempt",
                f"its {name} is {value!r} but its history last recorded {recorded[name]!r}: "
                "the attempt row was edited",
                last_event_id,
            )


def verify_django_database(
    *, anchors: Iterable[str] = (), max_problems: int = 50, using: str = "default"
) -> Report:
    """Verify the database Django is configured with."""
    from django.db import connections

    connection = connections[using]
    name = connection.settings_dict.get("NAME")
    return verify_database(
        connection.chunked_cursor,
        anchors=anchors,
        max_problems=max_problems,
        what=f"{connection.vendor} database {name}",
    )


def verify_sqlite_file(path: str, *, anchors: Iterable[str] = (), max_problems: int = 50) -> Report:
    """Verify a SQLite ledger file (a backup or a restored copy), opened read-only."""
    import sqlite3
    from pathlib import Path

    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        return verify_database(
            conn.cursor, anchors=anchors, max_problems=max_problems, what=f"SQLite file {path}"
        )
    finally:
        conn.close()
