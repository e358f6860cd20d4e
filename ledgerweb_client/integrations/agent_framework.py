"""Microsoft Agent Framework tools whose calls go through the ledger (extra ``agent-framework``).

``ledgered_tool(fn, key=..., ...)`` is ``agent_framework.tool(fn, approval_mode=
"always_require")`` with every call recorded, claimed, sent and confirmed through the ledger
(``ledgerweb_client.guard``); the tenant and task come from ``ledger=`` or from the
``use_ledger`` block around ``agent.run``. The ledger's refusals are the tool's answer to the
model: ``"ledgerweb idempotency_conflict: ..."``.

Approval is the framework's own: every call of a ledgered tool ends the run with a
``function_approval_request`` (``result.user_input_requests``), and the ledger decides it.
``ledger_approvals(requests, tools=[...])`` records each call's intent (the same one the tool
records when it runs: same key) and answers with the framework's
``function_approval_response`` contents: approved when no policy holds the call, or when people
approved it on the ledger (or a linked attempt after edit-and-approve, whose corrected arguments
the tool then sends, never the original); rejected when the ledger's approvers rejected it or
it expired, which the agent receives as the framework's rejection of the call; still held
calls are returned as pending (keep ``session.to_dict()`` and the requests' ``to_dict()``, and
ask again later: the key is stable across restarts). Send the responses back with
``agent.run(Message(role="user", contents=responses), session=session)``. Approving in the
framework alone never sends a held call: the tool finds it still held and answers
``ledgerweb awaiting_approval``.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable, Sequence
from typing import Any

from agent_framework import Content, FunctionTool, tool

from ..guard import (
    KeySource,
    LedgerContext,
    Receipt,
    RequestId,
    ToolCallError,
    ToolSpec,
    current_ledger,
    ledger_decision,
)
from .decorator import bound_arguments, keyword_call, shown_as

__all__ = ["ledger_approvals", "ledgered_tool"]


def ledgered_tool(
    fn: Callable[..., Any] | None = None,
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    name: str | None = None,
    description: str | None = None,
    ledger: LedgerContext | None = None,
) -> Any:
    """A ``FunctionTool`` for ``fn`` (sync or async) whose approval the ledger decides.
    ``tool_name`` is the ledger's name for the tool (default: the tool's name, ``name`` or
    ``fn.__name__``); ``key``, ``receipt`` and ``request_id`` are described on
    ``ledgerweb_client.guard.ToolSpec``; ``ledger`` defaults to the ``use_ledger`` context."""

    def decorate(fn: Callable[..., Any]) -> FunctionTool:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        shown = name or fn.__name__
        spec = ToolSpec(tool_name or shown, key, receipt, request_id)
        call = keyword_call(spec, fn, signature)

        async def guarded(**kwargs: Any) -> Any:
            try:
                return await call(kwargs, lambda: ledger or current_ledger())
            except ToolCallError as refused:
                return refused.for_model

        shown_as(guarded, fn, signature, dict(hints))
        made: FunctionTool = tool(
            guarded, name=shown, description=description, approval_mode="always_require"
        )
        made.ledger_spec = spec  # type: ignore[attr-defined]
        made.ledger_signature = signature  # type: ignore[attr-defined]
        made.ledger_context = ledger  # type: ignore[attr-defined]
        return made

    return decorate(fn) if fn is not None else decorate


def _arguments(tool: Any, call: Any) -> dict[str, Any]:
    """The arguments the ledgered ``tool`` records for the framework's function ``call``."""
    raw = getattr(call, "arguments", None) or {}
    parsed = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(parsed, dict):
        raise ValueError("the call's arguments are not an object")
    return bound_arguments(tool.ledger_signature, (), dict(parsed))


async def ledger_approvals(
    requests: Sequence[Content],
    *,
    tools: Sequence[Any],
    ledger: LedgerContext | None = None,
    wait: float = 0,
) -> tuple[list[Content], list[Content]]:
    """(the ledger's answers as ``function_approval_response`` contents, the requests still
    held after ``wait`` seconds of long-polling or not the ledger's to decide). ``tools``: the
    agent's tools (the ledgered ones are found by name); ``ledger`` defaults to the tool's own
    context, else the ``use_ledger`` one."""
    ledgered = {t.name: t for t in tools if hasattr(t, "ledger_spec")}
    answers: list[Content] = []
    pending: list[Content] = []
    for request in requests:
        call = getattr(request, "function_call", None)
        found = ledgered.get(getattr(call, "name", None) or "")
        if request.type != "function_approval_request" or found is None:
            pending.append(request)
            continue
        decision = await ledger_decision(
            found.ledger_spec,
            ledger or found.ledger_context or current_ledger(),
            functools.partial(_arguments, found, call),
            wait=wait,
        )
        if decision.outcome == "pending":
            pending.append(request)
        else:
            approved = decision.outcome == "approved"
            answers.append(request.to_function_approval_response(approved=approved))
    return answers, pending
