"""``manage.py password_link USERNAME``: a one-time link with which a person sets their password."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from ledgerweb.cli import command_line


class Command(BaseCommand):
    help = (
        "Print a one-time link with which USERNAME sets their own password (passwords are never "
        "in the configuration file). The link stops working once used, when the password changes "
        "otherwise, or after PASSWORD_RESET_TIMEOUT (3 days)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--base-url",
            default="",
            help="the dashboard's address, e.g. https://ledger.example.com (default: the first "
            "of LEDGERWEB_ALLOWED_HOSTS, over https when LEDGERWEB_HTTPS=1)",
        )

    def handle(self, *args: Any, username: str, base_url: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(
                f"no user {username!r}: add them under [[users]] and run "
                f"`{command_line('ledger_config apply FILE')}`"
            )
        if not user.is_active:
            raise CommandError(f"user {username!r} is not active (active = false)")
        if not base_url:
            scheme = "https" if settings.HTTPS else "http"
            host = next((h for h in settings.ALLOWED_HOSTS if h not in ("*", "")), "127.0.0.1")
            base_url = f"{scheme}://{host.lstrip('.')}"
        path = reverse(
            "password_reset_confirm",
            kwargs={
                "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
                "token": default_token_generator.make_token(user),
            },
        )
        self.stdout.write(base_url.rstrip("/") + path)
