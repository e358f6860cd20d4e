"""``manage.py revoke_agent_token NAME``: the token stops working at once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from attempts.config_history import acting
from attempts.management.options import add_actor_option, command_actor
from attempts.models import AgentToken


class Command(BaseCommand):
    help = "Revoke the agent token named NAME. Requests with it are refused (401) from now on."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the token's agent name")
        add_actor_option(parser, "revokes it")

    def handle(self, *args, name: str, **options) -> None:
        actor = command_actor(options.get("actor"))
        token = AgentToken.objects.filter(name=name).first()
        if token is None:
            raise CommandError(f"no agent token named {name!r}")
        with acting(actor, "manage.py revoke_agent_token"):
            revoked = token.revoke()
        if revoked:
            self.stdout.write(f"Revoked the token of {name} ({token.prefix}…).")
        else:
            self.stdout.write(f"The token of {name} was already revoked at {token.revoked_at}.")
