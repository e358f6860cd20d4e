"""``manage.py load_tools FILE``: configure tools (and their generic HTTP provider) from JSON.

The older, tools-only form of ``ledger_config`` (docs/config.md): the same engine makes the
changes, all or none, and records each in the configuration history. Fields an entry leaves out
keep their current values."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts.management.options import add_actor_option, command_actor
from attempts.models import EffectClass, Tool
from reconciliation import config
from reconciliation.providers.base import ProviderError
from reconciliation.providers.registry import adapter_for

FIELDS = {
    "name": str,
    "description": str,
    "effect_class": str,
    "critical": bool,
    "adapter": str,
    "dispatch_url": str,
    "lookup_url": str,
    "timeout_seconds": (int, float),
    "max_sends": (int, type(None)),
    "active": bool,
}
REQUIRED = ("name", "effect_class")


def tool_as_dict(tool: Tool) -> dict[str, Any]:
    return {name: getattr(tool, name) for name in FIELDS}


class Command(BaseCommand):
    help = (
        'Create or update tools from a JSON file: a list of objects (or {"tools": [...]}) with '
        "name, effect_class (idempotent|reconcilable|manual), critical, adapter ('http', 'stripe', "
        "'mcp' or a dotted path), dispatch_url, lookup_url, timeout_seconds, max_sends, description, "
        "active. "
        "All tools load or none do. Tools not in the file are left as they are. "
        "Use --dump to print the current configuration in the same format."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", help="JSON file to load ('-' for standard input).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Validate and report, change nothing."
        )
        parser.add_argument(
            "--dump", action="store_true", help="Print the current tools as JSON and exit."
        )
        add_actor_option(parser, "loads them")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["dump"]:
            tools = [tool_as_dict(tool) for tool in Tool.objects.order_by("name")]
            self.stdout.write(json.dumps({"tools": tools}, indent=2))
            return
        if not options["file"]:
            raise CommandError("give a JSON file to load (or --dump)")
        entries = self._read(options["file"])
        checked = [self._check_one(index, entry) for index, entry in enumerate(entries)]
        document = config.Document(
            path=options["file"], data={"version": 1, "tools": [t for t, _ in checked]}, text=""
        )
        try:
            if options["dry_run"]:
                result = config.plan(document)
            else:
                actor = command_actor(options["actor"])
                result = config.apply(document, actor=actor, reason=f"load_tools {options['file']}")
        except config.ConfigError as exc:
            raise CommandError(str(exc)) from None
        actions = {change.key: change.action for change in result.changes}
        for tool, problems in checked:
            flags = ", critical" if tool["critical"] else ""
            action = actions.get(tool["name"], "unchanged")
            line = f"{action} {tool['name']} ({tool['effect_class']}{flags}, adapter {tool['adapter']})"
            # Loadable but not yet usable by recovery (e.g. no lookup URL yet): said, plainly.
            self.stdout.write(line + "".join(f"\n  warning: {p}" for p in problems))
        verb = "would load" if options["dry_run"] else "loaded"
        self.stdout.write(f"{verb} {len(entries)} tool(s)")

    def _read(self, path: str) -> list[dict[str, Any]]:
        try:
            raw = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CommandError(f"{path} is not valid JSON: {exc}") from None
        if isinstance(data, dict) and set(data) == {"tools"}:
            data = data["tools"]
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise CommandError('expected a list of tool objects, or {"tools": [...]}')
        names = [item.get("name") for item in data]
        duplicates = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
        if duplicates:
            raise CommandError(f"tools listed twice: {', '.join(duplicates)}")
        return data

    def _check_one(self, index: int, entry: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The entry over the tool's current values, checked; and what recovery would miss."""
        where = f"tool #{index + 1}" + (f" ({entry['name']})" if "name" in entry else "")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise CommandError(f"{where}: unknown field(s) {', '.join(unknown)}")
        missing = [name for name in REQUIRED if name not in entry]
        if missing:
            raise CommandError(f"{where}: missing {', '.join(missing)}")
        for name, value in entry.items():
            expected = FIELDS[name]
            if isinstance(value, bool) and expected in (int, float, (int, float)):
                raise CommandError(f"{where}: {name} must be a number")
            if not isinstance(value, expected):
                raise CommandError(f"{where}: {name} has the wrong type")
        if entry["effect_class"] not in EffectClass.values:
            raise CommandError(
                f"{where}: effect_class must be one of {', '.join(EffectClass.values)}"
            )
        tool = Tool.objects.filter(name=entry["name"]).first() or Tool(name=entry["name"])
        for name, value in entry.items():
            setattr(tool, name, value)
        try:
            tool.full_clean(validate_unique=False)
        except ValidationError as exc:
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(f"{where}: {problems}") from None
        for name in ("dispatch_url", "lookup_url"):
            url = getattr(tool, name)
            if url and urlsplit(url).scheme not in ("http", "https"):
                raise CommandError(f"{where}: {name} must be an http(s) URL")
        try:
            problems = adapter_for(tool).check()
        except ProviderError as exc:
            raise CommandError(f"{where}: {exc}") from None
        return tool_as_dict(tool), problems
