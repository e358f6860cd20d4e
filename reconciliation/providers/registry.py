"""Tool name -> adapter. ``Tool.adapter`` is a short name from ``settings.LEDGER["ADAPTERS"]``
(``http`` is the generic provider); the class behind it comes from settings, never from the
database, so whoever edits a tool chooses among adapters the deployment installed and nothing
else."""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from attempts.models import Tool
from reconciliation.providers.base import Adapter, ProviderError


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
        raise ProviderError(f"cannot import adapter {name!r}: {exc}", permanent=False) from None
    if not (isinstance(found, type) and issubclass(found, Adapter)):
        raise ProviderError(f"adapter {name!r} is not a reconciliation.providers.base.Adapter")
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
