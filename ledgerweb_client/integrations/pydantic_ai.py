"""Pydantic AI tools whose calls go through the ledger (extra ``pydantic-ai``).

``ledgered_tool(fn, key=..., ...)`` is a ``pydantic_ai.Tool`` whose every call is recorded,
claimed, sent and confirmed through the ledger (``ledgerweb_client.guard``). The tenant and task
come from the run's dependencies (``agent.run(..., deps=LedgerContext(...))``, or deps with a
``ledger`` attribute holding one), or else from ``use_ledger``. The ledger's refusals are the
tool's answer to the model: ``"ledgerweb idempotency_conflict: ..."``.

Approval before dispatch is Pydantic AI's deferred tools: a call an approval policy holds raises
``ApprovalRequired`` with the ledger's ``approval_request`` as its metadata, so a run whose
``output_type`` includes ``DeferredToolRequests`` ends with them. ``ledger_decisions(requests)``
asks the ledger what people decided and answers with ``DeferredToolResults``: approved on the
ledger (or a linked attempt after edit-and-approve) is ``ToolApproved()``, and the resumed run
(``agent.run(message_history=..., deferred_tool_results=...)``) sends it once, the corrected
arguments after an edit; rejected or expired is ``ToolDenied`` with the ledger's reason for the
model; still held stays out of the results (store the messages and the requests, and try again
later: the key is stable across restarts). Approving in Pydantic AI alone never sends a held
call: the tool finds it still held and answers ``ledgerweb awaiting_approval``.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic_ai import ApprovalRequired, RunContext, Tool
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from ..errors import LedgerError
from ..guard import (
    ApprovalDecision,
    KeySource,
    LedgerContext,
    Receipt,
    RequestId,
    ToolCallAwaitingApproval,
    ToolCallError,
    ToolSpec,
    current_ledger,
    ledger_in,
)
from .decorator import keyword_call, shown_as

__all__ = ["ledger_decisions", "ledger_from_run_context", "ledgered_tool"]

APPROVAL_KIND = "ledgerweb.approval"


def ledger_from_run_context(ctx: RunContext[Any] | None) -> LedgerContext:
    """The run's ``LedgerContext`` (its deps, or their ``ledger`` attribute), else the
    ``use_ledger`` one."""
    return ledger_in(getattr(ctx, "deps", None))


def ledgered_tool(
    fn: Callable[..., Any] | None = None,
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    name: str | None = None,
    description: str | None = None,
    wait_for_approval: float = 0,
) -> Any:
    """A ``pydantic_ai.Tool`` for ``fn`` (sync or async, without a ``RunContext`` parameter),
    every call guarded. ``tool_name`` is the ledger's name for the tool (default: the tool's
    name, ``name`` or ``fn.__name__``); ``key``, ``receipt`` and ``request_id`` are described on
    ``ledgerweb_client.guard.ToolSpec``. ``wait_for_approval``: seconds a held call long-polls
    the ledger before it is deferred."""

    def decorate(fn: Callable[..., Any]) -> Tool[Any]:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        shown = name or fn.__name__
        spec = ToolSpec(tool_name or shown, key, receipt, request_id, wait_for_approval)
        call = keyword_call(spec, fn, signature)

        async def guarded(ctx: RunContext[Any], **kwargs: Any) -> Any:
            try:
                return await call(kwargs, lambda: ledger_from_run_context(ctx))
            except ToolCallAwaitingApproval as held:
                if not ctx.tool_call_approved:
                    raise ApprovalRequired(metadata=held.approval_request) from held
                return held.for_model
            except ToolCallError as refused:
                return refused.for_model

        context = inspect.Parameter(
            "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunContext[Any]
        )
        shown_as(
            guarded,
            fn,
            signature.replace(parameters=[context, *signature.parameters.values()]),
            {"ctx": RunContext[Any], **hints},
        )
        tool = Tool(guarded, takes_ctx=True, name=shown, description=description)
        tool.ledger_spec = spec  # type: ignore[attr-defined]
        return tool

    return decorate(fn) if fn is not None else decorate


async def ledger_decisions(
    requests: DeferredToolRequests,
    *,
    ledger: LedgerContext | None = None,
    wait: float = 0,
) -> tuple[DeferredToolResults, list[ToolCallPart]]:
    """The ledger's decisions on the run's held calls, as Pydantic AI's ``DeferredToolResults``,
    and the calls still pending (held after ``wait`` seconds of long-polling, or not the
    ledger's to decide). Approved on the ledger, or a linked attempt after edit-and-approve that
    is: ``ToolApproved()`` (the tool then sends the corrected arguments, never the original);
    rejected or expired: ``ToolDenied`` with the ledger's reason. ``ledger`` defaults to the
    ``use_ledger`` context (its client asks; the attempt is found by its id)."""
    results = DeferredToolResults()
    pending: list[ToolCallPart] = []
    for part in requests.approvals:
        held = requests.metadata.get(part.tool_call_id) or {}
        if held.get("kind") != APPROVAL_KIND or not held.get("attempt_id"):
            pending.append(part)
            continue
        context = ledger or current_ledger()
        try:
            attempt = await asyncio.to_thread(
                context.client.wait_for_approval, str(held["attempt_id"]), wait
            )
        except LedgerError:
            pending.append(part)
            continue
        decision = ApprovalDecision.of(attempt)
        if decision.outcome == "pending":
            pending.append(part)
        elif decision.outcome == "rejected":
            results.approvals[part.tool_call_id] = ToolDenied(decision.for_model)
        else:
            results.approvals[part.tool_call_id] = ToolApproved()
    return results, pending
