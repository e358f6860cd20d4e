"""The provider adapter for tools behind the MCP gateway: reconciliation asks the upstream MCP
server itself, through the lookup tool the gateway's configuration names.

The adapter reads the same TOML file as the gateway (``LEDGERWEB_MCP_GATEWAY_CONFIG``) and finds
the gateway tool whose ``ledger_tool`` is this tool's name: its upstream (started over stdio or
reached over streamable HTTP with the official ``mcp`` SDK, which the server's ``mcp`` extra
installs), its ``lookup_tool`` and ``lookup_args``.

The lookup tool answers with a JSON object (structured content, or text holding JSON):
``{"found": false}`` is NOT_FOUND; ``{"found": true, "id": "<provider id>", "args": {...}}``
(or ``"args_hash"`` instead of ``"args"``; optionally ``"count"`` and ``"result"``, the receipt
kept as ``result_ref``) is FOUND. The ledger hashes ``args`` as it hashed the intent, so a
payload that differs goes to MANUAL_REVIEW. A tool error, a timeout or an unreadable answer is
UNAVAILABLE or AMBIGUOUS: the attempt stays UNKNOWN.

A send (recovery resending a stale intent, or an idempotent tool not found) calls the upstream
tool with the recorded arguments and the key in ``_meta``, as the gateway does.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from attempts.canonical import InvalidArguments, normalize_args
from ledgerweb_client.mcp_gateway.config import ConfigError, GatewayConfig, ToolConfig, load_config
from ledgerweb_client.mcp_gateway.receipts import result_ref_for, structured_or_json_text
from reconciliation.providers import base

log = logging.getLogger("ledgerweb.reconciler")

META_KEY = "io.ledgerweb/idempotency_key"
META_ATTEMPT = "io.ledgerweb/attempt_id"


class _SessionPool:
    """One connected upstream session per upstream, shared by every lookup of this process
    (starting a stdio upstream for each lookup costs seconds). The sessions live in one event
    loop in one thread (an anyio blocking portal), each held open by its own task (the SDK's
    client must be closed by the task that opened it); a session whose call fails is closed and
    opened again on the next lookup. At most ``MAX_SESSIONS``; ``close`` (the reconcile worker
    calls it as it stops) closes them all and ends the thread.

    Each upstream connects under its own lock: one upstream slow to start or to answer its
    handshake (up to the tool's timeout) holds up only its own lookups, never another
    upstream's, as its bulkhead promises."""

    MAX_SESSIONS = 16

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the table of sessions and the portal, briefly
        self._connecting: dict[str, threading.Lock] = {}  # one per upstream, while it connects
        self._portal_cm: Any = None
        self._portal: Any = None
        # upstream name -> (client, closing event, the keeper task's future)
        self._sessions: dict[str, tuple[Any, Any, Any]] = {}

    def _portal_now(self) -> Any:
        with self._lock:
            if self._portal is None:
                from anyio.from_thread import start_blocking_portal

                self._portal_cm = start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
            return self._portal

    @staticmethod
    async def _keep(upstream: Any, timeout: float, holder: dict, closing: Any) -> None:
        """The task that opens one session, holds it until ``closing`` is set, and closes it."""
        from ledgerweb_client.mcp_gateway.upstream import client_for

        try:
            async with client_for(upstream, read_timeout=timeout) as client:
                holder["client"] = client
                holder["ready"].set()
                await closing.wait()
        except Exception as exc:  # could not connect, or the session died: the next call says
            holder.setdefault("error", exc)
            log.debug("the session of upstream %s ended: %r", upstream.name, exc)
        finally:
            holder["ready"].set()

    def _session(self, upstream: Any, timeout: float) -> Any:
        import anyio

        started = time.monotonic()
        with self._lock:
            found = self._sessions.get(upstream.name)
            if found is not None:
                return found[0]
            connecting = self._connecting.setdefault(upstream.name, threading.Lock())
        # Lookups of this upstream wait for its one connection; others go on.
        if not connecting.acquire(timeout=timeout):
            raise TimeoutError(f"upstream {upstream.name!r} did not connect in {timeout:g}s")
        try:
            with self._lock:
                found = self._sessions.get(upstream.name)
                if found is not None:
                    return found[0]
                full = len(self._sessions) >= self.MAX_SESSIONS
                oldest = next(iter(self._sessions)) if full else None
                portal = self._portal_now()
            if oldest is not None:
                self._drop(oldest)
            holder: dict[str, Any] = {"ready": threading.Event()}
            closing = portal.call(anyio.Event)
            future = portal.start_task_soon(self._keep, upstream, timeout, holder, closing)
            if not holder["ready"].wait(max(0.0, timeout - (time.monotonic() - started))):
                future.cancel()
                raise TimeoutError(f"upstream {upstream.name!r} did not connect in {timeout:g}s")
            if "client" not in holder:
                raise holder.get("error") or ConnectionError(f"upstream {upstream.name!r} closed")
            with self._lock:
                self._sessions[upstream.name] = (holder["client"], closing, future)
            return holder["client"]
        finally:
            connecting.release()

    def _drop(self, name: str) -> None:
        with self._lock:
            found = self._sessions.pop(name, None)
            portal = self._portal
        if found is not None and portal is not None:
            _, closing, future = found
            portal.call(closing.set)
            try:
                future.result(timeout=10)
            except Exception as exc:
                log.debug("the session of upstream %s ended with %r", name, exc)

    def call(self, upstream: Any, tool: str, arguments: Any, *, timeout: float) -> dict[str, Any]:
        """Call ``tool`` on ``upstream``'s pooled session, within ``timeout`` seconds."""
        from ledgerweb_client.mcp_gateway.upstream import result_dict

        started = time.monotonic()
        client = self._session(upstream, timeout)

        async def call_tool() -> Any:
            with anyio_fail_after(max(0.1, timeout - (time.monotonic() - started))):
                return await client.call_tool(tool, arguments)

        try:
            result = self._portal_now().call(call_tool)
        except BaseException:
            self._drop(upstream.name)  # the next lookup opens a fresh session
            raise
        return result_dict(result)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def close(self) -> None:
        with self._lock:
            for name in list(self._sessions):
                self._drop(name)
            portal_cm = self._portal_cm
            self._portal = self._portal_cm = None
        if portal_cm is not None:
            portal_cm.__exit__(None, None, None)


def anyio_fail_after(timeout: float) -> Any:
    import anyio

    return anyio.fail_after(timeout)


# Lookups of this process share one pool (closed by McpAdapter.close_shared).
SESSIONS = _SessionPool()


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _error_text(result: dict[str, Any]) -> str:
    texts = [b.get("text", "") for b in result.get("content", []) if b.get("type") == "text"]
    return ("upstream tool error: " + " ".join(texts))[:300]


class McpAdapter(base.Adapter):
    """Looks effects up (and resends) through the gateway's upstream MCP servers."""

    def __init__(self, tool: Any) -> None:
        super().__init__(tool)
        self._loaded: tuple[GatewayConfig, ToolConfig] | None = None

    def _gateway_tool(self) -> tuple[GatewayConfig, ToolConfig]:
        """The gateway configuration and this tool's entry; ``ConfigError`` naming what is
        missing."""
        if self._loaded is None:
            path = settings.LEDGER.get("MCP_GATEWAY_CONFIG", "")
            if not path:
                raise ConfigError(
                    "LEDGERWEB_MCP_GATEWAY_CONFIG is not set: the mcp adapter needs the "
                    "gateway's configuration file"
                )
            config = load_config(Path(path))
            entry = config.tool_for_ledger_tool(self.tool.name)
            if entry is None:
                raise ConfigError(
                    f"{path}: no [tools.*] entry has ledger_tool = {self.tool.name!r}"
                )
            self._loaded = (config, entry)
        return self._loaded

    @classmethod
    def close_shared(cls) -> None:
        """Close the pooled lookup sessions (the reconcile worker stops)."""
        SESSIONS.close()

    @property
    def provider_key(self) -> str:
        """The upstream MCP server: tools it serves share its bulkhead."""
        try:
            return f"mcp:{self._gateway_tool()[1].upstream}"
        except ConfigError:
            return super().provider_key

    def check(self) -> list[str]:
        problems = []
        if importlib.util.find_spec("mcp") is None:
            problems.append("the mcp package is not installed (pip install 'ledgerweb[mcp]')")
        try:
            _, entry = self._gateway_tool()
        except ConfigError as exc:
            return [*problems, str(exc)]
        if self.can_look_up and not entry.lookup_tool:
            problems.append(
                f"[tools.{entry.name}] has no lookup_tool: recovery cannot look this tool up"
            )
        if self.tool.timeout_seconds <= 0:
            problems.append("timeout_seconds must be positive")
        return problems

    def _call_upstream(
        self, entry_config: tuple[GatewayConfig, ToolConfig], tool: str, arguments: Any, meta: Any
    ) -> dict[str, Any]:
        import anyio

        from ledgerweb_client.mcp_gateway.upstream import call_tool_once

        config, entry = entry_config
        upstream = config.upstreams[entry.upstream]
        return anyio.run(
            lambda: call_tool_once(upstream, tool, arguments, timeout=self.timeout, meta=meta)
        )

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        started = time.monotonic()
        try:
            loaded = self._gateway_tool()
            entry = loaded[1]
            if not entry.lookup_tool:
                return base.LookupAnswer(
                    base.LookupStatus.UNAVAILABLE, detail="no lookup_tool configured"
                )
            arguments = entry.lookup_arguments(
                {
                    "tenant": call.tenant,
                    "tool": call.tool_name,
                    "key": call.idempotency_key,
                    "attempt_id": call.attempt_id,
                    "args_hash": call.args_hash,
                },
                call.args,
            )
        except (ConfigError, ValueError) as exc:
            return base.LookupAnswer(base.LookupStatus.UNAVAILABLE, detail=str(exc)[:300])
        try:
            config, _ = loaded
            result = SESSIONS.call(
                config.upstreams[entry.upstream], entry.lookup_tool, arguments, timeout=self.timeout
            )
        except Exception as exc:  # the SDK's errors, timeouts, a dead upstream: all unavailable
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE,
                detail=f"{type(exc).__name__}: {exc}"[:300],
                latency_ms=_elapsed_ms(started),
            )
        latency = _elapsed_ms(started)
        if result.get("isError"):
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE, detail=_error_text(result), latency_ms=latency
            )
        answer = structured_or_json_text(result)
        if not isinstance(answer, dict) or not isinstance(answer.get("found"), bool):
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                detail="the lookup tool's answer has no boolean 'found'",
                latency_ms=latency,
            )
        if not answer["found"]:
            return base.LookupAnswer(base.LookupStatus.NOT_FOUND, latency_ms=latency)
        provider_id = answer.get("id")
        args_hash = answer.get("args_hash")
        try:
            if not isinstance(args_hash, str) and isinstance(answer.get("args"), dict):
                args_hash = normalize_args(answer["args"], max_bytes=10**9).args_hash
        except InvalidArguments as exc:
            args_hash = None
            detail = f"the found args cannot be hashed: {exc}"
        else:
            detail = "found without a string 'id' and 'args' (or 'args_hash')"
        if not isinstance(provider_id, str) or not provider_id or not isinstance(args_hash, str):
            return base.LookupAnswer(base.LookupStatus.AMBIGUOUS, detail=detail, latency_ms=latency)
        count = answer.get("count", 1)
        kept = answer.get("result", answer)
        return base.LookupAnswer(
            base.LookupStatus.FOUND,
            provider_request_id=provider_id,
            args_hash=args_hash.lower(),
            count=count if isinstance(count, int) and count >= 1 else 1,
            result_ref=result_ref_for({"structuredContent": kept}, entry.receipt_fields),
            latency_ms=latency,
        )

    def send(self, call: base.Call) -> base.SendAnswer:
        from ledgerweb_client.mcp_gateway.upstream import NotSent

        started = time.monotonic()
        try:
            loaded = self._gateway_tool()
        except ConfigError as exc:
            return base.SendAnswer(base.SendStatus.REFUSED, retryable=True, detail=str(exc)[:300])
        entry = loaded[1]
        meta = {META_KEY: call.idempotency_key, META_ATTEMPT: call.attempt_id}
        try:
            result = self._call_upstream(loaded, entry.name, dict(call.args), meta)
        except NotSent as exc:
            # The connection was never made: nothing can have happened.
            return base.SendAnswer(
                base.SendStatus.REFUSED, retryable=True, detail=f"not sent: {exc}"[:300]
            )
        except Exception as exc:
            return base.SendAnswer(
                base.SendStatus.UNCERTAIN,
                detail=f"{type(exc).__name__}: {exc}"[:300],
                latency_ms=_elapsed_ms(started),
            )
        latency = _elapsed_ms(started)
        if result.get("isError"):
            if entry.error_result == "unknown":
                return base.SendAnswer(
                    base.SendStatus.UNCERTAIN, detail=_error_text(result), latency_ms=latency
                )
            return base.SendAnswer(
                base.SendStatus.REFUSED,
                retryable=entry.error_result == "retryable",
                detail=_error_text(result),
                latency_ms=latency,
            )
        provider_id = ""
        if entry.request_id:
            found = structured_or_json_text(result)
            value = found.get(entry.request_id) if isinstance(found, dict) else None
            provider_id = str(value) if value not in (None, "") else ""
        return base.SendAnswer(
            base.SendStatus.ACCEPTED, provider_request_id=provider_id, latency_ms=latency
        )
