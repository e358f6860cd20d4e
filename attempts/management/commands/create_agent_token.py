"""``manage.py create_agent_token NAME --tenant acme [--tenant globex]``: issue an agent token."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from attempts.config_history import acting
from attempts.management.options import add_actor_option, command_actor
from attempts.models import AgentToken, Tenant
from ledgerweb.cli import command_line


class Command(BaseCommand):
    help = (
        "Create a bearer token for agent NAME, allowed the given tenants, and print it once. "
        "Only its SHA-256 is stored: copy it now."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the agent identity recorded on every event it causes")
        parser.add_argument(
            "--tenant",
            action="append",
            required=True,
            dest="tenants",
            metavar="SLUG",
            help="a tenant this token may act for (repeat for several)",
        )
        add_actor_option(parser, "creates it")
        parser.add_argument(
            "--quiet",
            action="store_true",
            help="print only the token (for scripts)",
        )

    def handle(self, *args, name: str, tenants: list[str], quiet: bool, **options) -> None:
        actor = command_actor(options.get("actor"))
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters")
        wanted = sorted(set(tenants))
        known = set(Tenant.objects.filter(slug__in=wanted).values_list("slug", flat=True))
        missing = [slug for slug in wanted if slug not in known]
        if missing:
            known_list = ", ".join(Tenant.objects.order_by("slug").values_list("slug", flat=True))
            raise CommandError(
                f"unknown tenant(s): {', '.join(missing)}. Tenants are made from the "
                'configuration file: add a [[tenants]] entry (slug = "...") and run '
                f"`{command_line('ledger_config apply FILE')}` (docs/config.md). "
                + (f"Known tenants: {known_list}." if known_list else "There are no tenants yet.")
            )
        if AgentToken.objects.filter(name=name).exists():
            raise CommandError(
                f"a token named {name!r} already exists; revoke it and choose another name"
            )
        with acting(actor, "manage.py create_agent_token"):
            token, raw = AgentToken.issue(name, wanted)
        if quiet:
            self.stdout.write(raw)
            return
        self.stdout.write(f"Agent token for {name} (tenants: {', '.join(wanted)}):")
        self.stdout.write(raw)
        self.stdout.write("It is shown only this once. Send it as 'Authorization: Bearer <token>'.")
