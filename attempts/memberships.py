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


# What a person's roles allow on the admin site (``is_staff``; superusers have everything):
# seeing the attempts and history of their own tenants, which the admin scopes with
# ``visible_to``. Configuration there (tools, grants, tenants, people, tokens) spans tenants, so
# changing it stays with superusers; people act on attempts in the dashboard.
ADMIN_PERMISSIONS_BY_ROLE = {
    "viewer": frozenset({"attempts.view_attempt", "attempts.view_attemptevent"}),
}


class RolePermissionBackend:
    """Django permissions from tenant roles, for staff on the admin site. Authenticates nobody."""

    def authenticate(self, request, **credentials):
        return None

    def get_user(self, user_id):
        return None

    def get_all_permissions(self, user_obj, obj=None) -> set[str]:
        from attempts.models import Role, highest_role

        if obj is not None or not user_obj.is_active or not user_obj.is_staff:
            return set()
        best = highest_role(user_obj)
        granted: set[str] = set()
        for role, perms in ADMIN_PERMISSIONS_BY_ROLE.items():
            if Role.at_least(best, role):
                granted |= perms
        return granted

    def has_perm(self, user_obj, perm: str, obj=None) -> bool:
        return perm in self.get_all_permissions(user_obj, obj)

    def has_module_perms(self, user_obj, app_label: str) -> bool:
        return any(p.startswith(f"{app_label}.") for p in self.get_all_permissions(user_obj))
