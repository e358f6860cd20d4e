"""LangChain and LangGraph tools whose calls go through the ledger (extra ``langchain``).

Two ways in, both giving an ordinary ``langchain_core`` ``StructuredTool`` that LangGraph's
``ToolNode`` and any agent runtime call as usual:

* ``@ledgered_tool(key=..., ...)`` on a function, instead of ``@tool``;
* ``guard_tool(existing_tool, key=..., ...)`` around a tool you already have (a toolkit's).

The tenant and task come from the run's config, ``config={"configurable": {"ledger":
LedgerContext(...)}}`` (LangGraph passes it down to each tool), or else from ``use_ledger``.
The ledger's refusals become ``LedgerToolException``, a ``ToolException``: with
``handle_tool_error=True`` (the default here) the model receives the refusal as the tool's error
message (a ``ToolMessage`` with ``status="error"``), exactly like any other tool failure.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from ..guard import (
    KeySource,
    LedgerContext,
    Receipt,
    Recorded,
    RequestId,
    ToolCallError,
    ToolSpec,
    current_ledger,
)
from .decorator import bound_arguments

__all__ = ["LedgerToolException", "context_from_config", "guard_tool", "ledgered_tool"]


class LedgerToolException(ToolException):
    """The ledger refused the call or could not settle it; ``error`` is the ``ToolCallError``
    (its ``code``: idempotency_conflict, not_granted, not_dispatchable, outcome_unknown...)."""

    def __init__(self, error: ToolCallError) -> None:
        super().__init__(f"ledgerweb {error.code}: {error.message}")
        self.error = error
        self.code = error.code


def context_from_config(config: RunnableConfig | None) -> LedgerContext:
    """The ``LedgerContext`` under ``configurable["ledger"]``, else the ``use_ledger`` one."""
    configurable = (config or {}).get("configurable") or {}
    context = configurable.get("ledger")
    if isinstance(context, LedgerContext):
        return context
    return current_ledger()


def _replay(recorded: Recorded) -> Any:
    return recorded.value(default=str(recorded))


def _guarded_tool(
    *,
    spec: ToolSpec,
    template: BaseTool,
    signature: inspect.Signature | None,
    send: Callable[[dict[str, Any], RunnableConfig], Any] | None,
    asend: Callable[[dict[str, Any], RunnableConfig], Any] | None,
    handle_tool_error: bool | str | Callable[[ToolException], str],
) -> StructuredTool:
    def call_args(kwargs: dict[str, Any]) -> dict[str, Any]:
        return bound_arguments(signature, (), kwargs) if signature is not None else dict(kwargs)

    def run(config: RunnableConfig, **kwargs: Any) -> Any:
        assert send is not None
        try:
            return spec.run(
                context_from_config(config),
                call_args(kwargs),
                lambda: send(kwargs, config),
                _replay,
            )
        except ToolCallError as exc:
            raise LedgerToolException(exc) from exc

    async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
        assert asend is not None
        try:
            return await spec.arun(
                context_from_config(config),
                call_args(kwargs),
                lambda: asend(kwargs, config),
                _replay,
            )
        except ToolCallError as exc:
            raise LedgerToolException(exc) from exc

    return StructuredTool(
        name=template.name,
        description=template.description,
        args_schema=template.args_schema,
        func=run if send is not None else None,
        coroutine=arun if asend is not None else None,
        return_direct=template.return_direct,
        handle_tool_error=handle_tool_error,
    )


def ledgered_tool(
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    name: str | None = None,
    description: str | None = None,
    handle_tool_error: bool | str | Callable[[ToolException], str] = True,
) -> Callable[[Callable[..., Any]], StructuredTool]:
    """Make a ``StructuredTool`` from a function, like ``@tool``, with every call guarded.

    ``tool_name`` is the ledger's name for the tool (default: the tool's name); ``key``,
    ``receipt`` and ``request_id`` are described on ``ledgerweb_client.guard.ToolSpec``.
    """

    def decorate(fn: Callable[..., Any]) -> StructuredTool:
        template = StructuredTool.from_function(fn, name=name, description=description)
        spec = ToolSpec(tool_name or template.name, key, receipt, request_id)
        is_async = inspect.iscoroutinefunction(fn)
        return _guarded_tool(
            spec=spec,
            template=template,
            signature=inspect.signature(fn),
            send=None if is_async else (lambda kwargs, config: fn(**kwargs)),
            asend=(lambda kwargs, config: fn(**kwargs)) if is_async else None,
            handle_tool_error=handle_tool_error,
        )

    return decorate


def guard_tool(
    tool: BaseTool,
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    handle_tool_error: bool | str | Callable[[ToolException], str] = True,
) -> StructuredTool:
    """Wrap an existing tool: same name, description and arguments, every call guarded.

    The wrapped tool's own errors reach the guard (its ``handle_tool_error`` is switched off
    inside), so a failure after the send is recorded as UNKNOWN rather than returned as if the
    call had worked.
    """
    inner = tool.model_copy(update={"handle_tool_error": False, "handle_validation_error": False})
    spec = ToolSpec(tool_name or tool.name, key, receipt, request_id)
    return _guarded_tool(
        spec=spec,
        template=tool,
        signature=None,
        send=lambda kwargs, config: inner.invoke(kwargs, config=config),
        asend=lambda kwargs, config: inner.ainvoke(kwargs, config=config),
        handle_tool_error=handle_tool_error,
    )
