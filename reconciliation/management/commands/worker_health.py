"""``manage.py worker_health``: exit 0 when a reconcile worker on this host beat recently.

The worker container's healthcheck (compose.yaml, ``ledgerweb-entrypoint healthcheck worker``)
and a systemd watchdog script run it: the worker serves no HTTP, so its heartbeat row in the
database is what says it is alive. ``--any-host`` accepts any worker's heartbeat."""

from __future__ import annotations

import socket

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from reconciliation.models import WorkerHeartbeat


class Command(BaseCommand):
    help = (
        "Exit 0 when a reconcile worker on this host (its hostname, as the worker records it) "
        "beat within LEDGERWEB_HEARTBEAT_MAX_AGE seconds; otherwise say why and exit 1."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--any-host", action="store_true", help="accept a worker on any host")
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="seconds (default: LEDGERWEB_HEARTBEAT_MAX_AGE)",
        )

    def handle(self, *args, **options) -> None:
        max_age = options["max_age"] or settings.OPS["HEARTBEAT_MAX_AGE"]
        host = socket.gethostname()[:200]
        beats = WorkerHeartbeat.objects.all()
        if not options["any_host"]:
            beats = beats.filter(hostname=host)
        try:
            newest = beats.order_by("-last_seen").values_list("last_seen", flat=True).first()
        except DatabaseError as exc:
            raise CommandError(f"the database does not answer: {exc}".strip()) from None
        where = "any host" if options["any_host"] else f"host {host}"
        if newest is None:
            raise CommandError(f"no reconcile worker has beaten on {where}")
        age = max(0.0, (timezone.now() - newest).total_seconds())
        if age > max_age:
            raise CommandError(
                f"the newest heartbeat on {where} is {age:.0f} s old (more than {max_age:g} s)"
            )
        self.stdout.write(f"worker ok: heartbeat {age:.1f} s ago on {where}")
