"""Tool name -> adapter. ``Tool.adapter`` is a short name from ``settings.LEDGER["ADAPTERS"]``
(``http`` the generic provider, ``mcp`` tools behind the MCP gateway, ``stripe`` Stripe payment
intents with the ``stripe`` extra); the class behind it comes from settings, never from the
database, so whoever edits a tool chooses among adapters the deployment installed and nothing
else."""

from __future__ import annotations

from django.conf import settings
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


def adapter_class(name: str) -> type[Adapter]:
    """The adapter class settings list under ``name``; ProviderError when there is none."""
    listed = settings.LEDGER["ADAPTERS"]
    if name not in listed:
        raise ProviderError(
            f"unknown adapter {name!r}: choose one of {', '.join(sorted(listed))} "
            "(LEDGER['ADAPTERS'], extended with LEDGERWEB_ADAPTERS)"
        )
    try:
        found = import_string(listed[name])
    except ImportError as exc:
        # Shipped adapters whose library is an optional extra (stripe) say which one.
        raise ProviderError(
            f"cannot import adapter {name!r} ({listed[name]}; an optional extra such as "
            f"pip install 'ledgerweb[{name}]' may be missing): {exc}",
            permanent=False,
        ) from None
    if not (isinstance(found, type) and issubclass(found, Adapter)):
        raise ProviderError(f"adapter {name!r} is not a reconciliation.providers.base.Adapter")
    return found


def close_shared() -> None:
    """Close what the adapters imported in this process share (``Adapter.close_shared``);
    adapters never imported have nothing open and are not imported for this."""
    import sys

    for path in settings.LEDGER["ADAPTERS"].values():
        module, _, name = path.rpartition(".")
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and issubclass(found, Adapter):
            found.close_shared()


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
        """The adapter and its configuration problems (checked once per registry). An adapter
        that fails to build or check is a configuration problem of its tool, not a crash."""
        if tool_name not in self._usable:
            try:
                adapter = self.get(tool_name)
                self._usable[tool_name] = (adapter, adapter.check())
            except ProviderError as exc:
                self._usable[tool_name] = (None, [str(exc)])
            except Exception as exc:
                self._usable[tool_name] = (None, [f"adapter failed: {type(exc).__name__}: {exc}"])
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
