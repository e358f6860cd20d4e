"""``manage.py seed_demo``: the demo world, created once and reused.

The world is a configuration file, ``reconciliation/demo.toml`` (the format of docs/config.md):
tenants acme and globex, the five demo tools pointing at the demo provider, grants, one demo user
per role, ownership rules and an SSO group. It is applied with ``ledger_config``'s engine, so the
demo's setup is in the configuration history like any other. Running it again changes nothing but
the tools' provider URLs, and prints the same logins.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from attempts.states import Actor
from ledgerweb.settings_reference import read
from reconciliation import config

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "demo.toml"


class Command(BaseCommand):
    help = (
        "Create the demo tenants, tools (pointing at the demo provider), grants, ownership rules "
        "and one user per role, or reuse them; prints the demo logins."
    )
    # This command is what configures owners and tools: the checks that would warn about their
    # absence run again with every later command.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--provider-url",
            default=read("LEDGERWEB_DEMO_PROVIDER_URL"),
            help="the demo provider's base URL (default $LEDGERWEB_DEMO_PROVIDER_URL or :8765)",
        )
        parser.add_argument(
            "--password",
            default=read("LEDGERWEB_DEMO_PASSWORD"),
            help="password for new demo users (default: generated once, kept in the data dir)",
        )

    def handle(self, *args, provider_url: str, password: str, **options) -> None:
        provider_url = provider_url.rstrip("/")
        if not provider_url.startswith(("http://", "https://")) or '"' in provider_url:
            raise CommandError("--provider-url must be an http(s) URL")
        logins_file = Path(settings.DATA_DIR) / "demo" / "logins.json"
        password = password or self._saved_password(logins_file) or secrets.token_urlsafe(12)
        text = DEMO_CONFIG.read_text(encoding="utf-8").replace("{provider}", provider_url)
        try:
            document = config.read(str(DEMO_CONFIG.name), text)
            result = config.apply(document, actor=Actor.system("seed_demo"), reason="demo world")
        except config.ConfigError as exc:
            raise CommandError(str(exc)) from None
        if options["verbosity"] >= 2:
            for line in result.lines():
                self.stdout.write(line)
        created_any = False
        users = document.entries("users")
        for user in get_user_model().objects.filter(username__in=[u["username"] for u in users]):
            if not user.has_usable_password():  # new: the demo gives it the demo password
                user.set_password(password)
                user.save(update_fields=["password"])
                created_any = True
        if created_any or not logins_file.exists():
            logins_file.parent.mkdir(parents=True, exist_ok=True)
            logins_file.touch(mode=0o600)
            logins_file.write_text(json.dumps({"password": password}))
        self._print_logins(users, password if created_any else self._saved_password(logins_file))
        self.stdout.write(f"Demo tools point at {provider_url}.")

    @staticmethod
    def _saved_password(path: Path) -> str:
        try:
            return json.loads(path.read_text()).get("password", "")
        except (FileNotFoundError, ValueError):
            return ""

    def _print_logins(self, users: list[dict], password: str) -> None:
        self.stdout.write("Demo logins (tenants acme and globex):")
        for user in users:
            role = ", ".join(sorted(set(user.get("roles", {}).values())))
            extra = " + Django admin" if user.get("staff") else ""
            self.stdout.write(
                f"  {user['username']:10} password {password or '(set earlier)'}  {role}{extra}"
            )
