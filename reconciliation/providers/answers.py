"""What a provider says is checked like what an agent says.

Ids and references a lookup or a send returns go through the same rules as the agent API's
(``attempts.ledger.stored_text_problem``: characters, length). An answer that fails is never
stored as a fact: the adapter answers with ``invalid`` (the reason) and ``evidence`` (the raw
answer, truncated and escaped to ASCII so any database and any page can hold it), and the
reconciler hands the attempt to a person.
"""

from __future__ import annotations

import json
from typing import Any

from attempts.ledger import stored_text_problem

# Raw answer characters kept as evidence.
EVIDENCE_CHARS = 1000


def id_problem(name: str, value: Any) -> str:
    """Why ``value`` may not be stored as ``name`` ('' when it may)."""
    if not isinstance(value, str):
        return f"{name} is not a string but {type(value).__name__}"
    if not value:
        return f"{name} is empty"
    return stored_text_problem(name, value)


def checked_id(name: str, value: Any) -> tuple[str, str]:
    """(value, '') when ``value`` is a storable ``name``; ('', why) otherwise."""
    problem = id_problem(name, value)
    return ("", problem) if problem else (value, "")


def evidence_of(raw: Any) -> str:
    """The raw answer as evidence: at most EVIDENCE_CHARS characters, escaped to ASCII (control
    characters, NUL, bidirectional overrides and lone surrogates become visible escapes)."""
    if isinstance(raw, bytes | bytearray):
        text = bytes(raw[: EVIDENCE_CHARS * 4]).decode("utf-8", errors="backslashreplace")
    elif isinstance(raw, str):
        text = raw
    else:
        try:
            text = json.dumps(raw, ensure_ascii=False, default=repr)
        except (ValueError, RecursionError):
            text = repr(raw)
    truncated = len(text) > EVIDENCE_CHARS
    escaped = json.dumps(text[:EVIDENCE_CHARS], ensure_ascii=True)[1:-1]
    return escaped + (" [truncated]" if truncated else "")
