"""A person's roles per tenant, set as a whole (by ``ledger_config`` or at an SSO sign-in),
with every membership created, changed or removed recorded in the configuration history."""

from __future__ import annotations

from typing import Any

from attempts.models import Membership
from attempts.states import Actor


def set_roles(user: Any, roles: dict[str, str], *, actor: Actor, reason: str) -> int:
    """Make ``user``'s memberships exactly ``roles`` (tenant -> role); returns how many changed.
    Runs inside the caller's ``write_transaction()``."""
    from attempts.chain import record_config_change

    username = user.get_username()
    current = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
    changed = 0
    for tenant in sorted(current.keys() | roles.keys()):
        old, new = current.get(tenant), roles.get(tenant)
        if old == new:
            continue
        if new is None:
            Membership.objects.filter(user=user, tenant_id=tenant).delete()
            action = "removed"
        else:
            Membership.objects.update_or_create(user=user, tenant_id=tenant, defaults={"role": new})
            action = "created" if old is None else "updated"
        record_config_change(
            subject=f"membership:{tenant}/{username}",
            action=f"config.membership.{action}",
            actor=actor,
            before=None if old is None else {"role": old},
            after=None if new is None else {"role": new},
            reason=reason,
        )
        changed += 1
    return changed
