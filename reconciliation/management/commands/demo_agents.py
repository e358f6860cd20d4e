"""``manage.py demo_agents``: run the demo agents (reconciliation.demo_agents) against the API.

Without ``--token`` it issues a short-lived agent token for the demo tenants and revokes it when
the run ends, so no secret outlives the run.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from attempts.models import ATTENTION_STATES, AgentToken, Attempt, Tenant
from ledgerweb.cli import command_line
from reconciliation import demo_agents


class Command(BaseCommand):
    help = (
        "Run realistic agent tasks (invoice emails, support tickets, card charges, deployments) "
        "through the HTTP API against the demo provider, with crashes (real SIGKILLs) and "
        "timeouts injected, so UNKNOWN and MANUAL_REVIEW work with a genuine history appears."
    )

    def add_arguments(self, parser) -> None:
        demo_agents.add_arguments(parser, token_required=False)
        parser.add_argument(
            "--if-queues-empty",
            action="store_true",
            help="run the tasks only when no UNKNOWN or MANUAL_REVIEW work exists (the provider "
            "is configured either way)",
        )

    def handle(self, *args, **options) -> None:
        if options["tasks"] < 0 or options["agents"] < 1:
            raise CommandError("--tasks must be >= 0 and --agents >= 1")
        tenants = tuple(
            slug for slug in demo_agents.TENANTS if Tenant.objects.filter(slug=slug).exists()
        )
        if not tenants:
            raise CommandError(
                f"the demo tenants do not exist: run {command_line('seed_demo')} first"
            )
        if (
            options["if_queues_empty"]
            and Attempt.objects.filter(state__in=ATTENTION_STATES).exists()
        ):
            self.stdout.write(
                "demo agents: the queues already hold work; configuring the provider only"
            )
            options["tasks"] = 0
        token_row = None
        token = options["token"]
        if not token:
            name = f"demo-agents-{timezone.now():%Y%m%d-%H%M%S-%f}"
            token_row, token = AgentToken.issue(name, list(tenants))
        try:
            demo_agents.run(
                api=options["api"],
                token=token,
                provider_url=options["provider"],
                tasks=options["tasks"],
                crash_rate=options["crash_rate"],
                timeout_rate=options["timeout_rate"],
                mismatch_rate=options["mismatch_rate"],
                lookup_fault_rate=options["lookup_fault_rate"],
                lookup_outage=tuple(options["lookup_outage"]),
                seed=options["seed"],
                agents=options["agents"],
                send_timeout=options["send_timeout"],
                tenants=tenants,
                out=self.stdout,
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise CommandError(f"demo agents could not run: {exc}") from None
        finally:
            if token_row is not None:
                token_row.revoke()
