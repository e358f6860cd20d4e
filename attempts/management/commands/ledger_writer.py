"""``manage.py ledger_writer``: the intent writer for the embedded SQLite database."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts import writer


class Command(BaseCommand):
    help = (
        "Serve the intent writer: web workers hand it the intents they have prepared, and it "
        "records everything that arrives together in one durable commit, answering each worker "
        "only after that commit (attempts/writer.py). SQLite only; the gunicorn configuration "
        "starts one with the web tier. Workers record intents themselves whenever it is not "
        "running. Stops on SIGTERM or SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--socket",
            action="store_true",
            help="Print the socket path this database's writer listens on, and exit.",
        )

    def handle(self, *args, **options) -> None:
        path = writer.socket_path()
        if path is None:
            raise CommandError(
                "the intent writer serves the embedded SQLite database only; PostgreSQL groups "
                "concurrent commits itself (DATABASE_URL is set)"
            )
        if options["socket"]:
            self.stdout.write(path)
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        try:
            counts = writer.serve(stop)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"intent writer stopped: {counts['intents']} intents in {counts['groups']} commits, "
            f"{counts['refused']} refused, {counts['peers']} worker connections"
        )
