"""Tenancy and roles: tenants, who holds which role where (memberships, identity-provider
groups), and the one home of how roles compare and what a person may see.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    """A person's role in a tenant. The one home of how roles compare: everything else asks
    these functions (a role of None or "" is no role at all)."""

    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    REVIEWER = "reviewer", "Reviewer"
    ADMIN = "admin", "Admin"

    @staticmethod
    def at_least(role: str | None, minimum: str) -> bool:
        """Whether ``role`` may do what ``minimum`` may."""
        return role_rank(role) >= ROLE_RANK[minimum]

    @staticmethod
    def can_view(role: str | None) -> bool:
        return Role.at_least(role, Role.VIEWER)

    @staticmethod
    def can_act(role: str | None) -> bool:
        """Take, assign, note, mark outcomes, acknowledge: operators and above (an owner of
        attention work must be able to act on it)."""
        return Role.at_least(role, Role.OPERATOR)

    @staticmethod
    def can_review(role: str | None) -> bool:
        """Approve, reject and export the audit: reviewers and above."""
        return Role.at_least(role, Role.REVIEWER)

    @staticmethod
    def highest(roles: Iterable[str]) -> str | None:
        """The role among ``roles`` that may do the most (None for none)."""
        return max(roles, key=role_rank, default=None)

    @staticmethod
    def at_or_above(minimum: str) -> list[str]:
        """Every role that may do what ``minimum`` may, for a ``role__in`` filter."""
        return [r for r in ROLE_RANK if Role.at_least(r, minimum)]


ROLE_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.REVIEWER: 2, Role.ADMIN: 3}


class Tenant(models.Model):
    """Whose authority an effect runs under. The slug is the key agents send."""

    slug = models.SlugField(primary_key=True, max_length=64)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A person's role in one tenant. Every dashboard query is scoped through these."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} in {self.tenant_id}"


class SsoGroupRole(models.Model):
    """A role in one tenant for people whose identity provider puts them in ``group``
    (OpenID Connect sign-in, ``attempts.sso``). Configured through ``ledger_config``."""

    group = models.CharField(max_length=200)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sso_group_roles")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "tenant"], name="ssogrouprole_unique")
        ]

    def __str__(self) -> str:
        return f"group {self.group} is {self.role} in {self.tenant_id}"


class SsoIdentity(models.Model):
    """The account a person signing in through OpenID Connect uses: matched by the identity
    provider's stable subject, never by a name another account could carry."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    subject = models.CharField(max_length=255, unique=True)
    last_login_groups = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"{self.user} (sso {self.subject})"


def tenant_roles(user: Any, *, fresh: bool = False) -> dict[str, str]:
    """The one home of "what role does this person have in which tenant": the role in each
    tenant they belong to; a superuser is admin everywhere; an inactive or anonymous user has
    none. Remembered on the user object for one request (``fresh`` reads the database again:
    the write path decides on what is true now)."""
    cached = getattr(user, "_ledger_tenant_roles", None)
    if cached is None or fresh:
        _read_roles([user])
    return user._ledger_tenant_roles


def sso_groups(user: Any, *, fresh: bool = False) -> list[str]:
    """The identity-provider groups this person's last SSO login reported (none without SSO),
    remembered on the user object like ``tenant_roles``."""
    cached = getattr(user, "_ledger_sso_groups", None)
    if cached is None or fresh:
        _read_groups([user])
    return user._ledger_sso_groups


def read_people(users: Iterable[Any]) -> None:
    """Read the roles and groups of several people at once, fresh (a page that asks about
    many people reads them in three queries, not a few per person); ``tenant_roles`` and
    ``sso_groups`` then answer from what was read."""
    users = [u for u in users if u is not None]
    _read_roles(users)
    _read_groups(users)


def _read_roles(users: list[Any]) -> None:
    members = [u for u in users if u.is_authenticated and u.is_active and not u.is_superuser]
    by_user: dict[int, dict[str, str]] = {u.pk: {} for u in members}
    if members:
        rows = Membership.objects.filter(user_id__in=list(by_user))
        for user_id, tenant, role in rows.values_list("user_id", "tenant_id", "role"):
            by_user[user_id][tenant] = role
    every: dict[str, str] | None = None
    for user in users:
        if not user.is_authenticated or not user.is_active:
            user._ledger_tenant_roles = {}
        elif user.is_superuser:
            if every is None:
                every = {slug: Role.ADMIN for slug in Tenant.objects.values_list("slug", flat=True)}
            user._ledger_tenant_roles = dict(every)
        else:
            user._ledger_tenant_roles = dict(by_user[user.pk])


def _read_groups(users: list[Any]) -> None:
    known = [u.pk for u in users if u.is_authenticated]
    groups = dict(
        SsoIdentity.objects.filter(user_id__in=known).values_list("user_id", "last_login_groups")
        if known
        else []
    )
    for user in users:
        user._ledger_sso_groups = list(groups.get(user.pk) or []) if user.is_authenticated else []


def highest_role(user: Any) -> str | None:
    """The user's highest role in any tenant (None for none): which screens and controls to
    show; each action still checks the role in the attempt's own tenant."""
    return Role.highest(tenant_roles(user).values())


def role_rank(role: str | None) -> int:
    """How much a role may do (-1 for no role)."""
    return ROLE_RANK.get(role, -1) if role else -1


def has_role(user: Any, tenant: str, minimum: str, *, fresh: bool = False) -> bool:
    """Whether ``user`` holds at least ``minimum`` in ``tenant``."""
    return role_rank(tenant_roles(user, fresh=fresh).get(tenant)) >= ROLE_RANK[minimum]


def tenants_where(user: Any, minimum: str = Role.VIEWER) -> list[str]:
    """The tenants in which ``user`` holds at least ``minimum``, sorted."""
    rank = ROLE_RANK[minimum]
    return sorted(t for t, r in tenant_roles(user).items() if role_rank(r) >= rank)


def admin_everywhere(user: Any) -> bool:
    """Whether ``user`` is admin in every tenant, those made later included (an active
    superuser, as ``tenant_roles`` says): who reads every tenant's history and the changes
    that span tenants."""
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_superuser)
