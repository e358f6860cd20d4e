"""``manage.py export_audit``: write an audit report (CSV or JSON Lines, with a manifest)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts import audit_export
from attempts.models import State
from ledgerweb.cli import command_line


class Command(BaseCommand):
    help = (
        "Export the audit history, streamed so memory stays flat, pinned to the ledger head at "
        "the start. --format jsonl writes header, events, chain links and a manifest line in one "
        "file; --format csv writes the events (safe against spreadsheet formula injection) and "
        "FILE.manifest.json (filters, row count, first and last event, head hash, SHA-256). "
        f"Check either later with `{command_line('verify_audit --export FILE')}` or, without "
        "ledgerweb, `python attempts/verify_export.py FILE`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=("csv", "jsonl"), default="jsonl")
        parser.add_argument(
            "--out", type=Path, required=True, help="file to write ('-' for standard output)"
        )
        parser.add_argument("--tenant", default="", help="only this tenant's attempts")
        parser.add_argument(
            "--state",
            default="",
            help=f"only attempts now in this state ({', '.join(State.values)})",
        )
        parser.add_argument("--tool", default="", help="only this tool's attempts")
        parser.add_argument("--since", default="", help="events at or after this date/time (UTC)")
        parser.add_argument("--until", default="", help="events before this date/time (UTC)")
        parser.add_argument(
            "--as-user",
            default="",
            metavar="USERNAME",
            help="export only what this person may export (their reviewer/admin tenants)",
        )
        parser.add_argument("--upto", type=int, help="pin to this event id instead of the head")

    def handle(self, *args, **options) -> None:
        try:
            filters = audit_export.ExportFilters.parse(options)
        except audit_export.ExportError as exc:
            raise CommandError(str(exc)) from None
        user = None
        if options["as_user"]:
            user = get_user_model().objects.filter(username=options["as_user"]).first()
            if user is None or not user.is_active:
                raise CommandError(f"no active user {options['as_user']!r}")
            if audit_export.export_tenants(user) == set():
                raise CommandError(
                    f"{user.get_username()} may not export: audit reports need the reviewer or "
                    "admin role in a tenant"
                )
        try:
            plan = audit_export.plan_export(user=user, filters=filters, upto=options["upto"])
        except audit_export.ExportError as exc:
            raise CommandError(str(exc)) from None
        out: Path = options["out"]
        if str(out) == "-":
            if options["format"] == "csv":
                raise CommandError("a CSV export needs --out FILE (its manifest goes beside it)")
            for chunk in audit_export.stream_jsonl(plan):
                sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            return
        if out.is_dir() or not out.parent.is_dir():
            raise CommandError(f"cannot write {out}: not a file in an existing directory")
        temp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        result = audit_export.CsvResult()
        try:
            with temp.open("wb") as handle:
                chunks = (
                    audit_export.stream_csv(plan, result)
                    if options["format"] == "csv"
                    else audit_export.stream_jsonl(plan)
                )
                for chunk in chunks:
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, out)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if options["format"] == "csv":
            manifest = result.manifest or {}
            manifest_path = out.with_name(out.name + ".manifest.json")
            manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            rows, head = manifest.get("row_count"), manifest.get("head_hash")
            self.stdout.write(f"wrote {out} and {manifest_path}: {rows} events, head {head}")
        else:
            self.stdout.write(f"wrote {out} (pinned at event {plan.upto}, head {plan.head_hash})")
