"""Audit exports: the history of the attempts a person may see, as CSV or JSON Lines, streamed.

An export is pinned to the ledger head at the moment it was planned (``upto``: the newest event
id), so the CSV, its manifest and a JSON Lines copy made from the same plan hold exactly the same
events however many are written meanwhile. Rows are read with one raw query in event-id order
through a streaming cursor (a server-side cursor on PostgreSQL) and written in chunks, so memory
stays flat however large the export.

JSON Lines: a header line, one ``event`` line per exported event, a ``link`` line (id, prev_hash,
hash only, no content) for each event in between that the filter or the person's tenants leave
out, so the file is one unbroken stretch of the chain, and a ``manifest`` line last (filters, row
count, first and last event, head hash). CSV: the exported events only, every text cell safe
against spreadsheet formula injection, with a separate manifest that also carries the file's
SHA-256. ``attempts/verify_export.py`` checks both without a database.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from django.db import connection
from django.db.models import Case, F, Max, Min, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Concat, Substr
from django.db.models.lookups import In
from django.utils import timezone

from attempts.models import Attempt, AttemptEvent, Membership, Role, State
from attempts.verify_export import (
    CSV_COLUMNS,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    FORMULA_STARTS,
    chain_time,
    escape_cell,
)

FETCH = 2000
FLUSH_BYTES = 256 * 1024
EXPORT_ROLES = (Role.REVIEWER, Role.ADMIN)

# Columns read for each event, in CSV order after the id (see verify_export.CSV_COLUMNS).
_EVENT_FIELDS = (
    "id",
    "attempt__attempt_id",
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
    "attempt__tenant_id",
    "attempt__tool_name",
    "attempt__idempotency_key",
    "attempt__state",
    "attempt__provider_request_id",
)
# Free-text columns that could start with a formula character (the rest are ids, hex or codes).
_CSV_ESCAPED = frozenset(
    {
        "action",
        "actor",
        "from_state",
        "to_state",
        "reason",
        "attempt__tenant_id",
        "attempt__tool_name",
        "attempt__idempotency_key",
        "attempt__provider_request_id",
    }
)


_FORMULA_SET = frozenset(FORMULA_STARTS)


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
    return moment


def export_tenants(user: Any) -> set[str] | None:
    """Tenants whose history ``user`` may export (reviewer or admin there); None means all
    (a superuser)."""
    if user.is_superuser:
        return None
    return set(
        Membership.objects.filter(user=user, role__in=EXPORT_ROLES).values_list(
            "tenant_id", flat=True
        )
    )


def scoped_attempts(user: Any | None, filters: ExportFilters) -> QuerySet[Attempt]:
    """The attempts an export covers: the person's tenants (``Attempt.objects.for_user``, then
    only those where they review or administer), narrowed by the filters. ``user`` None is the
    operator's command line: every tenant."""
    if user is None:
        attempts = Attempt.objects.all()
    else:
        attempts = Attempt.objects.for_user(user)
        allowed = export_tenants(user)
        if allowed is not None:
            attempts = attempts.filter(tenant_id__in=allowed)
    if filters.tenant:
        attempts = attempts.filter(tenant_id=filters.tenant)
    if filters.state:
        attempts = attempts.filter(state=filters.state)
    if filters.tool:
        attempts = attempts.filter(tool_name=filters.tool)
    return attempts


@dataclass
class ExportPlan:
    """One export, pinned to the ledger head at ``upto``."""

    filters: ExportFilters
    user_label: str
    scoped: bool  # whether tenants or filters can leave events out
    upto: int
    head_hash: str | None
    attempts: QuerySet[Attempt] = field(repr=False)

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
    return ExportPlan(filters, label, scoped, head_id, head_hash, attempts)


def _raw(queryset: QuerySet) -> Iterator[tuple]:
    """Stream a queryset's rows as the database returns them (no per-row ORM conversion)."""
    sql, params = queryset.query.sql_with_params()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(FETCH):
            yield from rows


def _escaped(name: str) -> Any:
    """A column with a leading quote added in SQL when it starts like a spreadsheet formula."""
    column = F(name)
    return Case(
        When(
            In(Substr(column, 1, 1), list(FORMULA_STARTS)),
            then=Concat(Value("'"), column, output_field=TextField()),
        ),
        default=column,
        output_field=TextField(),
    )


def _csv_queryset(plan: ExportPlan) -> QuerySet:
    aliases = {}
    names = []
    for name in _EVENT_FIELDS:
        if name in _CSV_ESCAPED:
            alias = "x_" + name.replace("__", "_")
            aliases[alias] = _escaped(name)
            names.append(alias)
        else:
            names.append(name)
    return plan.events().annotate(**aliases).values_list(*names)


def _details_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return json.dumps(value, ensure_ascii=False)


def _bounds(plan: ExportPlan) -> tuple[int | None, int | None]:
    agg = plan.events().aggregate(first=Min("id"), last=Max("id"))
    return agg["first"], agg["last"]


def _event_ref(row: tuple | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "id": row[0],
        "attempt_id": row[1],
        "created_at": chain_time(row[9]),
        "prev_hash": row[10],
        "hash": row[11],
    }


def _manifest(
    plan: ExportPlan,
    *,
    export_format: str,
    rows: int,
    links: int,
    first: tuple | None,
    last: tuple | None,
    contiguous: bool,
) -> dict[str, Any]:
    return {
        "type": "manifest",
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "export": export_format,
        "filters": plan.filters.as_dict(),
        "exported_by": plan.user_label,
        "row_count": rows,
        "link_count": links,
        "first_event": _event_ref(first),
        "last_event": _event_ref(last),
        "head_hash": last[11] if last else None,
        "contiguous": contiguous,
        "ledger_head": {"id": plan.upto, "hash": plan.head_hash},
    }


@dataclass
class CsvResult:
    manifest: dict[str, Any] | None = None


def stream_csv(plan: ExportPlan, result: CsvResult | None = None) -> Iterator[bytes]:
    """The CSV export in chunks. When ``result`` is given, its manifest (with the SHA-256 of
    exactly these bytes) is filled in once the last chunk has been produced."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    digest = hashlib.sha256()
    rows = 0
    first = last = None
    for row in _raw(_csv_queryset(plan)):
        if first is None:
            first = row
        last = row
        rows += 1
        details = row[8]
        if not isinstance(details, str) or details[:1] in _FORMULA_SET:
            # Stored details are a JSON object ("{..."); anything else is escaped like text.
            details = _details_text(details)
            row = (*row[:8], escape_cell(details), *row[9:])
        writer.writerow(row)
        if buffer.tell() >= FLUSH_BYTES:
            data = buffer.getvalue().encode("utf-8")
            buffer.seek(0)
            buffer.truncate()
            digest.update(data)
            yield data
    data = buffer.getvalue().encode("utf-8")
    digest.update(data)
    if data:
        yield data
    if result is not None:
        contiguous = (
            first is None
            or AttemptEvent.objects.filter(id__gte=first[0], id__lte=last[0]).count() == rows
        )
        # The manifest names events in the chain's form (unescaped); re-read them cleanly.
        result.manifest = _manifest(
            plan,
            export_format="csv",
            rows=rows,
            links=0,
            first=_plain_event(first[0]) if first else None,
            last=_plain_event(last[0]) if last else None,
            contiguous=contiguous,
        )
        result.manifest["sha256"] = digest.hexdigest()


def _plain_event(event_id: int) -> tuple:
    return AttemptEvent.objects.filter(id=event_id).values_list(*_EVENT_FIELDS[:12]).get()


def csv_manifest(plan: ExportPlan) -> dict[str, Any]:
    """The manifest of the CSV export of ``plan``, by producing it once (memory stays flat)."""
    result = CsvResult()
    for _ in stream_csv(plan, result):
        pass
    assert result.manifest is not None
    return result.manifest


def _json_event(row: tuple) -> str:
    # One line built by hand: the stored details JSON is spliced in without a parse, and the
    # strings go through the C string encoder. %-formatting keeps the JSON braces readable.
    return (
        '{"type":"event","id":%d,"attempt_id":%s,"action":%s,"actor_kind":%s,"actor":%s,'  # noqa: UP031
        '"from_state":%s,"to_state":%s,"reason":%s,"details":%s,"created_at":"%s",'
        '"prev_hash":"%s","hash":"%s","tenant":%s,"tool_name":%s,"idempotency_key":%s,'
        '"attempt_state":%s,"provider_request_id":%s}\n'
        % (
            row[0],
            encode_basestring(row[1]),
            encode_basestring(row[2]),
            encode_basestring(row[3]),
            encode_basestring(row[4]),
            encode_basestring(row[5]),
            encode_basestring(row[6]),
            encode_basestring(row[7]),
            _details_text(row[8]),
            chain_time(row[9]),
            row[10],
            row[11],
            encode_basestring(row[12]),
            encode_basestring(row[13]),
            encode_basestring(row[14]),
            encode_basestring(row[15]),
            encode_basestring(row[16]),
        )
    )


def stream_jsonl(plan: ExportPlan) -> Iterator[bytes]:
    """The JSON Lines export in chunks: header, events (and chain links), manifest last."""
    header = {
        "type": "header",
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "filters": plan.filters.as_dict(),
        "exported_by": plan.user_label,
        "generated_at": chain_time(timezone.now()),
        "ledger_head": {"id": plan.upto, "hash": plan.head_hash},
        "hashed_fields": "v, attempt_id, action, actor_kind, actor, from_state, to_state, "
        "reason, details, created_at, prev_hash (RFC 8785, SHA-256)",
    }
    parts = [json.dumps(header, ensure_ascii=False) + "\n"]
    size = 0
    rows = links = 0
    first = last = None
    if plan.scoped or plan.filters.since or plan.filters.until:
        lo, hi = _bounds(plan)
        matched = plan.events().values("pk")
        queryset = (
            AttemptEvent.objects.filter(id__gte=lo or 0, id__lte=hi or -1)
            .annotate(matched=Case(When(Q(pk__in=matched), then=Value(1)), default=Value(0)))
            .order_by("id")
            .values_list(*_EVENT_FIELDS, "matched")
        )
    else:
        queryset = plan.events().values_list(*_EVENT_FIELDS, Value(1))
    for row in _raw(queryset):
        if row[17]:
            line = _json_event(row)
            if first is None:
                first = row
            last = row
            rows += 1
        else:
            line = '{"type":"link","id":%d,"prev_hash":"%s","hash":"%s"}\n' % (  # noqa: UP031
                row[0],
                row[10],
                row[11],
            )
            links += 1
        parts.append(line)
        size += len(line)
        if size >= FLUSH_BYTES:
            yield "".join(parts).encode("utf-8")
            parts, size = [], 0
    manifest = _manifest(
        plan,
        export_format="jsonl",
        rows=rows,
        links=links,
        first=first,
        last=last,
        contiguous=True,
    )
    parts.append(json.dumps(manifest, ensure_ascii=False) + "\n")
    yield "".join(parts).encode("utf-8")


def file_name(plan: ExportPlan, extension: str) -> str:
    bits = ["audit"]
    for value in (plan.filters.tenant, plan.filters.tool, plan.filters.state):
        if value:
            bits.append("".join(c if c.isalnum() or c in "-_" else "_" for c in value)[:40])
    bits.append(f"upto{plan.upto}")
    return "-".join(bits) + "." + extension
