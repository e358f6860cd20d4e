"""``manage.py crashtest_agent``: the agent process that crashtest starts and kills."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reconciliation.crashagent import PlannedCall, run_plan


class Command(BaseCommand):
    help = (
        "Perform the tool calls of a plan file through the ledger's safe order, sending them to "
        "the provider over HTTP. Used by crashtest, which kills it at crash points "
        "(LEDGERWEB_CRASH_AT) or by timer (LEDGERWEB_CRASH_TIMER_MS)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("plan", type=Path, help="JSON file: a list of tool calls")
        parser.add_argument("--start", type=int, default=0, help="index of the first call to do")
        parser.add_argument("--count", type=int, default=None, help="how many calls (default all)")
        parser.add_argument("--name", default="crashtest-agent", help="agent name in history")
        parser.add_argument(
            "--not-before", type=float, default=None, help="Unix time to begin at (races)"
        )

    def handle(self, *args, **options) -> None:
        try:
            raw = json.loads(options["plan"].read_text())
            calls = [PlannedCall.from_json(item) for item in raw]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"cannot read the plan {options['plan']}: {exc}") from None
        if not 0 <= options["start"] <= len(calls):
            raise CommandError(f"--start must be between 0 and {len(calls)}")
        if options["count"] is not None and options["count"] < 0:
            raise CommandError("--count must be 0 or more")
        run_plan(
            calls,
            agent_name=options["name"],
            start=options["start"],
            count=options["count"],
            not_before=options["not_before"],
            out=sys.stdout,
        )
