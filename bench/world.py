"""The ledger the dashboard benches browse (bench/queues.py, bench/scale.py): five tenants, five
tools (two of them critical), every tenant granted every tool, and the admin ``bench``."""

from __future__ import annotations

from typing import Any

TENANTS = ["north", "south", "east", "west", "central"]
TOOLS = ["send_invoice_email", "open_ticket", "charge_card", "deploy_service", "update_crm"]


def seed_world() -> Any:
    """Create what is missing of the world (Django set up, the database migrated); returns the
    admin ``bench``."""
    from django.contrib.auth.models import User

    from attempts.models import EffectClass, Grant, Membership, Role, Tenant, Tool

    if not Tenant.objects.exists():
        for slug in TENANTS:
            Tenant.objects.create(slug=slug, name=slug.title())
        for name in TOOLS:
            Tool.objects.create(
                name=name,
                effect_class=EffectClass.RECONCILABLE,
                critical=name in ("charge_card", "deploy_service"),
            )
        for slug in TENANTS:
            for name in TOOLS:
                Grant.objects.create(
                    tenant_id=slug, tool_id=name, policy_version="v1", allowed_scopes=["write"]
                )
    user = User.objects.filter(username="bench").first()
    if user is None:
        user = User.objects.create_superuser("bench", "bench@example.test", "bench-password-123")
        for slug in TENANTS:
            Membership.objects.create(user=user, tenant_id=slug, role=Role.ADMIN)
    return user
