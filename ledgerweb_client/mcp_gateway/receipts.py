"""What of an MCP tool result the ledger keeps in ``result_ref``, and how a repeated call gets it
back. Plain dicts in MCP's wire shape (``content``, ``structuredContent``), standard library
only, so the gateway and the ledger's MCP provider adapter share one encoding.

``mcp:{"s": <structuredContent>}`` or ``mcp:{"t": "<the text content>"}`` when it fits the
ledger's 500 characters (``receipt_fields`` keeps only some structured fields); otherwise a
``sha256:`` digest of the result, which proves what was received but cannot be replayed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..guard import has_value, json_receipt, read_json_receipt

__all__ = ["MCP_RECEIPT_PREFIX", "kept_result", "result_ref_for", "structured_or_json_text"]

MCP_RECEIPT_PREFIX = "mcp:"


def structured_or_json_text(result: Mapping[str, Any]) -> Any:
    """The result's structured content, or its text content read as JSON when it is an object
    (servers that predate structured output); ``None`` when neither is there."""
    structured = result.get("structuredContent")
    if structured is not None:
        return structured
    texts = [
        block.get("text", "")
        for block in result.get("content") or []
        if block.get("type") == "text"
    ]
    if len(texts) == 1:
        try:
            decoded = json.loads(texts[0])
        except ValueError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def result_ref_for(result: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """The ``result_ref`` that keeps ``result`` (an MCP tool result as a dict)."""
    structured = result.get("structuredContent")
    if structured is not None:
        if fields is not None and isinstance(structured, Mapping):
            structured = {name: structured[name] for name in fields if name in structured}
        return json_receipt({"s": structured}, prefix=MCP_RECEIPT_PREFIX)
    texts = [
        block.get("text", "")
        for block in result.get("content") or []
        if block.get("type") == "text"
    ]
    return json_receipt({"t": "\n".join(texts)}, prefix=MCP_RECEIPT_PREFIX)


def kept_result(result_ref: str | None) -> dict[str, Any] | None:
    """The MCP result (``content`` and, when kept, ``structuredContent``) that ``result_ref``
    holds (an object kept as ``json:`` by another integration counts as structured content), or
    ``None`` when it holds none (a digest, or another adapter's reference)."""
    kept = read_json_receipt(result_ref, prefix=MCP_RECEIPT_PREFIX)
    if not has_value(kept):
        # A receipt another integration kept for the same ledger tool (``json:``).
        other = read_json_receipt(result_ref)
        kept = {"s": other} if isinstance(other, dict) else None
    if not isinstance(kept, dict):
        return None
    if "s" in kept:
        text = json.dumps(kept["s"], ensure_ascii=False)
        return {"content": [{"type": "text", "text": text}], "structuredContent": kept["s"]}
    if "t" in kept and isinstance(kept["t"], str):
        return {"content": [{"type": "text", "text": kept["t"]}]}
    return None
