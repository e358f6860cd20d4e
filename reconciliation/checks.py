"""System checks for recovery: tools it could not reconcile, and thresholds that would make it
treat a send still in flight as stale."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.db import DatabaseError

from ledgerweb.cli import command_line


@register(Tags.database)
def check_tools_reconcilable(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Tools recovery could not reconcile. Reads the database: runs with ``migrate``, at the
    reconcile worker's start and with ``check --database default``."""
    from attempts.models import Tool
    from reconciliation.providers.base import ProviderError
    from reconciliation.providers.registry import adapter_for

    try:
        tools = list(Tool.objects.filter(active=True).order_by("name"))
    except DatabaseError:
        return []  # not migrated yet
    warnings = []
    stale_after = settings.LEDGER["STALE_AFTER"]
    for tool in tools:
        try:
            problems = adapter_for(tool).check()
        except ProviderError as exc:
            problems = [str(exc)]
        if problems:
            warnings.append(
                Warning(
                    f"Tool {tool.name!r} cannot be reconciled: {'; '.join(problems)}.",
                    hint=f"Fix it with `{command_line('ledger_config apply')}` (docs/config.md).",
                    obj=tool.name,
                    id="reconciliation.W001",
                )
            )
        if tool.timeout_seconds >= stale_after:
            warnings.append(
                Warning(
                    f"Tool {tool.name!r} times out after {tool.timeout_seconds}s, not less than "
                    f"LEDGERWEB_STALE_AFTER ({stale_after}s).",
                    hint="Recovery could treat a send still in flight as stale; raise "
                    "LEDGERWEB_STALE_AFTER above every tool timeout.",
                    obj=tool.name,
                    id="reconciliation.W002",
                )
            )
    return warnings
