"""The audit chain: how each history event is hashed and linked to the one before it.

Every event carries ``prev_hash`` (the hash of the event before it in the whole ledger, or
``GENESIS`` for the first) and ``hash``, the SHA-256 of the RFC 8785 canonical encoding of its
fields together with ``prev_hash``. Order is the event id. See docs/audit-chain.md.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from attempts import jcs

GENESIS = "0" * 64
CHAIN_FORMAT = 1


def format_time(value: dt.datetime) -> str:
    """The one text form of a timestamp inside the chain: UTC, microseconds, ``Z``."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_payload(
    *,
    attempt_id: str,
    action: str,
    actor_kind: str,
    actor: str,
    from_state: str,
    to_state: str,
    reason: str,
    details: dict[str, Any],
    created_at: dt.datetime | str,
    prev_hash: str,
) -> dict[str, Any]:
    return {
        "v": CHAIN_FORMAT,
        "attempt_id": attempt_id,
        "action": action,
        "actor_kind": actor_kind,
        "actor": actor,
        "from_state": from_state,
        "to_state": to_state,
        "reason": reason,
        "details": details,
        "created_at": created_at if isinstance(created_at, str) else format_time(created_at),
        "prev_hash": prev_hash,
    }


def payload_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(jcs.dumps(payload)).hexdigest()


def payload_parts(payload: dict[str, Any]) -> tuple[bytes, bytes]:
    """The canonical encoding of ``payload`` cut where its ``prev_hash`` value goes.

    An event's hash needs the chain head, which is known only under the write lock; its
    details are known long before. The top-level keys are fixed ASCII names, which JCS orders
    as Python does, so the canonical bytes are the members before ``prev_hash``, then
    ``prev_hash``, then the members after it; ``linked_hash(parts, prev)`` equals
    ``payload_hash`` of the payload with that ``prev_hash`` (tests/attempts/test_audit_*)."""
    before = {key: value for key, value in payload.items() if key < "prev_hash"}
    after = {key: value for key, value in payload.items() if key > "prev_hash"}
    if not before or not after:
        raise ValueError("an event payload needs members on both sides of prev_hash")
    return jcs.dumps(before)[:-1] + b',"prev_hash":', b"," + jcs.dumps(after)[1:]


def linked_hash(parts: tuple[bytes, bytes], prev_hash: str) -> str:
    """The hash of the event whose payload was cut into ``parts``, linked after ``prev_hash``."""
    return hashlib.sha256(parts[0] + jcs.dumps(prev_hash) + parts[1]).hexdigest()
