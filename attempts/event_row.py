"""One event of an attempt as it is written: what ``attempts.chain`` links and ``attempts.rows``
inserts. A module of its own so the write path's SQL needs nothing of the chain."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple


class EventRow(NamedTuple):
    """One event of an attempt, linked into its chain (``chain.attempt_event``)."""

    action: str
    actor_kind: str
    actor: str
    from_state: str
    to_state: str
    reason: str
    details: dict[str, Any]
    created_at: dt.datetime
    prev_hash: str
    hash: str
    chain_format: int
    text_digest: str
