"""Tool name -> adapter. ``Tool.adapter`` is ``http`` (the generic provider), ``stripe`` (Stripe
payment intents, needs the ``stripe`` extra), ``mcp`` (tools behind the MCP gateway), a name
registered with ``register()``, or the dotted path of an ``Adapter`` subclass."""

from __future__ import annotations

from django.utils.module_loading import import_string

from attempts import ledger
from attempts.models import Attempt, Tool
from reconciliation.providers.base import (
    Adapter,
    Call,
    LookupStatus,
    ProviderError,
    SendStatus,
)
from reconciliation.providers.http import GenericHttpAdapter
from reconciliation.providers.mcp import McpAdapter

_ADAPTERS: dict[str, type[Adapter]] = {"http": GenericHttpAdapter, "mcp": McpAdapter}
# Shipped adapters whose library is an optional extra: imported when a tool names them.
_OPTIONAL = {"stripe": "reconciliation.providers.stripe.StripePaymentIntentAdapter"}


def register(name: str, adapter_class: type[Adapter]) -> None:
    """Make ``adapter_class`` available under a short name for ``Tool.adapter``."""
    if not (isinstance(adapter_class, type) and issubclass(adapter_class, Adapter)):
        raise TypeError(f"{adapter_class!r} is not an Adapter subclass")
    _ADAPTERS[name] = adapter_class


def adapter_class(name: str) -> type[Adapter]:
    """The adapter class named by ``name``; ProviderError when there is none."""
    if name in _ADAPTERS:
        return _ADAPTERS[name]
    if name in _OPTIONAL:
        try:
            return import_string(_OPTIONAL[name])
        except ImportError as exc:
            raise ProviderError(
                f"adapter {name!r} needs its optional extra (pip install 'ledgerweb[{name}]'): {exc}"
            ) from None
    if "." not in name:
        raise ProviderError(
            f"unknown adapter {name!r} (use {', '.join([*_ADAPTERS, *_OPTIONAL])} or a dotted path)"
        )
    try:
        found = import_string(name)
    except ImportError as exc:
        raise ProviderError(f"cannot import adapter {name!r}: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, Adapter)):
        raise ProviderError(f"{name!r} is not a reconciliation.providers.base.Adapter subclass")
    return found


def adapter_for(tool: Tool) -> Adapter:
    return adapter_class(tool.adapter or "http")(tool)


class Registry:
    """The adapters of every configured tool, loaded once per reconcile pass."""

    def __init__(self, tools: list[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._adapters: dict[str, Adapter] = {}
        self._usable: dict[str, tuple[Adapter | None, list[str]]] = {}

    @classmethod
    def load(cls) -> Registry:
        return cls(list(Tool.objects.all()))

    @property
    def tool_names(self) -> list[str]:
        return list(self._tools)

    def tool(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def get(self, tool_name: str) -> Adapter:
        """The adapter for ``tool_name``; ProviderError if the tool or its adapter is unknown."""
        if tool_name not in self._adapters:
            tool = self._tools.get(tool_name)
            if tool is None:
                raise ProviderError(f"tool {tool_name!r} is not configured")
            self._adapters[tool_name] = adapter_for(tool)
        return self._adapters[tool_name]

    def usable(self, tool_name: str) -> tuple[Adapter | None, list[str]]:
        """The adapter and its configuration problems (checked once per registry)."""
        if tool_name not in self._usable:
            try:
                adapter = self.get(tool_name)
                self._usable[tool_name] = (adapter, adapter.check())
            except ProviderError as exc:
                self._usable[tool_name] = (None, [str(exc)])
        return self._usable[tool_name]


def send_with_adapter(attempt: Attempt) -> ledger.SendResult:
    """An agent's send function (for ``ledger.run_tool_call``) for a tool with an adapter: sends
    the claimed attempt through the tool's adapter, then looks it up. The lookup's answer, when
    it finds exactly this payload, is the receipt (a 2xx alone is not); a refusal or an
    uncertain send is raised as the ledger's ProviderRefused or ProviderLostResponse."""
    adapter = adapter_for(Tool.objects.get(name=attempt.tool_name))
    call = Call.of(attempt)
    answer = adapter.send(call)
    if answer.status == SendStatus.REFUSED:
        raise ledger.ProviderRefused(answer.detail or "refused", retryable=answer.retryable)
    if answer.status == SendStatus.UNCERTAIN:
        raise ledger.ProviderLostResponse(answer.detail or "no answer")
    found = adapter.lookup(call) if adapter.can_look_up else None
    receipt = (
        found is not None
        and found.status == LookupStatus.FOUND
        and found.count == 1
        and found.args_hash == attempt.args_hash
        and found.provider_request_id == answer.provider_request_id
    )
    return ledger.SendResult(
        provider_request_id=answer.provider_request_id or None,
        result_ref=found.result_ref if receipt and found is not None else None,
    )
