"""``manage.py ledger_config plan|apply|dump``: configuration as code (docs/config.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts.management.options import add_actor_option, command_actor
from ledgerweb.cli import command_line
from reconciliation import config


class Command(BaseCommand):
    help = (
        "Configuration as code: `plan FILE` shows what applying the TOML file would change, "
        "`apply FILE` makes every change or none and records each in the verified history with "
        "who applied it, `dump [--out FILE]` writes today's configuration in the same format. "
        "Objects the file does not mention are left alone; an entry with `remove = true` removes "
        "one. Schema: docs/config.schema.json."
    )
    # What this command configures (owners, tools) is what those checks warn about.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="plan|apply|dump")
        plan = actions.add_parser("plan", help="Show the changes FILE would make; change nothing.")
        plan.add_argument("file", help="the TOML configuration file ('-' for standard input)")
        apply = actions.add_parser("apply", help="Make FILE's changes, all or none.")
        apply.add_argument("file", help="the TOML configuration file ('-' for standard input)")
        add_actor_option(apply, "applies it")
        apply.add_argument(
            "--reason", default="", help="why, as recorded in the history (default: the file name)"
        )
        dump = actions.add_parser("dump", help="Write today's configuration as TOML.")
        dump.add_argument("--out", default=None, help="write to this file instead of the output")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "dump":
            text = config.dump()
            if options["out"]:
                Path(options["out"]).write_text(text, encoding="utf-8")
                self.stdout.write(f"wrote {options['out']}")
            else:
                self.stdout.write(text, ending="")
            return
        document = self._read(options["file"])
        try:
            if action == "plan":
                result = config.plan(document)
            else:
                result = config.apply(
                    document, actor=command_actor(options["actor"]), reason=options["reason"]
                )
        except config.ConfigError as exc:
            raise CommandError(f"{exc}\nnothing was changed") from None
        for line in result.lines():
            self.stdout.write(line)
        if action == "plan":
            self.stdout.write(
                f"nothing was changed (plan); `{command_line('ledger_config apply')}` makes these changes"
            )
            return
        created = [c.key for c in result.changes if c.section.name == "users" and c.before is None]
        for username in created:
            self.stdout.write(
                f"user {username} has no password yet: send them the one-time link from "
                f"`{command_line('password_link ' + username)}`"
            )

    def _read(self, path: str) -> config.Document:
        try:
            if path == "-":
                return config.read("<stdin>", sys.stdin.read())
            return config.read(path)
        except config.ConfigError as exc:
            raise CommandError(f"{exc}\nnothing was changed") from None
