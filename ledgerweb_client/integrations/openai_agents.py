"""OpenAI Agents SDK function tools whose calls go through the ledger (extra ``openai-agents``).

``@ledgered_function_tool(key=..., ...)`` is ``agents.function_tool`` with every call guarded.
The tenant and task come from the run's context object (``Runner.run(agent, input,
context=LedgerContext(...))``, or any context with a ``ledger`` attribute holding one), or else
from ``use_ledger``. The ledger's refusals are tool failures: the tool's
``failure_error_function`` (by default ``ledger_error_function``) turns them into the message the
model receives, ``"ledgerweb idempotency_conflict: ..."``; pass ``failure_error_function=None``
to have them raise out of the run instead.

Approval before dispatch: the tool's ``needs_approval`` asks the ledger. It records the intent
(the same one the tool records when it runs: same key) and answers True while an approval policy
holds it (AWAITING_APPROVAL), so the run stops with the SDK's own tool-approval interruption
(``result.interruptions``). ``apply_ledger_decisions(state)`` then maps the ledger's decision onto
the ``RunState``: approved on the ledger (INTENT_RECORDED, or a linked attempt after
edit-and-approve) is ``state.approve(item)``, and the resumed run sends it once; rejected or
expired is ``state.reject(item)`` with the ledger's reason as the tool's output; still held stays
pending (save ``state.to_string()`` and try later: the key is stable across restarts). Approving
in the SDK alone never sends a held call: the tool would find it still held and refuse.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, function_tool
from agents.items import ToolApprovalItem
from agents.tool import default_tool_error_function

from ..guard import (
    KeySource,
    LedgerContext,
    Receipt,
    Recorded,
    RequestId,
    ToolCallError,
    ToolSpec,
    ledger_decision,
    ledger_in,
)
from .decorator import bound_arguments, by_keyword, shown_as

__all__ = [
    "apply_ledger_decisions",
    "ledger_error_function",
    "ledger_from_run_context",
    "ledgered_function_tool",
]

_CONTEXT_PARAM = "_ledgerweb_run_context"


def ledger_from_run_context(run_context: RunContextWrapper[Any] | None) -> LedgerContext:
    """The run context's ``LedgerContext`` (the context itself, or its ``ledger`` attribute),
    else the ``use_ledger`` one."""
    return ledger_in(getattr(run_context, "context", None))


def ledger_error_function(context: RunContextWrapper[Any], error: Exception) -> str:
    """The model-visible message for a failed tool call: the ledger's refusal with its code, or
    the SDK's default message for any other error."""
    if isinstance(error, ToolCallError):
        return error.for_model
    return default_tool_error_function(context, error)


def _takes_run_context(fn: Callable[..., Any], hints: dict[str, Any]) -> bool:
    params = list(inspect.signature(fn).parameters)
    if not params:
        return False
    first = hints.get(params[0])
    origin = typing.get_origin(first) or first
    return isinstance(origin, type) and issubclass(origin, RunContextWrapper)


def ledgered_function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    failure_error_function: Callable[[RunContextWrapper[Any], Exception], str]
    | None = ledger_error_function,
    ledger_approval: bool = True,
    **function_tool_options: Any,
) -> Any:
    """``agents.function_tool`` for a function with a side effect; every call is guarded.

    ``tool_name`` is the ledger's name for the tool (default: the tool's name); ``key``,
    ``receipt`` and ``request_id`` are described on ``ledgerweb_client.guard.ToolSpec``. Other
    keyword arguments (``name_override``, ``description_override``, ``strict_mode``...) go to
    ``function_tool``. The tool always receives the run context, whether or not ``fn`` asks for
    it, so the tenant and task can come from there.

    ``ledger_approval`` (default True): the tool's ``needs_approval`` asks the ledger whether an
    approval policy holds the call (see the module's docstring); pass ``needs_approval=``
    yourself to decide otherwise.
    """

    def decorate(fn: Callable[..., Any]) -> FunctionTool:
        hints = typing.get_type_hints(fn)
        own_context = _takes_run_context(fn, hints)
        signature = inspect.signature(fn)
        name = function_tool_options.get("name_override") or fn.__name__
        spec = ToolSpec(tool_name or name, key, receipt, request_id)
        skip = 1 if own_context else 0
        plain = signature.replace(parameters=list(signature.parameters.values())[skip:])

        def recorded_args(params: dict[str, Any]) -> dict[str, Any]:
            return bound_arguments(plain, (), params)

        options = dict(function_tool_options)
        if ledger_approval and "needs_approval" not in options:
            options["needs_approval"] = _needs_approval(spec, recorded_args)
        tool = function_tool(
            _guarded(fn, spec, signature, hints, own_context),
            failure_error_function=failure_error_function,
            **options,
        )
        tool.ledger_spec = spec  # type: ignore[attr-defined]
        tool.ledger_args = recorded_args  # type: ignore[attr-defined]
        return tool

    return decorate(fn) if fn is not None else decorate


def _guarded(
    fn: Callable[..., Any],
    spec: ToolSpec,
    signature: inspect.Signature,
    hints: dict[str, Any],
    own_context: bool,
) -> Callable[..., Any]:
    """``fn`` with every call through the ledger, shown to the SDK with the run context as its
    first parameter (``fn``'s own, or one added for the guard)."""
    skip = 1 if own_context else 0
    keywords = by_keyword(signature, skip=skip)

    def split(args: tuple[Any, ...]) -> tuple[RunContextWrapper[Any], tuple[Any, ...]]:
        # Without a context parameter of its own, fn gets its arguments after ours.
        return args[0], (args if own_context else args[1:])

    def corrected_call(run_context: RunContextWrapper[Any]) -> Any:
        """fn called with a linked attempt's corrected arguments (edit-and-approve)."""
        if not keywords:
            return None
        prefix = (run_context,) if own_context else ()
        return lambda args: fn(*prefix, **args)

    async def guarded_async(*args: Any, **kwargs: Any) -> Any:
        run_context, fn_args = split(args)
        call_args = bound_arguments(signature, fn_args, kwargs, skip=skip)
        return await spec.arun(
            ledger_from_run_context(run_context),
            call_args,
            lambda: fn(*fn_args, **kwargs),
            Recorded.value_or_text,
            send_args=corrected_call(run_context),
        )

    def guarded_sync(*args: Any, **kwargs: Any) -> Any:
        run_context, fn_args = split(args)
        call_args = bound_arguments(signature, fn_args, kwargs, skip=skip)
        return spec.run(
            ledger_from_run_context(run_context),
            call_args,
            lambda: fn(*fn_args, **kwargs),
            Recorded.value_or_text,
            send_args=corrected_call(run_context),
        )

    guarded: Callable[..., Any] = guarded_async if inspect.iscoroutinefunction(fn) else guarded_sync
    if own_context:
        shown_as(guarded, fn, signature, hints)
    else:
        context_param = inspect.Parameter(
            _CONTEXT_PARAM, inspect.Parameter.POSITIONAL_ONLY, annotation=RunContextWrapper[Any]
        )
        shown_as(
            guarded,
            fn,
            signature.replace(parameters=[context_param, *signature.parameters.values()]),
            {_CONTEXT_PARAM: RunContextWrapper[Any], **hints},
        )
    return guarded


def _needs_approval(
    spec: ToolSpec, recorded_args: Callable[[dict[str, Any]], dict[str, Any]]
) -> Callable[..., Any]:
    async def needs_approval(
        run_context: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        """Whether an approval policy holds this call now (its intent recorded: the tool
        records the same one); a refusal of the ledger is left for the tool to report."""
        decision = await ledger_decision(
            spec,
            ledger_from_run_context(run_context),
            functools.partial(recorded_args, params),
        )
        return decision.outcome == "pending"

    return needs_approval


def _arguments(tool: FunctionTool, item: ToolApprovalItem) -> dict[str, Any]:
    """The arguments the ledgered ``tool`` records for the interrupted call ``item``."""
    params = json.loads(getattr(item.raw_item, "arguments", "") or "{}")
    args: dict[str, Any] = tool.ledger_args(params)  # type: ignore[attr-defined]
    return args


def _ledgered_tool(item: ToolApprovalItem) -> FunctionTool | None:
    name = item.tool_name or getattr(item.raw_item, "name", None)
    for tool in getattr(item.agent, "tools", ()):
        if isinstance(tool, FunctionTool) and tool.name == name and hasattr(tool, "ledger_spec"):
            return tool
    return None


async def apply_ledger_decisions(
    state: RunState[Any, Any],
    *,
    ledger: LedgerContext | None = None,
    wait: float = 0,
) -> list[ToolApprovalItem]:
    """Map the ledger's decisions onto the run's pending tool approvals; returns those still
    pending (held on the ledger after ``wait`` seconds of long-polling, or not ledgered tools').

    For each interruption of a ledgered tool: approved on the ledger (or followed to a linked
    attempt that is) -> ``state.approve(item)``; rejected or expired -> ``state.reject(item)``,
    with the ledger's reason as the tool's output for the model; not held at all (the SDK asked
    for approval for its own reasons, e.g. arguments it could not inspect) -> approved, since
    the ledger's policy is the rule. ``ledger`` defaults to the run context's."""
    pending: list[ToolApprovalItem] = []
    run_context = getattr(state, "_context", None)
    for item in state.get_interruptions():
        tool = _ledgered_tool(item)
        if tool is None:
            pending.append(item)
            continue
        decision = await ledger_decision(
            tool.ledger_spec,  # type: ignore[attr-defined]
            ledger or ledger_from_run_context(run_context),
            functools.partial(_arguments, tool, item),
            wait=wait,
        )
        if decision.outcome == "pending":
            pending.append(item)
        elif decision.outcome == "rejected":
            state.reject(item, rejection_message=decision.for_model)
        else:
            state.approve(item)
    return pending
