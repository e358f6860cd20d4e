"""``manage.py crashtest``: kill real agents and workers at named points, recover, and prove the
invariants of protocol section 7 hold. A deployment gate: exits non-zero on any failure."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerweb.cli import command_line
from reconciliation import crashtest
from reconciliation.faults import MUTATIONS


def _cases(value: str) -> list[str]:
    chosen = [c.strip().upper() for c in value.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in crashtest.CASES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"cases are letters among {', '.join(crashtest.CASES)}")
    return chosen


class Command(BaseCommand):
    help = (
        "Failure injection as a deployment gate. Runs crash cases A-I (G-I: approval before dispatch) with real processes "
        "(agents and reconcilers SIGKILLed at named crash points, a real provider process), "
        "runs recovery twice in a row and twice at once, and checks every invariant of protocol "
        "section 7 against the ledger and the provider's own record. Works on a scratch database "
        "(a SQLite file, or a new database on the PostgreSQL server of DATABASE_URL) that is "
        "dropped afterwards; the ledger you run on is never written. Exits 1 on any failure."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--cases",
            type=_cases,
            default=list(crashtest.CASES),
            help="Which cases to run, e.g. A,C,F (default: all). For fuzzing only: --no-cases --fuzz N.",
        )
        parser.add_argument("--no-cases", action="store_true", help="Skip cases A-I.")
        parser.add_argument(
            "--fuzz",
            type=int,
            default=0,
            metavar="N",
            help="Also run N tool calls with kills at random points (named and by timer).",
        )
        parser.add_argument("--seed", type=int, default=None, help="Seed of the fuzz run (replay).")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument(
            "--database-url",
            default=None,
            help="PostgreSQL server to create the scratch databases on (default: the server "
            "of DATABASE_URL when set, else SQLite files). Only crashtest_* databases it creates "
            "are written, and they are dropped at the end.",
        )
        parser.add_argument(
            "--sqlite",
            action="store_true",
            help="Use SQLite scratch files even if DATABASE_URL is set.",
        )
        parser.add_argument(
            "--keep", action="store_true", help="Keep scratch databases and logs for inspection."
        )
        parser.add_argument(
            "--mutation",
            choices=sorted(MUTATIONS),
            default="",
            help="Self-test: run against a deliberately broken ledger; crashtest must then fail.",
        )
        parser.add_argument("--quiet", action="store_true", help="No progress lines.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.LEDGER["FAULTS_ALLOWED"]:
            raise CommandError(
                "crashtest needs fault injection, which is off unless enabled for this process: "
                f"run it as LEDGERWEB_FAULTS_ALLOWED=1 {command_line('crashtest')} in a staging checkout "
                "(never with production settings, LEDGERWEB_HTTPS=1)"
            )
        if options["fuzz"] < 0:
            raise CommandError("--fuzz must be 0 or more")
        if options["no_cases"] and not options["fuzz"]:
            raise CommandError("--no-cases needs --fuzz N")
        server_url = options["database_url"]
        if server_url is None and not options["sqlite"]:
            default = settings.DATABASES["default"]
            if default["ENGINE"] == "django.db.backends.postgresql":
                server_url = _url_of(default)
        if options["sqlite"]:
            server_url = None
        quiet = options["quiet"]

        def progress(line: str) -> None:
            if not quiet:
                print(line, file=sys.stderr, flush=True)

        seed = (
            options["seed"]
            if options["seed"] is not None
            else random.SystemRandom().randrange(10**9)
        )
        started = time.monotonic()
        reports: list[crashtest.CaseReport] = []
        fuzz: dict[str, Any] | None = None
        try:
            with crashtest.harness_run(
                server_url=server_url,
                progress=progress,
                mutation=options["mutation"],
                keep=options["keep"],
            ) as harness:
                harness.prepare()
                if not options["no_cases"]:
                    for case in options["cases"]:
                        reports.append(crashtest.run_case(harness, case))
                if options["fuzz"]:
                    fuzz = crashtest.run_fuzz(harness, calls=options["fuzz"], seed=seed)
                harness.failed = not all(r.passed for r in reports) or bool(
                    fuzz and not fuzz["passed"]
                )
                vendor = harness.vendor
        except crashtest.HarnessError as exc:
            raise CommandError(f"crashtest could not run: {exc}") from None
        seconds = time.monotonic() - started
        passed = all(r.passed for r in reports) and (fuzz is None or fuzz["passed"])
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "passed": passed,
                        "database": vendor,
                        "mutation": options["mutation"] or None,
                        "seconds": round(seconds, 1),
                        "invariants": dict(crashtest.INVARIANTS),
                        "cases": [r.as_json() for r in reports],
                        "fuzz": fuzz,
                    },
                    indent=2,
                )
            )
        else:
            self.stdout.write(crashtest.render_table(reports, fuzz, vendor=vendor, seconds=seconds))
        if not passed:
            sys.exit(1)


def _url_of(config: dict[str, Any]) -> str:
    from urllib.parse import quote

    user = quote(config.get("USER") or "postgres", safe="")
    password = f":{quote(config['PASSWORD'], safe='')}" if config.get("PASSWORD") else ""
    host = config.get("HOST") or "127.0.0.1"
    return f"postgres://{user}{password}@{host}:{config.get('PORT') or 5432}/{config.get('NAME') or 'postgres'}"
