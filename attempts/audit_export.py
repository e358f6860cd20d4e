"""Audit exports: the history of the attempts a person may see, as CSV or JSON Lines, streamed.

An export is pinned when it is planned to the newest event id (``upto``) and the newest
checkpoint, so the CSV, its manifest and a JSON Lines copy made from the same plan hold exactly
the same events however many are written meanwhile. Rows are read with one raw query in event-id
order through a streaming cursor (a server-side cursor on PostgreSQL) and written in chunks.

Each attempt has its own hash chain, so an export of some tenants' attempts holds whole chains
and nothing of anyone else's. JSON Lines: a header, the ``checkpoint`` lines from the oldest one
the export needs to the pinned one (hashes only, no tenant data), a ``seal`` line per exported
attempt that a checkpoint sealed (its sealed head and the Merkle proof that the checkpoint's root
covers it), one ``event`` line per exported event, and a ``manifest`` line last. CSV: the exported
events only, every text cell safe against spreadsheet formula injection, with a separate manifest
that also carries the file's SHA-256. ``attempts/verify_export.py`` checks both without a database.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from attempts import dbadapter, log
from attempts.models import (
    ArchivedAttempt,
    Attempt,
    AttemptEvent,
    Checkpoint,
    CheckpointLeaf,
    CheckpointSignature,
    ConfigEvent,
    LogEntry,
    Role,
    State,
    tenants_where,
)
from attempts.models.roles import admin_everywhere
from attempts.verify_export import (
    CONFIG_FIELDS,
    CSV_COLUMNS,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    FORMULA_STARTS,
    LOG_FORMAT,
    MerkleTree,
    chain_time,
    leaf_hash,
)

FETCH = 5000
# Heads whose inclusion proofs are read together (one query of the stored hashes per batch).
PROOF_BATCH = 500
QUOTE, QUOTES = '"', '""'
FLUSH_BYTES = 256 * 1024


class ExportError(ValueError):
    """The export cannot be made as asked (bad filter); the message says why."""


@dataclass(frozen=True)
class ExportFilters:
    """What to export. Attempt filters (tenant, state, tool) pick attempts; the date range picks
    their events by ``created_at`` (``since`` inclusive, ``until`` exclusive)."""

    tenant: str = ""
    state: str = ""
    tool: str = ""
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    @classmethod
    def parse(cls, data: dict[str, Any]) -> ExportFilters:
        """Build filters from text (a query string or command options); raises ExportError."""
        state = (data.get("state") or "").strip()
        if state and state not in State.values:
            raise ExportError(f"unknown state {state!r}; one of {', '.join(State.values)}")
        since = _parse_moment(data.get("since"), "since")
        until = _parse_moment(data.get("until"), "until")
        if since and until and since >= until:
            raise ExportError("'since' must be before 'until'")
        return cls(
            tenant=(data.get("tenant") or "").strip(),
            state=state,
            tool=(data.get("tool") or "").strip(),
            since=since,
            until=until,
        )

    def as_dict(self) -> dict[str, str | None]:
        return {
            "tenant": self.tenant or None,
            "state": self.state or None,
            "tool": self.tool or None,
            "since": chain_time(self.since) if self.since else None,
            "until": chain_time(self.until) if self.until else None,
        }

    def as_query(self) -> dict[str, str]:
        return {key: value for key, value in self.as_dict().items() if value}

    @property
    def filters_attempts(self) -> bool:
        return bool(self.tenant or self.state or self.tool)


def _parse_moment(value: Any, name: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, dt.datetime):
        moment = value
    else:
        text = str(value).strip()
        try:
            if len(text) == 10:
                moment = dt.datetime.combine(dt.date.fromisoformat(text), dt.time())
            else:
                moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ExportError(
                f"{name} must be a date (YYYY-MM-DD) or an ISO 8601 time, not {text!r}"
            ) from None
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=dt.UTC)
    try:
        # Stored times are UTC: a moment that has no UTC form (0001-01-01T00:00+01:00) is
        # refused here rather than overflowing in the query.
        return moment.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        raise ExportError(
            f"{name} is outside the years 1 to 9999 in UTC: {str(value).strip()!r}"
        ) from None


def export_tenants(user: Any) -> set[str] | None:
    """Tenants whose history ``user`` may export (reviewer or admin there); None means all
    (a superuser)."""
    if admin_everywhere(user):
        return None
    return set(tenants_where(user, Role.REVIEWER))


def scoped_attempts(user: Any | None, filters: ExportFilters) -> QuerySet[Attempt]:
    """The attempts an export covers: the person's tenants (``Attempt.objects.visible_to`` with
    the reviewer role: only tenants where they review or administer), narrowed by the filters. ``user`` None is the
    operator's command line: every tenant."""
    if user is None:
        attempts = Attempt.objects.all()
    else:
        attempts = Attempt.objects.visible_to(user, Role.REVIEWER)
    return attempts.where_given(
        tenant_id=filters.tenant, state=filters.state, tool_name=filters.tool
    )


@dataclass
class ExportPlan:
    """One export, pinned to the newest event id ``upto`` and the newest checkpoint."""

    filters: ExportFilters
    user_label: str
    scoped: bool  # whether tenants or filters can leave attempts out
    upto: int
    head_hash: str | None
    attempts: QuerySet[Attempt] = field(repr=False)
    checkpoint: tuple[int, str] | None = None  # (seq, hash)
    # The config chain up to its head when planned; the changes this person may read (None:
    # all of them); the live authority rows' digest then (attempts.config_history).
    config_upto: int = 0
    config_visible: QuerySet[ConfigEvent] | None = field(default=None, repr=False)
    authority_digest: str | None = None

    @property
    def complete_chains(self) -> bool:
        """Whether every exported attempt's chain is whole (no date range cuts it)."""
        return not (self.filters.since or self.filters.until)

    def events(self) -> QuerySet[AttemptEvent]:
        """The exported events (all filters applied), in id order."""
        events = AttemptEvent.objects.filter(id__lte=self.upto)
        if self.scoped:
            events = events.filter(attempt__in=self.attempts.values("pk"))
        if self.filters.since:
            events = events.filter(created_at__gte=self.filters.since)
        if self.filters.until:
            events = events.filter(created_at__lt=self.filters.until)
        return events.order_by("id")

    def count(self) -> int:
        return self.events().count()


def plan_export(*, user: Any | None, filters: ExportFilters, upto: int | None = None) -> ExportPlan:
    """Pin an export to the current ledger head (or to ``upto``, a head seen earlier)."""
    head = AttemptEvent.objects.order_by("-id").values_list("id", "hash").first()
    head_id, head_hash = head if head else (0, None)
    if upto is not None:
        if upto < 0 or upto > head_id:
            raise ExportError(f"upto {upto} is not an event of this ledger (head is {head_id})")
        head_id = upto
        head_hash = (
            AttemptEvent.objects.filter(id__lte=upto)
            .order_by("-id")
            .values_list("hash", flat=True)
            .first()
        )
    attempts = scoped_attempts(user, filters)
    scoped = filters.filters_attempts or (user is not None and export_tenants(user) is not None)
    label = "command line" if user is None else user.get_username()
    checkpoint = Checkpoint.objects.order_by("-seq").values_list("seq", "hash").first()
    config_upto, digest = _config_pin()
    visible = None if user is None else ConfigEvent.objects.visible_to(user)
    return ExportPlan(
        filters,
        label,
        scoped,
        head_id,
        head_hash,
        attempts,
        checkpoint,
        config_upto=config_upto,
        config_visible=visible,
        authority_digest=digest,
    )


def _config_pin() -> tuple[int, str]:
    """The config chain's length and the live authority digest, read as one moment (read again
    if a change landed in between)."""
    from attempts.chain import config_head_now
    from attempts.config_history import authority_digest

    for _ in range(3):
        length = config_head_now()[0]
        digest = authority_digest()
        if config_head_now()[0] == length:
            break
    return length, digest


def _config_lines(plan: ExportPlan) -> list[dict[str, Any]]:
    """The config chain up to the pinned length: the whole chain for an export of everything,
    else only the changes the person may read (``ConfigEvent.objects.visible_to``: no hash of
    anyone else's change either), each with its hash."""
    rows = ConfigEvent.objects.filter(seq__lte=plan.config_upto)
    if plan.config_visible is not None:
        rows = rows.filter(pk__in=plan.config_visible.values("pk"))
    return [
        {
            "type": "config",
            **{name: row[name] for name in CONFIG_FIELDS},
            "created_at": chain_time(row["created_at"]),
            "prev_hash": row["prev_hash"],
            "hash": row["hash"],
        }
        for row in rows.order_by("seq").values()
    ]


def _vendor_sql() -> dict[str, str]:
    """The few SQL spellings that differ between SQLite and PostgreSQL."""
    if connection.vendor == "postgresql":
        return {
            "time": "to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            "csv_time": "to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
            "details": "e.details::text",
            "details_json": "e.details",
            "object": "json_build_object",
            "text": "::text",
            "instr": "strpos",
        }
    # Django stores SQLite datetimes as naive UTC text, without the fraction when it is zero.
    return {
        "time": "(CASE WHEN length(e.created_at) = 19 "
        "THEN replace(e.created_at, ' ', 'T') || '.000000Z' "
        "ELSE replace(e.created_at, ' ', 'T') || 'Z' END)",
        "csv_time": "e.created_at",
        "details": "e.details",
        "details_json": "json(e.details)",
        "object": "json_object",
        "text": "",
        "instr": "instr",
    }


def _sql_text(value: str) -> str:
    """A SQL string literal (only for the constant characters below)."""
    return "'" + value.replace("'", "''") + "'"


def _csv_cell(expression: str) -> tuple[str, list[str]]:
    """A quoted CSV cell built by the database: a format pattern and its arguments, with a
    leading quote when the text starts like a spreadsheet formula (verify_export.FORMULA_STARTS;
    the verifier's unescape_cell takes it off) and inner double quotes doubled."""
    starts = ", ".join(_sql_text(c) for c in FORMULA_STARTS)
    return '"%%s%%s"', [
        f"(CASE WHEN substr({expression}, 1, 1) IN ({starts}) THEN {_sql_text(chr(39))} "
        "ELSE '' END)",
        # replace() copies every string; most have no quote to double, so look first.
        f"(CASE WHEN {_vendor_sql()['instr']}({expression}, {_sql_text(chr(34))}) > 0 "
        f"THEN replace({expression}, {_sql_text(chr(34))}, {_sql_text(chr(34) * 2)}) "
        f"ELSE {expression} END)",
    ]


def _csv_cells(
    free: Callable[[str], tuple[str, list[str]]], details: tuple[str, list[str]]
) -> dict[str, tuple[str, list[str]]]:
    """The CSV columns in order, each a format pattern and its SQL arguments. Ids, codes, actions
    and states are written by ledgerweb itself (never a comma, a quote or a line break, and never
    by agents or people): plain. Every free-text cell goes through ``free``; ``details`` is given
    by the caller (the two line builders treat it differently)."""
    v = _vendor_sql()
    plain = "%%s"
    cells: dict[str, tuple[str, list[str]]] = {
        "event_id": (plain, ["e.id"]),
        "attempt_id": (plain, ["a.attempt_id"]),
        "action": (plain, ["e.action"]),
        "actor_kind": (plain, ["e.actor_kind"]),
        "actor": free("e.actor"),
        "from_state": (plain, ["e.from_state"]),
        "to_state": (plain, ["e.to_state"]),
        "reason": free("e.reason"),
        "details": details,
        # UTC as "YYYY-MM-DD HH:MM:SS.ffffff", which spreadsheets read as a time (SQLite's own
        # text; the verifier reads it back into the chain's form).
        "created_at": (plain, [v["csv_time"]]),
        "v": (plain, ["e.chain_format"]),
        "prev_hash": (plain, ["e.prev_hash"]),
        "hash": (plain, ["e.hash"]),
        "tenant": free("a.tenant_id"),
        "tool_name": free("a.tool_name"),
        "idempotency_key": free("a.idempotency_key"),
        "attempt_state": (plain, ["a.state"]),
        "provider_request_id": free("a.provider_request_id"),
        "text_digest": (plain, ["e.text_digest"]),
    }
    if tuple(cells) != CSV_COLUMNS:
        raise AssertionError("CSV columns out of step with verify_export.CSV_COLUMNS")
    return cells


def _csv_line_sql() -> str:
    """Each CSV line as three columns: the cells before ``details``, ``details`` itself (with
    the formula tick when needed, quotes not yet doubled), and the cells after it.

    The cells are built in one pass with format() (printf in SQLite): chained ``||`` would copy
    the growing line once per cell. ``details`` is JSON and always full of double quotes; doubling
    them is far cheaper in Python (``str.replace``) than in SQL (``replace()``), see stream_csv.
    """
    v = _vendor_sql()
    cells = _csv_cells(_csv_cell, ("", []))
    names = list(cells)
    split = names.index("details")

    def joined(part: list[str]) -> str:
        pattern = ",".join(cells[name][0] for name in part)
        arguments = ", ".join(arg for name in part for arg in cells[name][1])
        return f"format('{pattern}', {arguments})"

    starts = ", ".join(_sql_text(c) for c in FORMULA_STARTS)
    details = v["details"]
    details_sql = (
        f"(CASE WHEN substr({details}, 1, 1) IN ({starts}) "
        f"THEN {_sql_text(chr(39))} || {details} ELSE {details} END)"
    )
    return f"{joined(names[:split])}, {details_sql}, {joined(names[split + 1 :])}"


# Stands for a CSV quote inside the fast path's lines (see _csv_fast_sql and stream_csv).
MARK = "\x01"
MARK_BYTE = MARK.encode()
_MARK_TO_QUOTE = bytes.maketrans(MARK_BYTE, b'"')


def _csv_fast_sql() -> tuple[str, int]:
    """Each CSV line as one column, every quoted cell wrapped in MARK instead of a double quote
    and nothing doubled yet; returns the SQL and the number of MARKs in a line.

    Python then fixes a whole chunk at C speed: double every quote (at this point every quote is
    inside a cell), then turn each MARK into a quote. A chunk whose data itself contains MARK
    (the count shows it) is redone through the exact path instead.
    """
    v = _vendor_sql()
    starts = ", ".join(_sql_text(c) for c in FORMULA_STARTS)

    def free(expression: str) -> tuple[str, list[str]]:
        tick = (
            f"(CASE WHEN substr({expression}, 1, 1) IN ({starts}) THEN {_sql_text(chr(39))} "
            "ELSE '' END)"
        )
        return f"{MARK}%%s%%s{MARK}", [tick, expression]

    cells = _csv_cells(free, free(v["details"]))
    pattern = ",".join(p for p, _ in cells.values())
    arguments = ", ".join(arg for _, args in cells.values() for arg in args)
    return f"format('{pattern}', {arguments})", pattern.count(MARK)


def _json_event_sql() -> str:
    v = _vendor_sql()
    pairs = [
        ("type", "'event'"),
        ("id", "e.id"),
        ("attempt_id", "a.attempt_id"),
        ("action", "e.action"),
        ("actor_kind", "e.actor_kind"),
        ("actor", "e.actor"),
        ("from_state", "e.from_state"),
        ("to_state", "e.to_state"),
        ("reason", "e.reason"),
        ("details", v["details_json"]),
        ("created_at", v["time"]),
        ("v", "e.chain_format"),
        ("prev_hash", "e.prev_hash"),
        ("hash", "e.hash"),
        ("tenant", "a.tenant_id"),
        ("tool_name", "a.tool_name"),
        ("idempotency_key", "a.idempotency_key"),
        ("attempt_state", "a.state"),
        ("provider_request_id", "a.provider_request_id"),
        # Format 3: the salted digest the hash covers instead of the free text, and the salt,
        # so the verifier checks the text too (an erased attempt's salt commits to nothing left).
        ("text_digest", "e.text_digest"),
        ("salt", "a.args_salt"),
    ]
    inner = ", ".join(f"'{key}', {value}" for key, value in pairs)
    return f"{v['object']}({inner}){v['text']}"


def _where(plan: ExportPlan) -> tuple[str, list[Any]]:
    """The plan's filters as SQL over ``e`` (events), scoped through the ORM's own query for the
    person's attempts (``Attempt.objects.visible_to`` and the filters)."""
    clauses = ["e.id <= %s"]
    params: list[Any] = [plan.upto]
    if plan.scoped:
        try:
            sub_sql, sub_params = dbadapter.sql_with_params(plan.attempts.values("pk"))
        except EmptyResultSet:  # no tenants to export: nothing matches
            clauses.append("1 = 0")
        else:
            clauses.append(f"e.attempt_id IN ({sub_sql})")
            params.extend(sub_params)
    if plan.filters.since:
        clauses.append("e.created_at >= %s")
        params.append(dbadapter.datetime_param(connection, plan.filters.since))
    if plan.filters.until:
        clauses.append("e.created_at < %s")
        params.append(dbadapter.datetime_param(connection, plan.filters.until))
    return "(" + " AND ".join(clauses) + ")", params


_FROM = "FROM attempts_attemptevent e JOIN attempts_attempt a ON a.id = e.attempt_id"


def _stream_rows(sql: str, params: list[Any]) -> Iterator[list[tuple]]:
    """Rows in chunks, through a streaming cursor (server-side on PostgreSQL)."""
    with dbadapter.streaming_cursor(connection) as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(FETCH):
            yield rows


def _exact_rows(sql: str, params: list[Any]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _event_ref(event_id: int | None) -> dict[str, Any] | None:
    if event_id is None:
        return None
    row = (
        AttemptEvent.objects.filter(id=event_id)
        .values_list("id", "attempt__attempt_id", "created_at", "prev_hash", "hash")
        .get()
    )
    return {
        "id": row[0],
        "attempt_id": row[1],
        "created_at": chain_time(row[2]),
        "prev_hash": row[3],
        "hash": row[4],
    }


def _manifest(
    plan: ExportPlan,
    *,
    export_format: str,
    rows: int,
    first: int | None,
    last: int | None,
    seals: int = 0,
    checkpoints: int = 0,
    config: list[dict[str, Any]] | None = None,
    archived: int | None = None,
) -> dict[str, Any]:
    last_ref = _event_ref(last)
    extra: dict[str, Any] = {} if archived is None else {"archived_count": archived}
    if config is not None:
        complete = plan.config_visible is None or len(config) == plan.config_upto
        extra = {
            "config_count": len(config),
            "config_complete": complete,
            "config_head": {"seq": config[-1]["seq"], "hash": config[-1]["hash"]}
            if config and complete
            else None,
            "authority_digest": plan.authority_digest if complete else None,
            **extra,
        }
    return {
        "type": "manifest",
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "export": export_format,
        "filters": plan.filters.as_dict(),
        "exported_by": plan.user_label,
        "row_count": rows,
        "seal_count": seals,
        "checkpoint_count": checkpoints,
        "first_event": _event_ref(first),
        "last_event": last_ref,
        "complete_chains": plan.complete_chains,
        "ledger_head": {"id": plan.upto, "hash": plan.head_hash},
        "checkpoint": _checkpoint_ref(plan),
        **extra,
    }


def _checkpoint_ref(plan: ExportPlan) -> dict[str, Any] | None:
    return {"seq": plan.checkpoint[0], "hash": plan.checkpoint[1]} if plan.checkpoint else None


@dataclass
class _Seals:
    """The export's ``seal`` records: an iterator (memory stays flat whatever the size of the
    ledger), the oldest checkpoint they need (known before the first is read) and, once they
    have been read, how many there were."""

    pinned: Checkpoint | None
    leaves: QuerySet[CheckpointLeaf] | None
    legacy: dict[int, set[int]]  # checkpoint pk -> positions proved from that checkpoint's tree
    oldest: int | None
    count: int = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.pinned is None or self.leaves is None:
            return
        for record in self._logged():
            self.count += 1
            yield record
        for record in self._from_trees():
            self.count += 1
            yield record

    def _logged(self) -> Iterator[dict[str, Any]]:
        """Every logged newest head, proved into the pinned checkpoint (the receipt an agent
        gets from the API), in attempt id order, PROOF_BATCH heads per read of the hashes."""
        pinned = self.pinned
        if pinned is None or self.leaves is None or pinned.format < LOG_FORMAT:
            return
        batch: list[tuple[str, int, str, int]] = []
        for attempt_id, length, head, _, _, index in _newest(self.leaves):
            if index is None or index >= pinned.size:
                continue  # a head sealed before the log, not yet in it: proved from its tree
            batch.append((attempt_id, length, head, index))
            if len(batch) == PROOF_BATCH:
                yield from _log_seals(batch, pinned)
                batch = []
        yield from _log_seals(batch, pinned)

    def _from_trees(self) -> Iterator[dict[str, Any]]:
        for checkpoint_pk in sorted(self.legacy):
            checkpoint = Checkpoint.objects.get(pk=checkpoint_pk)
            rows = list(
                CheckpointLeaf.objects.filter(checkpoint_id=checkpoint_pk)
                .order_by("position")
                .values_list("attempt_id", "length", "head")
            )
            tree = MerkleTree([leaf_hash(*row) for row in rows])
            for position in sorted(self.legacy[checkpoint_pk]):
                attempt_id, length, head = rows[position]
                yield {
                    "type": "seal",
                    "attempt_id": attempt_id,
                    "length": length,
                    "head": head,
                    "checkpoint": checkpoint.seq,
                    "index": position,
                    "size": len(rows),
                    "proof": tree.proof(position),
                }


def _newest(leaves: QuerySet[CheckpointLeaf]) -> Iterator[tuple]:
    """Each attempt's newest leaf among ``leaves`` (attempt id, length, head, checkpoint pk,
    position, log index or None), in attempt id order, streamed."""
    rows = (
        leaves.order_by("attempt_id", "checkpoint_id")
        .values_list(
            "attempt_id", "length", "head", "checkpoint_id", "position", "log_entry__index"
        )
        .iterator(chunk_size=FETCH)
    )
    last = None
    for row in rows:
        if last is not None and row[0] != last[0]:
            yield last
        last = row
    if last is not None:
        yield last


def _log_seals(batch: list[tuple[str, int, str, int]], pinned: Checkpoint) -> list[dict[str, Any]]:
    if not batch:
        return []
    proofs = log.inclusion_proofs([index for *_, index in batch], pinned.size)
    return [
        {
            "type": "seal",
            "attempt_id": attempt_id,
            "length": length,
            "head": head,
            "checkpoint": pinned.seq,
            "index": index,
            "size": pinned.size,
            "proof": [h.hex() for h in proofs[index]],
        }
        for attempt_id, length, head, index in batch
    ]


def _seals(plan: ExportPlan) -> _Seals:
    """A ``seal`` record for every exported attempt that a checkpoint (up to the pinned one)
    sealed: its newest sealed head and the Merkle proof into a checkpoint's root. Heads in the
    transparency log are proved into the pinned checkpoint; heads sealed before the log existed
    and not yet in it (format-1 checkpoints) into their own checkpoint's tree. Those few are
    found first, so the oldest checkpoint the file needs is known before any seal is read."""
    if plan.checkpoint is None:
        return _Seals(None, None, {}, None)
    pinned = Checkpoint.objects.get(seq=plan.checkpoint[0])
    leaves = CheckpointLeaf.objects.filter(checkpoint__seq__lte=pinned.seq)
    if plan.scoped:
        leaves = leaves.filter(attempt_id__in=plan.attempts.values("attempt_id"))
    newer = CheckpointLeaf.objects.filter(
        attempt_id=OuterRef("attempt_id"),
        checkpoint_id__gt=OuterRef("checkpoint_id"),
        checkpoint__seq__lte=pinned.seq,
    )
    from_trees = leaves.exclude(Exists(newer))
    if pinned.format >= LOG_FORMAT:
        before_log = Checkpoint.objects.filter(seq__lte=pinned.seq, format__lt=LOG_FORMAT)
        from_trees = from_trees.filter(
            checkpoint_id__in=list(before_log.values_list("pk", flat=True))
        ).exclude(log_entry__index__lt=pinned.size)
    legacy: dict[int, set[int]] = {}
    for checkpoint_pk, position in from_trees.values_list("checkpoint_id", "position").order_by():
        legacy.setdefault(checkpoint_pk, set()).add(position)
    seqs = Checkpoint.objects.filter(pk__in=list(legacy)).values_list("seq", flat=True)
    oldest = min([*seqs, *([pinned.seq] if pinned.format >= LOG_FORMAT else [])], default=None)
    return _Seals(pinned, leaves, legacy, oldest)


def _checkpoint_lines(plan: ExportPlan, oldest: int | None) -> list[dict[str, Any]]:
    """The checkpoints from ``oldest`` to the pinned one, each with what its hash covers."""
    if plan.checkpoint is None:
        return []
    start = oldest if oldest is not None else plan.checkpoint[0]
    # From the newest checkpoint witnesses cosigned, too: the verifier checks the witness
    # quorum on it (the newest ones wait a moment for their cosignatures).
    witnessed = (
        Checkpoint.objects.filter(seq__lte=plan.checkpoint[0], signatures__kind="witness")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if witnessed is not None:
        start = min(start, witnessed)
    return [
        {
            "type": "checkpoint",
            "seq": row["seq"],
            "prev_hash": row["prev_hash"],
            "root": row["root"],
            "size": row["size"],
            "config_length": row["config_length"],
            "config_head": row["config_head"],
            "sealed_at": chain_time(row["sealed_at"]),
            "hash": row["hash"],
            **(
                {
                    "format": row["format"],
                    "authority": row["authority"],
                    "note": row["note"],
                    "signatures": _signature_lines(row["id"]),
                }
                if row["format"] >= LOG_FORMAT
                else {}
            ),
        }
        for row in Checkpoint.objects.filter(seq__gte=start, seq__lte=plan.checkpoint[0])
        .order_by("seq")
        .values()
    ]


def _signature_lines(checkpoint_pk: int) -> list[str]:
    """The checkpoint note's signature lines: the log's first, then witnesses' cosignatures."""
    return list(
        CheckpointSignature.objects.filter(checkpoint_id=checkpoint_pk)
        .order_by("kind", "id")
        .values_list("line", flat=True)
    )


def _log_leaf_lines(plan: ExportPlan) -> Iterator[dict[str, Any]]:
    """A whole-ledger export carries every leaf of the log up to the pinned checkpoint, so a
    verifier rebuilds the tree and checks any checkpoint kept elsewhere against it. A filtered
    export does not (the leaves name every tenant's attempts); its seals are receipts."""
    if plan.scoped or plan.checkpoint is None:
        return
    pinned = Checkpoint.objects.get(seq=plan.checkpoint[0])
    if pinned.format < LOG_FORMAT:
        return
    rows = (
        LogEntry.objects.filter(index__lt=pinned.size)
        .order_by("index")
        .values_list("index", "leaf__attempt_id", "leaf__length", "leaf__head")
    )
    for index, attempt_id, length, head in rows.iterator(chunk_size=FETCH):
        yield {
            "type": "log_leaf",
            "index": index,
            "attempt_id": attempt_id,
            "length": length,
            "head": head,
        }


def _archived_lines(plan: ExportPlan) -> Iterator[dict[str, Any]]:
    """An export of every attempt carries the seal of every attempt a checkpoint sealed, the
    archived ones too (``ledgerweb archive run`` removed them from the database); one
    ``archived`` line each says which archive holds it and the chain head it was archived at,
    so the verifier tells an archived attempt from one deleted with its history."""
    if plan.scoped or plan.checkpoint is None:
        return
    rows = (
        ArchivedAttempt.objects.order_by("attempt_id")
        .values_list("attempt_id", "archive__name", "chain_length", "chain_head")
        .iterator(chunk_size=FETCH)
    )
    for attempt_id, archive, length, head in rows:
        yield {
            "type": "archived",
            "attempt_id": attempt_id,
            "archive": archive,
            "length": length,
            "head": head,
        }


@dataclass
class CsvResult:
    manifest: dict[str, Any] | None = None


def stream_csv(plan: ExportPlan, result: CsvResult | None = None) -> Iterator[bytes]:
    """The CSV export in chunks. When ``result`` is given, its manifest (with the SHA-256 of
    exactly these bytes) is filled in once the last chunk has been produced.

    The database formats each row as one line (formula escaping included) and Python fixes the
    quoting of a whole chunk with two string replacements, so there is no per-row Python work
    beyond joining lines: throughput stays close to the database's own.
    """
    where, params = _where(plan)
    line_sql, marks = _csv_fast_sql()
    sql = f"SELECT {line_sql} {_FROM} WHERE {where} ORDER BY e.id"  # noqa: S608
    exact = (
        f"SELECT e.id, {_csv_line_sql()} {_FROM} "  # noqa: S608
        f"WHERE {where} AND e.id >= %s AND e.id <= %s ORDER BY e.id"
    )
    digest = hashlib.sha256()
    header = (",".join(CSV_COLUMNS) + "\r\n").encode("utf-8")
    digest.update(header)
    yield header
    rows = 0
    first = last = None
    parts: list[bytes] = []
    size = 0
    for chunk in _stream_rows(sql, params):
        lines = [row[0] for row in chunk]
        low = int(lines[0][: lines[0].index(",")])
        high = int(lines[-1][: lines[-1].index(",")])
        if first is None:
            first = low
        last = high
        rows += len(lines)
        data = ("\r\n".join(lines) + "\r\n").encode("utf-8")
        if data.count(MARK_BYTE) == marks * len(lines):
            data = data.replace(b'"', b'""').translate(_MARK_TO_QUOTE)
        else:  # the data holds MARK itself: build these lines the exact (slower) way
            data = "".join(
                f'{head},"{details.replace(QUOTE, QUOTES)}",{tail}\r\n'
                for _, head, details, tail in _exact_rows(exact, [*params, low, high])
            ).encode("utf-8")
        parts.append(data)
        size += len(data)
        if size >= FLUSH_BYTES:
            data = b"".join(parts)
            parts, size = [], 0
            digest.update(data)
            yield data
    if parts:
        data = b"".join(parts)
        digest.update(data)
        yield data
    if result is not None:
        result.manifest = _manifest(plan, export_format="csv", rows=rows, first=first, last=last)
        result.manifest["sha256"] = digest.hexdigest()


def csv_manifest(plan: ExportPlan) -> dict[str, Any]:
    """The manifest of the CSV export of ``plan``, by producing it once (memory stays flat)."""
    result = CsvResult()
    for _ in stream_csv(plan, result):
        pass
    if result.manifest is None:
        raise AssertionError("stream_csv ended without a manifest")
    return result.manifest


def stream_jsonl(plan: ExportPlan) -> Iterator[bytes]:
    """The JSON Lines export in chunks: header, checkpoints, seals, events, manifest last. The
    database builds each event line."""
    header = {
        "type": "header",
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "filters": plan.filters.as_dict(),
        "exported_by": plan.user_label,
        "generated_at": chain_time(timezone.now()),
        "ledger_head": {"id": plan.upto, "hash": plan.head_hash},
        "checkpoint": _checkpoint_ref(plan),
        "complete_chains": plan.complete_chains,
        "hashed_fields": "v, attempt_id, action, actor_kind, actor, from_state, to_state, "
        "reason, details, created_at, prev_hash (RFC 8785, SHA-256); prev_hash is the hash of "
        "the attempt's event before (format 2) or of the ledger's event before (format 1); format 3 "
        "covers text_digest (HMAC-SHA256 with the attempt's salt of reason and private details) "
        "and only the public details, instead of reason and details",
    }
    seals = _seals(plan)
    checkpoints = _checkpoint_lines(plan, seals.oldest)
    config = _config_lines(plan)
    yield _json_lines([header, *checkpoints])
    batch: list[dict[str, Any]] = []
    for seal in seals:
        batch.append(seal)
        if len(batch) >= PROOF_BATCH:
            yield _json_lines(batch)
            batch = []
    yield _json_lines([*batch, *config])
    batch: list[str] = []
    for line in _log_leaf_lines(plan):
        batch.append(json.dumps(line) + "\n")
        if len(batch) >= FETCH:
            yield "".join(batch).encode("utf-8")
            batch = []
    if batch:
        yield "".join(batch).encode("utf-8")
    archived = 0
    records: list[dict[str, Any]] = []
    for record in _archived_lines(plan):
        records.append(record)
        archived += 1
        if len(records) >= FETCH:
            yield _json_lines(records)
            records = []
    if records:
        yield _json_lines(records)
    where, params = _where(plan)
    sql = f"SELECT e.id, {_json_event_sql()} {_FROM} WHERE {where} ORDER BY e.id"  # noqa: S608
    rows = 0
    first = last = None
    parts: list[str] = []
    size = 0
    for chunk in _stream_rows(sql, params):
        if first is None:
            first = chunk[0][0]
        last = chunk[-1][0]
        rows += len(chunk)
        text = "\n".join([row[1] for row in chunk]) + "\n"
        parts.append(text)
        size += len(text)
        if size >= FLUSH_BYTES:
            yield "".join(parts).encode("utf-8")
            parts, size = [], 0
    manifest = _manifest(
        plan,
        export_format="jsonl",
        rows=rows,
        first=first,
        last=last,
        seals=seals.count,
        checkpoints=len(checkpoints),
        config=config,
        archived=None if plan.scoped or plan.checkpoint is None else archived,
    )
    parts.append(json.dumps(manifest, ensure_ascii=False) + "\n")
    yield "".join(parts).encode("utf-8")


def _json_lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def file_name(plan: ExportPlan, extension: str) -> str:
    bits = ["audit"]
    for value in (plan.filters.tenant, plan.filters.tool, plan.filters.state):
        if value:
            bits.append("".join(c if c.isalnum() or c in "-_" else "_" for c in value)[:40])
    bits.append(f"upto{plan.upto}")
    return "-".join(bits) + "." + extension
