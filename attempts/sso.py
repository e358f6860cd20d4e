"""Single sign-on for operators through OpenID Connect (mozilla-django-oidc).

A person's roles come from the identity provider's groups claim, mapped to tenant roles by the
configuration file's ``[[sso_groups]]`` (``SsoGroupRole``). At every sign-in their memberships are
set to exactly what their groups give, and each change is recorded in the configuration history.
Someone whose groups map to no role is refused. Accounts are matched by the provider's ``sub``,
so a name chosen at the provider can never take over an existing local account.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from attempts import memberships
from attempts.config_history import acting
from attempts.locking import write_transaction
from attempts.models import ROLE_RANK, ActorKind, SsoGroupRole, SsoIdentity
from attempts.states import Actor

log = logging.getLogger("ledgerweb.sso")
# Why the last sign-in of this browser was refused, for the login page to say.
REFUSAL_KEY = "ledgerweb_sso_refused"


def roles_for_groups(groups: list[str]) -> dict[str, str]:
    """tenant -> the highest role any of ``groups`` gives there."""
    roles: dict[str, str] = {}
    for tenant, role in SsoGroupRole.objects.filter(group__in=groups).values_list(
        "tenant_id", "role"
    ):
        if tenant not in roles or ROLE_RANK[role] > ROLE_RANK[roles[tenant]]:
            roles[tenant] = role
    return dict(sorted(roles.items()))


def groups_claim(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.SSO["GROUPS_CLAIM"], [])
    if isinstance(value, str):
        value = [value]
    return sorted({str(group) for group in value}) if isinstance(value, list) else []


class GroupRoleBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with accounts keyed by ``sub`` and roles from groups."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("sub"):
            return self._refuse("the identity provider sent no subject")
        groups = groups_claim(claims)
        if not roles_for_groups(groups):
            return self._refuse(
                f"none of your groups ({', '.join(groups) or 'none'}) has a role in ledgerweb"
            )
        return True

    def _refuse(self, why: str) -> bool:
        log.warning("sso.refused %s", why, extra={"reason": why})
        if getattr(self, "request", None) is not None:
            self.request.session[REFUSAL_KEY] = why
        return False

    def filter_users_by_claims(self, claims: dict[str, Any]):
        return get_user_model().objects.filter(sso_identity__subject=claims["sub"])

    def create_user(self, claims: dict[str, Any]):
        username = self._username(claims)
        users = get_user_model().objects
        if users.filter(username=username).exists():
            self._refuse(f"the account name {username!r} belongs to a local account")
            raise SuspiciousOperation(f"sso username {username!r} is taken by a local account")
        with (
            acting(Actor(ActorKind.SYSTEM, "sso"), f"first sign-in of {username}"),
            write_transaction(),
        ):
            user = users.create_user(username, email=claims.get("email", ""))  # no password
            SsoIdentity.objects.create(user=user, subject=claims["sub"])
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]):
        groups = groups_claim(claims)
        email = claims.get("email", user.email)
        if email != user.email:
            user.email = email
            user.save(update_fields=["email"])
        with write_transaction():
            memberships.set_roles(
                user,
                roles_for_groups(groups),
                actor=Actor(ActorKind.SYSTEM, "sso"),
                reason=f"sign-in of {user.get_username()} with groups {groups}",
            )
            SsoIdentity.objects.filter(user=user).update(last_login_groups=groups)
        return user

    @staticmethod
    def _username(claims: dict[str, Any]) -> str:
        for claim in (settings.SSO["USERNAME_CLAIM"], "preferred_username", "email", "sub"):
            value = str(claims.get(claim) or "").strip()
            if value:
                return value[:150]
        raise SuspiciousOperation("no usable name in the identity provider's claims")
