"""What an archive line carries of an attempt and of each of its events: one table per model,
read by the writer (``archive.py``) and by restore (``restore.py``), so the two cannot drift.

Each column names its key in the archive line, the model field it comes from and goes back to,
and how it is carried: as it is, as the chain's text form of a time, or by hand (a related row
named by its name, or a value restore does not put back). The table's order is the line's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from attempts.verify_export import chain_time

COPY = "copy"
TIME = "time"
# Written and restored by the caller: a related row (by name) or a value restore leaves out.
BY_HAND = "by hand"
_REQUIRED = object()


class Column(NamedTuple):
    key: str  # in the archive line
    field: str  # on the model
    how: str = COPY
    # What restore reads when an older archive has no such key; _REQUIRED: every archive has it.
    default: Any = _REQUIRED


ATTEMPT_COLUMNS: tuple[Column, ...] = (
    Column("attempt_id", "attempt_id"),
    Column("tenant", "tenant_id"),
    Column("task_id", "task_id"),
    Column("tool_name", "tool_name"),
    Column("args", "args"),
    Column("args_hash", "args_hash"),
    Column("args_salt", "args_salt", default=""),
    Column("idempotency_key", "idempotency_key"),
    Column("state", "state"),
    Column("version", "version"),
    Column("provider_request_id", "provider_request_id"),
    Column("result_ref", "result_ref"),
    Column("policy_version", "policy_version"),
    Column("credential_scope", "credential_scope"),
    Column("parent_attempt_id", "parent", BY_HAND),
    Column("owner", "owner", BY_HAND),
    Column("review_reason", "review_reason"),
    Column("approval_policy", "approval_policy", BY_HAND),
    Column("recorded_by", "recorded_by", default=None),
    Column("send_count", "send_count"),
    Column("lookup_count", "lookup_count"),
    Column("chain_head", "chain_head"),
    Column("chain_length", "chain_length"),
    Column("traceparent", "traceparent"),
    Column("trace_id", "trace_id"),
    Column("created_at", "created_at", TIME),
    Column("updated_at", "updated_at", TIME),
)

EVENT_COLUMNS: tuple[Column, ...] = (
    Column("id", "id", BY_HAND),  # the ledger's id, for reference; restore numbers anew
    Column("action", "action"),
    Column("actor_kind", "actor_kind"),
    Column("actor", "actor"),
    Column("from_state", "from_state"),
    Column("to_state", "to_state"),
    Column("reason", "reason"),
    Column("details", "details"),
    Column("created_at", "created_at", TIME),
    Column("v", "chain_format"),
    Column("prev_hash", "prev_hash"),
    Column("hash", "hash"),
    Column("text_digest", "text_digest", default=""),
)


def to_line(
    columns: tuple[Column, ...], row: Any, by_hand: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``row`` as an archive line's object; the by-hand columns' values come from ``by_hand``."""
    by_hand = by_hand or {}
    out: dict[str, Any] = {}
    for column in columns:
        if column.how == BY_HAND:
            out[column.key] = by_hand[column.key]
            continue
        value = getattr(row, column.field)
        if column.how == TIME and value is not None:
            value = chain_time(value)
        out[column.key] = value
    return out


def from_line(columns: tuple[Column, ...], line: dict[str, Any]) -> dict[str, Any]:
    """The model fields an archive line's object gives back, by-hand columns left out."""
    fields: dict[str, Any] = {}
    for column in columns:
        if column.how == BY_HAND:
            continue
        if column.default is _REQUIRED:
            value = line[column.key]
        else:
            value = line.get(column.key, column.default)
        if column.how == TIME and value is not None:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        fields[column.field] = value
    return fields
