"""The raw baselines' chain-format-3 event, built one way for every bench that writes the
ledger's rows without the ledger (``bench/pg_peers.py``'s raw clients, ``bench/write_path.py``'s
``sqlite3`` one), so each baseline hashes exactly what the ledger hashes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attempts.verify_export import SALTED_FORMAT, event_hash, text_digest


def format3_event(
    attempt_id: str,
    action: str,
    from_state: str,
    to_state: str,
    details: dict[str, Any],
    created_at: Any,
    prev_hash: str,
    salt: str,
    *,
    dumps: Callable[[Any], bytes] | None = None,
) -> tuple[dict[str, Any], str]:
    """The hashed fields of an event by the agent "bench" with no reason (free text by its
    salted digest, as the ledger writes them), and the event's hash. ``dumps`` is the RFC 8785
    encoder (the verifiers' reference when omitted)."""
    encoder = {} if dumps is None else {"dumps": dumps}
    row = {
        "v": SALTED_FORMAT,
        "attempt_id": attempt_id,
        "action": action,
        "actor_kind": "agent",
        "actor": "bench",
        "from_state": from_state,
        "to_state": to_state,
        "reason": "",
        "details": details,
        "created_at": created_at,
        "prev_hash": prev_hash,
        "text_digest": text_digest(salt, "", details, **encoder),
    }
    return row, event_hash(row, **encoder)
