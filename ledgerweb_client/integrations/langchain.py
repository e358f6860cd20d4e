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

A call an approval policy holds (AWAITING_APPROVAL) becomes LangGraph's ``interrupt()`` inside the
tool node, carrying ``ToolCallAwaitingApproval.approval_request`` (attempt id, tool, arguments and
their digest, the dashboard link): the graph stops and its checkpointer keeps it. Once a person
has decided on the ledger, resume with ``Command(resume=...)``: the tool runs again under the
same idempotency key, so it continues the same attempt (claimed and sent once approved; a
``LedgerToolException`` with code ``approval_rejected`` when rejected; interrupted again while
still held). The resume value never approves anything, the ledger decides; a number, or
``{"wait": seconds}``, long-polls the ledger that long first. Outside a graph (no checkpointer)
a held call is a ``LedgerToolException`` with code ``awaiting_approval``.
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
    ToolCallAwaitingApproval,
    ToolCallError,
    ToolSpec,
    current_ledger,
)
from .decorator import bound_arguments, by_keyword

__all__ = [
    "LedgerToolException",
    "context_from_config",
    "guard_tool",
    "ledgered_tool",
    "pause_for_approval",
]


class LedgerToolException(ToolException):
    """The ledger refused the call or could not settle it; ``error`` is the ``ToolCallError``
    (its ``code``: idempotency_conflict, not_granted, not_dispatchable, outcome_unknown...)."""

    def __init__(self, error: ToolCallError) -> None:
        super().__init__(error.for_model)
        self.error = error
        self.code = error.code


def context_from_config(config: RunnableConfig | None) -> LedgerContext:
    """The ``LedgerContext`` under ``configurable["ledger"]``, else the ``use_ledger`` one."""
    configurable = (config or {}).get("configurable") or {}
    context = configurable.get("ledger")
    if isinstance(context, LedgerContext):
        return context
    return current_ledger()


def _resume_wait(value: Any) -> float:
    """Seconds to long-poll the ledger after a resume: ``Command(resume=5)`` or
    ``Command(resume={"wait": 5})``; anything else, none."""
    if isinstance(value, dict):
        value = value.get("wait")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return min(float(value), 300.0)
    return 0.0


def pause_for_approval(held: ToolCallAwaitingApproval) -> float:
    """Interrupt the graph for a held call (``interrupt(held.approval_request)``); on resume,
    the seconds to wait for the ledger before trying again. Outside a LangGraph run that can
    pause (no checkpointer), or without LangGraph installed (the ``langchain`` extra alone), the
    held call is a ``LedgerToolException``."""
    try:
        from langgraph.errors import GraphBubbleUp
        from langgraph.types import interrupt
    except ImportError as exc:  # LangChain without LangGraph: nothing can pause the run
        raise LedgerToolException(held) from exc
    try:
        return _resume_wait(interrupt(held.approval_request))
    except GraphBubbleUp:
        raise  # the pause itself: LangGraph stops the graph here
    except (RuntimeError, KeyError, ValueError) as exc:
        # interrupt() outside a graph run, or in a graph without a checkpointer.
        raise LedgerToolException(held) from exc


def _wait_or_raise(exc: ToolCallError) -> float:
    """After a pass that ended in ``exc``: for a held call, the graph pauses and the seconds to
    wait on resume are returned; any other refusal is the framework's ``LedgerToolException``."""
    if isinstance(exc, ToolCallAwaitingApproval):
        return pause_for_approval(exc)
    raise LedgerToolException(exc) from exc


def _guarded_tool(
    *,
    spec: ToolSpec,
    template: BaseTool,
    signature: inspect.Signature | None,
    send: Callable[[dict[str, Any], RunnableConfig], Any] | None,
    asend: Callable[[dict[str, Any], RunnableConfig], Any] | None,
    handle_tool_error: bool | str | Callable[[ToolException], str],
    corrected: bool = True,
) -> StructuredTool:
    def call_args(kwargs: dict[str, Any]) -> dict[str, Any]:
        return bound_arguments(signature, (), kwargs) if signature is not None else dict(kwargs)

    def guarded(
        run_spec: Callable[..., Any],
        sender: Callable[[dict[str, Any], RunnableConfig], Any],
        config: RunnableConfig,
        kwargs: dict[str, Any],
        wait: float | None,
    ) -> Any:
        """One pass of the guarded call (``spec.run`` or ``spec.arun``) through ``sender``."""
        return run_spec(
            context_from_config(config),
            call_args(kwargs),
            lambda: sender(kwargs, config),
            Recorded.value_or_text,
            send_args=(lambda args: sender(args, config)) if corrected else None,
            wait_for_approval=wait,
        )

    # Each pass that finds the call still held pauses the graph again (the next interrupt).
    def run(config: RunnableConfig, **kwargs: Any) -> Any:
        assert send is not None
        wait: float | None = None
        while True:
            try:
                return guarded(spec.run, send, config, kwargs, wait)
            except ToolCallError as exc:
                wait = _wait_or_raise(exc)

    async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
        assert asend is not None
        wait: float | None = None
        while True:
            try:
                return await guarded(spec.arun, asend, config, kwargs, wait)
            except ToolCallError as exc:
                wait = _wait_or_raise(exc)

    return StructuredTool(
        name=template.name,
        description=template.description,
        # A tool without a schema of its own: the one its _run's signature gives.
        args_schema=template.args_schema
        if template.args_schema is not None
        else template.get_input_schema(),
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
    wait_for_approval: float = 0,
) -> Callable[[Callable[..., Any]], StructuredTool]:
    """Make a ``StructuredTool`` from a function, like ``@tool``, with every call guarded.

    ``tool_name`` is the ledger's name for the tool (default: the tool's name); ``key``,
    ``receipt`` and ``request_id`` are described on ``ledgerweb_client.guard.ToolSpec``;
    ``wait_for_approval``: seconds a held call long-polls before it interrupts the graph.
    """

    def decorate(fn: Callable[..., Any]) -> StructuredTool:
        template = StructuredTool.from_function(fn, name=name, description=description)
        spec = ToolSpec(tool_name or template.name, key, receipt, request_id, wait_for_approval)
        is_async = inspect.iscoroutinefunction(fn)
        return _guarded_tool(
            spec=spec,
            template=template,
            signature=inspect.signature(fn),
            send=None if is_async else (lambda kwargs, config: fn(**kwargs)),
            asend=(lambda kwargs, config: fn(**kwargs)) if is_async else None,
            handle_tool_error=handle_tool_error,
            corrected=by_keyword(inspect.signature(fn)),
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
    wait_for_approval: float = 0,
) -> StructuredTool:
    """Wrap an existing tool: same name, description and arguments, every call guarded.

    The wrapped tool's own errors reach the guard (its ``handle_tool_error`` is switched off
    inside), so a failure after the send is recorded as UNKNOWN rather than returned as if the
    call had worked.
    """
    inner = tool.model_copy(update={"handle_tool_error": False, "handle_validation_error": False})
    spec = ToolSpec(tool_name or tool.name, key, receipt, request_id, wait_for_approval)
    return _guarded_tool(
        spec=spec,
        template=tool,
        signature=None,
        send=lambda kwargs, config: inner.invoke(kwargs, config=config),
        asend=lambda kwargs, config: inner.ainvoke(kwargs, config=config),
        handle_tool_error=handle_tool_error,
    )
