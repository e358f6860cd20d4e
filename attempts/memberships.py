"""A person's roles per tenant, set as a whole (by ``ledger_config`` or at an SSO sign-in),
with every membership created, changed or removed recorded in the configuration history
(``attempts.config_history`` records each as ``membership:<tenant>/<username>``)."""

from __future__ import annotations

from typing import Any

from attempts.models import Membership
from attempts.states import Actor


def set_roles(user: Any, roles: dict[str, str], *, actor: Actor, reason: str) -> int:
    """Make ``user``'s memberships exactly ``roles`` (tenant -> role); returns how many changed.
    Runs inside the caller's ``write_transaction()``."""
    from attempts.config_history import acting

    current = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
    changed = 0
    for tenant in sorted(current.keys() | roles.keys()):
        old, new = current.get(tenant), roles.get(tenant)
        if old == new:
            continue
        with acting(actor, reason):
            if new is None:
                Membership.objects.filter(user=user, tenant_id=tenant).delete()
            else:
                Membership.objects.update_or_create(
                    user=user, tenant_id=tenant, defaults={"role": new}
                )
        changed += 1
    return changed
