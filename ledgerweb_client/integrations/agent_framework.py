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

import asyncio
import functools
import inspect
import json
import typing
from collections.abc import Callable, Sequence
from typing import Any

from agent_framework import Content, FunctionTool, tool

from ..client import State
from ..errors import LedgerError
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
from .decorator import bound_arguments, by_keyword

__all__ = ["ledger_approvals", "ledgered_tool"]


def _replay(recorded: Recorded) -> Any:
    return recorded.value(default=str(recorded))


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
        keywords = by_keyword(signature)
        is_async = inspect.iscoroutinefunction(fn)

        async def call(fn_args: dict[str, Any]) -> Any:
            if is_async:
                return await fn(**fn_args)
            return await asyncio.to_thread(functools.partial(fn, **fn_args))

        async def guarded(**kwargs: Any) -> Any:
            args = bound_arguments(signature, (), kwargs)
            try:
                return await spec.arun(
                    ledger or current_ledger(),
                    args,
                    lambda: call(kwargs),
                    _replay,
                    send_args=call if keywords else None,
                )
            except ToolCallError as refused:
                return f"ledgerweb {refused.code}: {refused.message}"

        functools.update_wrapper(guarded, fn, updated=())
        del guarded.__wrapped__  # type: ignore[attr-defined]  # the schema: the signature below
        guarded.__signature__ = signature  # type: ignore[attr-defined]
        guarded.__annotations__ = dict(hints)
        made: FunctionTool = tool(
            guarded, name=shown, description=description, approval_mode="always_require"
        )
        made.ledger_spec = spec  # type: ignore[attr-defined]
        made.ledger_signature = signature  # type: ignore[attr-defined]
        made.ledger_context = ledger  # type: ignore[attr-defined]
        return made

    return decorate(fn) if fn is not None else decorate


def _arguments(call: Any) -> dict[str, Any]:
    raw = getattr(call, "arguments", None) or {}
    parsed = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(parsed, dict):
        raise ValueError("the call's arguments are not an object")
    return dict(parsed)


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
        spec: ToolSpec = found.ledger_spec
        context = ledger or found.ledger_context or current_ledger()
        try:
            args = bound_arguments(found.ledger_signature, (), _arguments(call))
            record = functools.partial(
                context.client.record_and_wait,
                tenant=context.tenant,
                task_id=context.task_id,
                tool_name=spec.tool_name,
                idempotency_key=spec.key_for(args, context),
                args=args,
                policy_version=context.policy_version,
                credential_scope=context.credential_scope,
                wait_for_approval=wait,
            )
            attempt = await asyncio.to_thread(record)
        except (ValueError, TypeError, ToolCallError, LedgerError):
            # The tool refuses such a call itself when it runs, and says why.
            answers.append(request.to_function_approval_response(approved=True))
            continue
        if attempt.state == State.AWAITING_APPROVAL:
            pending.append(request)
        elif attempt.state == State.FAILED and attempt.raw.get("review_reason") in (
            "approval_rejected",
            "approval_expired",
        ):
            answers.append(request.to_function_approval_response(approved=False))
        else:
            answers.append(request.to_function_approval_response(approved=True))
    return answers, pending
