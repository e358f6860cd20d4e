"""``manage.py seed_demo``: the demo world, created once and reused.

Tenants acme and globex, the four demo tools (plus update_crm) pointing at the demo provider,
grants, ownership rules, and one demo user per role. Running it again changes nothing but the
tools' provider URLs, and prints the same logins.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from attempts.config_history import save_with_history
from attempts.models import EffectClass, Grant, Membership, OwnershipRule, Role, Tenant, Tool
from attempts.states import Actor

TENANTS = {"acme": "Acme Corp", "globex": "Globex"}
SEEDER = Actor.system("manage.py seed_demo")
TOOLS = [
    # name, effect class, critical, has lookup, description
    ("send_invoice_email", EffectClass.IDEMPOTENT, True, True, "Email an invoice to a customer"),
    ("open_ticket", EffectClass.RECONCILABLE, False, True, "Open a support ticket"),
    ("charge_card", EffectClass.RECONCILABLE, True, True, "Capture a card payment"),
    ("deploy_service", EffectClass.MANUAL, True, False, "Deploy a service to production"),
    ("update_crm", EffectClass.IDEMPOTENT, False, True, "Update a CRM record"),
]
USERS = [
    # username, role in both tenants, staff (admin site)
    ("viewer", Role.VIEWER, False),
    ("operator", Role.OPERATOR, False),
    ("reviewer", Role.REVIEWER, False),
    ("reviewer2", Role.REVIEWER, False),
    ("admin", Role.ADMIN, True),
]


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
            default=os.environ.get("LEDGERWEB_DEMO_PROVIDER_URL", "http://127.0.0.1:8765"),
            help="the demo provider's base URL (default $LEDGERWEB_DEMO_PROVIDER_URL or :8765)",
        )
        parser.add_argument(
            "--password",
            default=os.environ.get("LEDGERWEB_DEMO_PASSWORD", ""),
            help="password for new demo users (default: generated once, kept in the data dir)",
        )

    def handle(self, *args, provider_url: str, password: str, **options) -> None:
        provider_url = provider_url.rstrip("/")
        if not provider_url.startswith(("http://", "https://")):
            raise CommandError("--provider-url must be an http(s) URL")
        logins_file = Path(settings.DATA_DIR) / "demo" / "logins.json"
        password = password or self._saved_password(logins_file) or secrets.token_urlsafe(12)
        with transaction.atomic():
            tenants = {
                slug: Tenant.objects.get_or_create(slug=slug, defaults={"name": name})[0]
                for slug, name in TENANTS.items()
            }
            # Tools, grants and ownership rules decide authority and review: their changes are
            # recorded in the tamper-evident history like any other (attempts.config_history).
            for name, effect, critical, has_lookup, description in TOOLS:
                tool = Tool.objects.filter(name=name).first() or Tool(name=name)
                tool.description = description
                tool.effect_class = effect
                tool.critical = critical
                tool.adapter = "http"
                tool.dispatch_url = f"{provider_url}/tools/{name}/send"
                tool.lookup_url = f"{provider_url}/tools/{name}/lookup" if has_lookup else ""
                tool.timeout_seconds = 5.0
                save_with_history(tool, actor=SEEDER)
                for tenant in tenants.values():
                    if not Grant.objects.filter(tenant=tenant, tool=tool).exists():
                        grant = Grant(
                            tenant=tenant,
                            tool=tool,
                            policy_version="v1",
                            allowed_scopes=[f"{name}:write", f"{name}:read"],
                        )
                        save_with_history(grant, actor=SEEDER)
            users = {}
            created_any = False
            for username, role, staff in USERS:
                user, created = get_user_model().objects.get_or_create(
                    username=username,
                    defaults={
                        "email": f"{username}@demo.example",
                        "is_staff": staff,
                        "is_superuser": staff,
                    },
                )
                if created:
                    user.set_password(password)
                    user.save()
                    created_any = True
                users[username] = user
                for tenant in tenants.values():
                    Membership.objects.get_or_create(
                        user=user, tenant=tenant, defaults={"role": role}
                    )
            # Payments and deployments go to the second reviewer; everything else to reviewer.
            for tool_pattern, owner, priority in (
                ("charge_card", "reviewer2", 50),
                ("deploy_service", "reviewer2", 50),
                ("*", "reviewer", 100),
            ):
                if not OwnershipRule.objects.filter(
                    tenant_pattern="*", tool_pattern=tool_pattern
                ).exists():
                    rule = OwnershipRule(
                        tenant_pattern="*",
                        tool_pattern=tool_pattern,
                        owner=users[owner],
                        priority=priority,
                    )
                    save_with_history(rule, actor=SEEDER)
        if created_any or not logins_file.exists():
            logins_file.parent.mkdir(parents=True, exist_ok=True)
            logins_file.touch(mode=0o600)
            logins_file.write_text(json.dumps({"password": password}))
        self._print_logins(password if created_any else self._saved_password(logins_file))
        self.stdout.write(f"Demo tools point at {provider_url}.")

    @staticmethod
    def _saved_password(path: Path) -> str:
        try:
            return json.loads(path.read_text()).get("password", "")
        except (FileNotFoundError, ValueError):
            return ""

    def _print_logins(self, password: str) -> None:
        self.stdout.write("Demo logins (tenants acme and globex):")
        for username, role, staff in USERS:
            extra = " + Django admin" if staff else ""
            self.stdout.write(
                f"  {username:10} password {password or '(set earlier)'}  {role}{extra}"
            )
