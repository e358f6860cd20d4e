"""The MCP gateway: an MCP server that fronts upstream MCP servers and records side effects.

It lists every upstream tool unchanged. A call to a tool the configuration names as a side
effect goes through the ledger in the safe order (protocol section 4):

1. the idempotency key from the tool's template over the arguments, the tenant and the task;
2. the intent recorded, and the dispatch claimed, through ``ledgerweb_client``;
3. the upstream call, with the key and attempt id in the request's ``_meta``
   (``io.ledgerweb/idempotency_key``, ``io.ledgerweb/attempt_id``) so the upstream can keep them;
4. the answer recorded: the durable receipt confirms the attempt when the tool says its result is
   one; a lost or timed-out answer marks it UNKNOWN, never success or failure.

A repeated call under the same key returns the recorded result without calling upstream; a key
reused with other arguments, a tenant not granted, an attempt in flight or UNKNOWN are MCP errors
(``LEDGER_ERROR_CODES``). Tools not configured pass through unrecorded.

A call an approval policy holds (AWAITING_APPROVAL) is answered with a *tool result* marked
``isError``, whose text says it is pending a person's approval, that nothing was done, and that
the same call later returns the outcome, and whose ``_meta["io.ledgerweb/attempt"]`` carries the
attempt id, ``state`` and ``pending_approval: true``. A rejected or expired one is answered the
same way with its reason. After edit-and-approve the linked attempt's corrected arguments are
sent, under its key.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from ..client import LedgerClient, __version__
from ..errors import ProviderLostResponse, ProviderRefused, ProviderTimeout
from ..guard import (
    GuardedCall,
    LedgerContext,
    Recorded,
    ToolCallAwaitingApproval,
    ToolCallError,
    ToolCallInvalid,
    ToolCallRejected,
)
from .config import ConfigError, GatewayConfig, ToolConfig, Upstream, load_config
from .receipts import kept_result, result_ref_for, structured_or_json_text
from .schema import SchemaMissing, SchemaRefusal, conform
from .upstream import client_for, request_meta, result_dict

if sys.version_info < (3, 11):  # anyio's own dependency there: the builtin's backport
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]  # 3.10 only

log = logging.getLogger("ledgerweb_client.mcp_gateway")

__all__ = ["LEDGER_ERROR_CODES", "Gateway", "main"]

# MCP (JSON-RPC) error codes for the ledger's refusals; ``data`` carries the ledger's code, and
# the attempt id and state when there is an attempt.
LEDGER_ERROR_CODES: dict[str, int] = {
    "invalid_call": types.INVALID_PARAMS,
    "idempotency_conflict": types.INVALID_PARAMS,
    "not_granted": -32010,
    "not_dispatchable": -32011,
    "outcome_unknown": -32012,
    "failed": -32013,
    "ledger_unavailable": -32014,
    "ledger_error": -32015,
}
META_TENANT = "io.ledgerweb/tenant"
META_TASK = "io.ledgerweb/task_id"
META_KEY = "io.ledgerweb/idempotency_key"
META_ATTEMPT = "io.ledgerweb/attempt_id"
META_LEDGER = "io.ledgerweb/attempt"
RESERVED_META_PREFIX = "io.modelcontextprotocol/"


def mcp_error(error: ToolCallError) -> MCPError:
    """The MCP error a client receives for a refusal of the ledger."""
    return MCPError(
        LEDGER_ERROR_CODES.get(error.code, LEDGER_ERROR_CODES["ledger_error"]),
        error.for_model,
        error.as_dict(),
    )


def _ledger_meta(attempt: Any, *, replayed: bool) -> dict[str, Any]:
    return {
        META_LEDGER: {
            "attempt_id": attempt.attempt_id,
            "state": attempt.state,
            "idempotency_key": attempt.idempotency_key,
            "replayed": replayed,
        }
    }


def approval_result(error: ToolCallAwaitingApproval | ToolCallRejected) -> types.CallToolResult:
    """A held (or rejected) call as a tool result the model reads: ``isError`` because the tool
    did not do what was asked (a success would let a model report an effect that has not
    happened, and a tool with an ``outputSchema`` could not return a conforming result), but a
    result, not a JSON-RPC error, so the agent sees what to do: nothing now, and the same call
    with the same arguments later returns the outcome (it is the same idempotency key, so a
    repeat never causes a second effect)."""
    attempt = error.attempt
    assert attempt is not None
    meta = _ledger_meta(attempt, replayed=False)
    if isinstance(error, ToolCallAwaitingApproval):
        text = (
            f"Pending approval: tool call held for a person's approval (attempt "
            f"{attempt.attempt_id}, state {attempt.state}). Nothing has been done yet. Call "
            "this tool again later with the same arguments to get the outcome; repeating it is "
            "safe and never does it twice."
        )
        if error.dashboard_url:
            text += f" Approvers decide at {error.dashboard_url}"
        meta[META_LEDGER].update(
            pending_approval=True,
            code=error.code,
            dashboard_url=error.dashboard_url,
            args_hash=attempt.args_hash,
        )
    else:
        text = (
            f"Not done: {error.message} (attempt {attempt.attempt_id}, {error.reason}). Do not "
            "retry it; ask for a different action if one is needed."
        )
        meta[META_LEDGER].update(pending_approval=False, code=error.code)
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}
    )


def _with_meta(result: dict[str, Any], extra: Mapping[str, Any]) -> types.CallToolResult:
    result = dict(result)
    result["_meta"] = {**(result.get("_meta") or {}), **extra}
    return types.CallToolResult.model_validate(result)


@dataclass
class _Route:
    upstream: Upstream
    client: Client
    tool: types.Tool


class Gateway:
    """The gateway's state: the configuration, the ledger client, one connected SDK client per
    upstream, and which upstream serves which tool."""

    def __init__(
        self,
        config: GatewayConfig,
        ledger: LedgerClient,
        *,
        tenant: str | None = None,
        task_id: str | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.tenant = tenant or config.ledger.tenant
        self.task_id = task_id or config.ledger.task_id
        self._clients: dict[str, Client] = {}
        self._routes: dict[str, _Route] = {}

    async def connect(self, stack: AsyncExitStack) -> None:
        """Connect every upstream and learn its tools; ``ConfigError`` when two upstreams offer
        the same tool or a configured tool is missing upstream."""
        for name, upstream in self.config.upstreams.items():
            client = client_for(upstream)
            try:
                await stack.enter_async_context(client)
            except Exception as exc:
                raise ConfigError(f"cannot connect to upstream {name!r}: {exc!r}") from exc
            self._clients[name] = client
        await self.refresh_tools()
        for name, tool in self.config.tools.items():
            route = self._routes.get(name)
            if route is None or route.upstream.name != tool.upstream:
                raise ConfigError(
                    f"[tools.{name}]: upstream {tool.upstream!r} has no tool {name!r}"
                )
            upstream_tools = {
                n for n, r in self._routes.items() if r.upstream.name == tool.upstream
            }
            if tool.lookup_tool and tool.lookup_tool not in upstream_tools:
                raise ConfigError(
                    f"[tools.{name}]: upstream {tool.upstream!r} has no lookup tool "
                    f"{tool.lookup_tool!r}"
                )

    async def refresh_tools(self) -> list[types.Tool]:
        """Every upstream's tools, as they list them; refreshes the routing table."""
        routes: dict[str, _Route] = {}
        listed: list[types.Tool] = []
        for name, client in self._clients.items():
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                for tool in page.tools:
                    if tool.name in routes:
                        other = routes[tool.name].upstream.name
                        raise ConfigError(
                            f"upstreams {other!r} and {name!r} both offer a tool {tool.name!r}"
                        )
                    routes[tool.name] = _Route(self.config.upstreams[name], client, tool)
                    listed.append(tool)
                cursor = page.next_cursor
                if not cursor:
                    break
        self._routes = routes
        return listed

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        route = self._routes.get(name)
        return route.tool.input_schema if route is not None else None

    # -- MCP handlers -----------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await self.refresh_tools())

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        route = self._routes.get(params.name)
        if route is None:
            await self.refresh_tools()
            route = self._routes.get(params.name)
        if route is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        meta = dict(ctx.meta or {})
        forwarded = {k: v for k, v in meta.items() if not k.startswith(RESERVED_META_PREFIX)}
        arguments = dict(params.arguments or {})
        tool = self.config.tools.get(params.name)
        if tool is None:
            # Not a side effect: straight through, unrecorded.
            result = await route.client.call_tool(
                params.name, arguments, meta=request_meta(forwarded or None)
            )
            return result
        # What is recorded (and hashed, and sent) is what the upstream acts on.
        arguments = self.conformed_arguments(route, arguments)
        return await self._guarded_call(tool, route, arguments, meta, forwarded)

    @staticmethod
    def conformed_arguments(route: _Route, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments coerced and validated against the upstream tool's ``inputSchema``
        (schema.py), or the MCP error (invalid params) that refuses them; nothing recorded."""
        try:
            return conform(arguments, route.tool.input_schema)
        except (SchemaRefusal, SchemaMissing) as exc:
            raise mcp_error(ToolCallInvalid(f"{route.tool.name}: {exc}")) from exc

    # -- the safe order ---------------------------------------------------------------------

    def _context(self, meta: Mapping[str, Any]) -> LedgerContext:
        tenant = meta.get(META_TENANT) or self.tenant
        task_id = meta.get(META_TASK) or self.task_id
        if not isinstance(tenant, str) or not tenant:
            raise ToolCallInvalid(f"no tenant: set _meta {META_TENANT!r} or [ledger] tenant")
        if not isinstance(task_id, str) or not task_id:
            raise ToolCallInvalid(f"no task id: set _meta {META_TASK!r} or [ledger] task_id")
        return LedgerContext(self.ledger, tenant, task_id)

    async def _guarded_call(
        self,
        tool: ToolConfig,
        route: _Route,
        arguments: dict[str, Any],
        meta: Mapping[str, Any],
        forwarded: dict[str, Any],
    ) -> types.CallToolResult:
        try:
            context = self._context(meta)
            try:
                key = tool.key.render(
                    arguments, tenant=context.tenant, task_id=context.task_id, tool=tool.ledger_tool
                )
            except ValueError as exc:
                raise ToolCallInvalid(f"cannot build the idempotency key: {exc}") from exc
            guard = GuardedCall(
                context, tool_name=tool.ledger_tool, idempotency_key=key, args=arguments
            )
            recorded = await anyio.to_thread.run_sync(
                lambda: guard.begin(wait_for_approval=tool.approval_wait_seconds, other_args=True)
            )
        except (ToolCallAwaitingApproval, ToolCallRejected) as exc:
            return approval_result(exc)
        except ToolCallError as exc:
            raise mcp_error(exc) from exc
        if recorded is not None:
            return self._replay(recorded)
        attempt = guard.attempt
        assert attempt is not None
        # After edit-and-approve: the linked attempt's corrected arguments, under its key.
        key, arguments = attempt.idempotency_key, guard.send_args
        upstream_meta = {**forwarded, META_KEY: key, META_ATTEMPT: attempt.attempt_id}
        try:
            with anyio.fail_after(tool.timeout_seconds):
                result = await route.client.call_tool(
                    tool.name, arguments, meta=request_meta(upstream_meta)
                )
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                report: Exception = ProviderTimeout(
                    f"upstream {route.upstream.name!r} did not answer {tool.name} within "
                    f"{tool.timeout_seconds}s"
                )
            else:
                report = ProviderLostResponse(
                    f"the answer of upstream {route.upstream.name!r} to {tool.name} was lost: "
                    f"{exc!r}"
                )
            with anyio.CancelScope(shield=True):
                error = await anyio.to_thread.run_sync(guard.raised, report)
            if not isinstance(exc, Exception):
                raise  # cancelled: recorded as UNKNOWN above, now let the cancellation go on
            raise mcp_error(error) from exc
        answer = result_dict(result)
        if result.is_error:
            return await self._error_result(tool, guard, answer)
        provider_id = None
        if tool.request_id:
            found = structured_or_json_text(answer)
            value = found.get(tool.request_id) if isinstance(found, dict) else None
            provider_id = str(value) if value not in (None, "") else None
        result_ref = result_ref_for(answer, tool.receipt_fields) if tool.receipt else None
        with anyio.CancelScope(shield=True):
            attempt = await anyio.to_thread.run_sync(
                lambda: guard.succeeded(provider_request_id=provider_id, result_ref=result_ref)
            )
        return _with_meta(answer, _ledger_meta(attempt, replayed=False))

    async def _error_result(
        self, tool: ToolConfig, guard: GuardedCall, answer: dict[str, Any]
    ) -> types.CallToolResult:
        """The upstream answered with a tool error (``isError``). Whether anything happened is
        the tool's ``error_result`` setting: unknown (the default), or a refusal."""
        text = " ".join(
            block.get("text", "")
            for block in answer.get("content", [])
            if block.get("type") == "text"
        )
        report: Exception
        if tool.error_result == "unknown":
            report = ProviderLostResponse(f"upstream tool error: {text}"[:900])
        else:
            report = ProviderRefused(
                f"upstream tool error: {text}"[:900], retryable=tool.error_result == "retryable"
            )
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(guard.raised, report)
        attempt = guard.attempt
        assert attempt is not None
        return _with_meta(answer, _ledger_meta(attempt, replayed=False))

    def _replay(self, recorded: Recorded) -> types.CallToolResult:
        """A repeated call: the result the ledger kept, or a short note when it kept none."""
        kept = kept_result(recorded.result_ref)
        if kept is None:
            kept = {"content": [{"type": "text", "text": str(recorded)}]}
        return _with_meta(kept, _ledger_meta(recorded.attempt, replayed=True))


def build_server(gateway: Gateway) -> Server[Any]:
    """The MCP server whose handlers are the gateway's."""
    return Server(
        "ledgerweb-mcp-gateway",
        version=__version__,
        instructions="Tools of the upstream MCP servers; side effects are recorded in ledgerweb.",
        get_tool_input_schema=gateway.input_schema,
        on_list_tools=gateway.list_tools,
        on_call_tool=gateway.call_tool,
    )


async def serve(
    config: GatewayConfig,
    *,
    tenant: str | None,
    task_id: str | None,
    http_port: int | None,
    port_file: str | None,
) -> None:
    """Connect the upstreams and serve MCP on stdio, or on streamable HTTP at 127.0.0.1."""
    token = os.environ.get(config.ledger.token_env, "")
    url = config.ledger.url or os.environ.get("LEDGERWEB_URL", "")
    if not url:
        raise ConfigError(f"{config.path}: set [ledger] url, or export LEDGERWEB_URL")
    if not token:
        raise ConfigError(f"the ledger token is not set: export {config.ledger.token_env}")
    try:
        ledger = LedgerClient(url, token, timeout=config.ledger.timeout_seconds)
    except ValueError as exc:
        raise ConfigError(f"{config.path}: [ledger] url: {exc}") from None
    with ledger:
        gateway = Gateway(config, ledger, tenant=tenant, task_id=task_id)
        async with AsyncExitStack() as stack:
            await gateway.connect(stack)
            server = build_server(gateway)
            if http_port is None:
                from mcp.server.stdio import stdio_server

                async with stdio_server() as (read_stream, write_stream):
                    await server.run(
                        read_stream, write_stream, server.create_initialization_options()
                    )
                return
            await _serve_http(server, http_port, port_file)


async def _serve_http(server: Server[Any], port: int, port_file: str | None) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn_server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    )
    print(f"ledgerweb MCP gateway on http://127.0.0.1:{bound}/mcp", file=sys.stderr, flush=True)
    if port_file:
        Path(port_file).write_text(f"{bound}\n", encoding="utf-8")
    await uvicorn_server.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    """``ledgerweb-mcp-gateway``: run the gateway (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="ledgerweb-mcp-gateway",
        description=(
            "An MCP server that fronts upstream MCP servers, lists their tools unchanged, and "
            "records every call to a tool configured as a side effect in the ledgerweb ledger "
            "(intent, claim, upstream call, receipt or UNKNOWN). Serves MCP on stdio, or on "
            "streamable HTTP at 127.0.0.1 with --http. The agent token is read from the "
            "variable named by [ledger] token_env (default LEDGERWEB_TOKEN). `ledgerweb-mcp-gateway "
            "init --help`: draft a configuration from an upstream's tool annotations."
        ),
    )
    parser.add_argument("--config", required=True, help="the gateway's TOML configuration file")
    parser.add_argument("--tenant", help="tenant for calls whose _meta names none")
    parser.add_argument("--task-id", help="task id for calls whose _meta names none")
    parser.add_argument(
        "--http",
        type=int,
        metavar="PORT",
        help="serve streamable HTTP on 127.0.0.1:PORT (0 picks a free port) instead of stdio",
    )
    parser.add_argument("--port-file", help="with --http: write the bound port to this file")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        config = load_config(options.config)
        anyio.run(
            lambda: serve(
                config,
                tenant=options.tenant,
                task_id=options.task_id,
                http_port=options.http,
                port_file=options.port_file,
            )
        )
    except (ConfigError, BaseExceptionGroup) as exc:
        problem = _config_error(exc)
        if problem is None:
            raise
        print(f"ledgerweb-mcp-gateway: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _config_error(exc: BaseException) -> ConfigError | None:
    """The ConfigError inside ``exc`` (task groups wrap what their tasks raise)."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _config_error(inner)
            if found is not None:
                return found
    return None
