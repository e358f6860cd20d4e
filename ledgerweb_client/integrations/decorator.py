"""``@ledgered``: a plain Python tool function whose every call goes through the ledger.

::

    @ledgered(key="invoice:{tenant}:{args.invoice}:send", receipt=True)
    def send_invoice_email(to: str, invoice: str) -> dict:
        return mailer.send(...)          # returns the provider's receipt

    with use_ledger(client, tenant="acme", task_id="task-42"):
        send_invoice_email("ap@acme.test", "INV-7")

The function's bound arguments (defaults applied) are the recorded ``args``. A repeated call with
the same key returns the recorded result without calling the function; the ledger's refusals
raise ``ToolCallError`` subclasses (see ``ledgerweb_client.guard``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from ..guard import (
    KeySource,
    LedgerContext,
    Receipt,
    Recorded,
    RequestId,
    ToolSpec,
    current_ledger,
)

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["awaited", "bound_arguments", "by_keyword", "keyword_call", "ledgered", "shown_as"]


def by_keyword(signature: inspect.Signature, skip: int = 0) -> bool:
    """True when the function can be called with its recorded ``args`` as keywords (no
    positional-only or ``*args`` parameter past the first ``skip``): then it can send a linked
    attempt's corrected arguments."""
    params = list(signature.parameters.values())[skip:]
    return all(
        p.kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)
        for p in params
    )


def bound_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any], skip: int = 0
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied, ``**kwargs`` flattened; the
    first ``skip`` parameters (a framework's context argument) left out."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    skipped = list(signature.parameters)[:skip]
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if name in skipped:
            continue
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            out[name] = list(value)
        else:
            out[name] = value
    return out


def awaited(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """``fn`` called with keyword arguments and awaited: an async function as it is, a sync one
    in a worker thread (the frameworks' async tools must not block their event loop)."""
    is_async = inspect.iscoroutinefunction(fn)

    async def call(kwargs: dict[str, Any]) -> Any:
        if is_async:
            return await fn(**kwargs)
        return await asyncio.to_thread(functools.partial(fn, **kwargs))

    return call


def keyword_call(
    spec: ToolSpec, fn: Callable[..., Any], signature: inspect.Signature
) -> Callable[[dict[str, Any], Callable[[], LedgerContext]], Awaitable[Any]]:
    """``fn`` (sync or async, with ``signature``) guarded for a framework that calls its tools
    with keyword arguments and awaits them (Pydantic AI, Agent Framework): the call's bound
    arguments are recorded under the ledger ``context()`` gives, ``fn(**kwargs)`` is sent (a
    linked attempt's corrected arguments when ``fn`` takes them as keywords), and a repeated
    call returns the kept value or its text. Refusals raise ``ToolCallError``."""
    keywords = by_keyword(signature)
    call = awaited(fn)

    async def guarded(kwargs: dict[str, Any], context: Callable[[], LedgerContext]) -> Any:
        args = bound_arguments(signature, (), kwargs)
        return await spec.arun(
            context(),
            args,
            lambda: call(kwargs),
            Recorded.value_or_text,
            send_args=call if keywords else None,
        )

    return guarded


def shown_as(
    wrapper: Callable[..., Any],
    fn: Callable[..., Any],
    signature: inspect.Signature,
    annotations: dict[str, Any],
) -> None:
    """Make a framework see ``wrapper`` as ``fn`` (name, docstring) with ``signature`` and
    ``annotations``: frameworks read a tool's schema from them, and from ``fn`` itself when
    ``__wrapped__`` leads there, so that is removed."""
    functools.update_wrapper(wrapper, fn, updated=())
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.__annotations__ = annotations


def ledgered(
    *,
    key: KeySource,
    tool_name: str | None = None,
    receipt: Receipt = False,
    request_id: RequestId = None,
    context: LedgerContext | Callable[[], LedgerContext] | None = None,
    wait_for_approval: float = 0,
) -> Callable[[F], F]:
    """Guard a tool function (sync or async) with the ledger's safe order.

    ``tool_name`` is the ledger's name for the tool (default: the function's name); ``key``,
    ``receipt`` and ``request_id`` are described on ``ToolSpec``. ``context`` is the
    ``LedgerContext`` (or a function returning it); by default the one set by ``use_ledger``.
    The wrapped function keeps its signature, so frameworks that read it (LangChain's ``@tool``,
    the Agents SDK's ``function_tool``) see the original parameters.

    A call an approval policy holds waits up to ``wait_for_approval`` seconds, then raises
    ``ToolCallAwaitingApproval`` (call again later with the same arguments: the same key
    continues it) or ``ToolCallRejected``. After edit-and-approve the function is called with
    the corrected arguments, as keywords.
    """

    def decorate(fn: F) -> F:
        spec = ToolSpec(tool_name or fn.__name__, key, receipt, request_id, wait_for_approval)
        signature = inspect.signature(fn)
        keywords = by_keyword(signature)

        def resolve() -> LedgerContext:
            if context is None:
                return current_ledger()
            return context() if callable(context) else context

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call_args = bound_arguments(signature, args, kwargs)
                return await spec.arun(
                    resolve(),
                    call_args,
                    lambda: fn(*args, **kwargs),
                    send_args=(lambda corrected: fn(**corrected)) if keywords else None,
                )

            async_wrapper.ledger_spec = spec  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call_args = bound_arguments(signature, args, kwargs)
            return spec.run(
                resolve(),
                call_args,
                lambda: fn(*args, **kwargs),
                send_args=(lambda corrected: fn(**corrected)) if keywords else None,
            )

        wrapper.ledger_spec = spec  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
