"""OpenAI Agents SDK function tools whose calls go through the ledger (extra ``openai-agents``).

``@ledgered_function_tool(key=..., ...)`` is ``agents.function_tool`` with every call guarded.
The tenant and task come from the run's context object (``Runner.run(agent, input,
context=LedgerContext(...))``, or any context with a ``ledger`` attribute holding one), or else
from ``use_ledger``. The ledger's refusals are tool failures: the tool's
``failure_error_function`` (by default ``ledger_error_function``) turns them into the message the
model receives, ``"ledgerweb idempotency_conflict: ..."``; pass ``failure_error_function=None``
to have them raise out of the run instead.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool import default_tool_error_function

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

__all__ = ["ledger_error_function", "ledger_from_run_context", "ledgered_function_tool"]

_CONTEXT_PARAM = "_ledgerweb_run_context"


def ledger_from_run_context(run_context: RunContextWrapper[Any] | None) -> LedgerContext:
    """The run context's ``LedgerContext`` (the context itself, or its ``ledger`` attribute),
    else the ``use_ledger`` one."""
    candidate = getattr(run_context, "context", None)
    if isinstance(candidate, LedgerContext):
        return candidate
    nested = getattr(candidate, "ledger", None)
    if isinstance(nested, LedgerContext):
        return nested
    return current_ledger()


def ledger_error_function(context: RunContextWrapper[Any], error: Exception) -> str:
    """The model-visible message for a failed tool call: the ledger's refusal with its code, or
    the SDK's default message for any other error."""
    if isinstance(error, ToolCallError):
        return f"ledgerweb {error.code}: {error.message}"
    return default_tool_error_function(context, error)


def _takes_run_context(fn: Callable[..., Any], hints: dict[str, Any]) -> bool:
    params = list(inspect.signature(fn).parameters)
    if not params:
        return False
    first = hints.get(params[0])
    origin = typing.get_origin(first) or first
    return isinstance(origin, type) and issubclass(origin, RunContextWrapper)


def _replay(recorded: Recorded) -> Any:
    return recorded.value(default=str(recorded))


def ledgered_function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    failure_error_function: Callable[[RunContextWrapper[Any], Exception], str]
    | None = ledger_error_function,
    **function_tool_options: Any,
) -> Any:
    """``agents.function_tool`` for a function with a side effect; every call is guarded.

    ``tool_name`` is the ledger's name for the tool (default: the tool's name); ``key``,
    ``receipt`` and ``request_id`` are described on ``ledgerweb_client.guard.ToolSpec``. Other
    keyword arguments (``name_override``, ``description_override``, ``strict_mode``...) go to
    ``function_tool``. The tool always receives the run context, whether or not ``fn`` asks for
    it, so the tenant and task can come from there.
    """

    def decorate(fn: Callable[..., Any]) -> FunctionTool:
        hints = typing.get_type_hints(fn)
        own_context = _takes_run_context(fn, hints)
        signature = inspect.signature(fn)
        name = function_tool_options.get("name_override") or fn.__name__
        spec = ToolSpec(tool_name or name, key, receipt, request_id)
        skip = 1 if own_context else 0

        def split(args: tuple[Any, ...]) -> tuple[RunContextWrapper[Any], tuple[Any, ...]]:
            # Without a context parameter of its own, fn gets its arguments after ours.
            return args[0], (args if own_context else args[1:])

        if inspect.iscoroutinefunction(fn):

            async def guarded(*args: Any, **kwargs: Any) -> Any:
                run_context, fn_args = split(args)
                call_args = bound_arguments(signature, fn_args, kwargs, skip=skip)
                return await spec.arun(
                    ledger_from_run_context(run_context),
                    call_args,
                    lambda: fn(*fn_args, **kwargs),
                    _replay,
                )

        else:

            def guarded(*args: Any, **kwargs: Any) -> Any:
                run_context, fn_args = split(args)
                call_args = bound_arguments(signature, fn_args, kwargs, skip=skip)
                return spec.run(
                    ledger_from_run_context(run_context),
                    call_args,
                    lambda: fn(*fn_args, **kwargs),
                    _replay,
                )

        functools.update_wrapper(guarded, fn, updated=())
        del guarded.__wrapped__  # the schema is read from the signature below, not from fn's
        if own_context:
            guarded.__signature__ = signature  # type: ignore[attr-defined]
            guarded.__annotations__ = hints
        else:
            context_param = inspect.Parameter(
                _CONTEXT_PARAM,
                inspect.Parameter.POSITIONAL_ONLY,
                annotation=RunContextWrapper[Any],
            )
            guarded.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=[context_param, *signature.parameters.values()]
            )
            guarded.__annotations__ = {_CONTEXT_PARAM: RunContextWrapper[Any], **hints}
        return function_tool(
            guarded, failure_error_function=failure_error_function, **function_tool_options
        )

    return decorate(fn) if fn is not None else decorate
