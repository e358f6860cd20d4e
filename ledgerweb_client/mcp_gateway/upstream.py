"""Talking to one upstream MCP server with the official SDK's client (extra ``mcp``).

Used by the gateway (one long-lived connection per upstream) and by the ledger's MCP provider
adapter (one short connection per lookup or send, from the reconcile worker).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from .config import Upstream

if TYPE_CHECKING:
    from mcp.types import RequestParamsMeta

__all__ = ["NotSent", "call_tool_once", "client_for", "request_meta", "result_dict"]


class NotSent(Exception):
    """The upstream could not be reached, so the tool call never left this process."""


def client_for(upstream: Upstream, *, read_timeout: float | None = None) -> Client:
    """An (unentered) SDK client for ``upstream``.

    A stdio upstream is started with the SDK's small set of safe environment variables plus the
    configured ``env``, never this process's whole environment (which holds the ledger token).
    """
    if upstream.command:
        server: Any = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env=dict(upstream.env) if upstream.env else None,
            cwd=upstream.cwd,
        )
    else:
        server = upstream.url
    return Client(server, read_timeout_seconds=read_timeout, cache=None)


def result_dict(result: CallToolResult) -> dict[str, Any]:
    """A tool result in MCP's wire shape (``content``, ``structuredContent``, ``isError``)."""
    wire: dict[str, Any] = json.loads(result.model_dump_json(by_alias=True, exclude_none=True))
    return wire


def request_meta(meta: Mapping[str, Any] | None) -> RequestParamsMeta | None:
    """A request's ``_meta`` as the SDK types it: MCP's open map (any keys, each optional)."""
    return cast("RequestParamsMeta", dict(meta)) if meta is not None else None


async def call_tool_once(
    upstream: Upstream,
    tool: str,
    arguments: dict[str, Any],
    *,
    timeout: float,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Connect, call one tool, disconnect; the result as a dict.

    Raises ``NotSent`` when the connection could not be made (nothing was sent), ``TimeoutError``
    past ``timeout``, and whatever else the SDK raises once the call may have left.
    """
    connected = False
    try:
        with anyio.fail_after(timeout):
            async with client_for(upstream, read_timeout=timeout) as client:
                connected = True
                result = await client.call_tool(tool, arguments, meta=request_meta(meta))
    except Exception as exc:
        if not connected:
            raise NotSent(f"cannot connect to upstream {upstream.name!r}: {exc!r}") from exc
        raise
    return result_dict(result)
