"""Who may own work, who owns an attempt that needs attention (UNKNOWN or MANUAL_REVIEW), and
who is told when such an attempt breaches its SLA: the one home of these rules. Review (assign),
the attempt page and the queues (whom they offer), ownership rules and SLA policies (in the
configuration file and when they route work), the default owner (a system check) and SLA
escalation all ask here.

The rule: a person may own an attempt of tenant T, or be told that it breached its SLA, when
they are active and their role in T can act on it (operator or above; a superuser is admin
everywhere). A viewer or someone outside T never receives work.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import OuterRef, Q, QuerySet, Subquery

from attempts.models import Membership, OwnershipRule, Role, has_role, tenant_roles

OWNER_ROLE = Role.OPERATOR


def may_own(user: Any, tenant: str) -> bool:
    """Whether ``user`` may own attention work in ``tenant`` now (read fresh)."""
    return user is not None and Role.can_act(tenant_roles(user, fresh=True).get(tenant))


def why_not(user: Any, tenant: str) -> str:
    """Why ``user`` may not own work in ``tenant``, in words a person can act on."""
    name = user.get_username()
    if not user.is_active:
        return f"{name} is not active"
    role = tenant_roles(user, fresh=True).get(tenant)
    held = f"they are {role} there" if role else "they have no role there"
    return (
        f"{name} cannot act on attempts in {tenant} (an owner needs the {OWNER_ROLE} role or "
        f"higher there; {held})"
    )


def may_own_with(roles: dict[str, str], tenant: str, *, active: bool, superuser: bool) -> bool:
    """The same rule over a person described by values (a configuration file's final state)."""
    return active and (superuser or Role.can_act(roles.get(tenant)))


def people_who_may_own(tenants: Iterable[str]) -> QuerySet:
    """The active people who may own work in at least one of ``tenants``, by username."""
    tenants = list(tenants)
    acting = Q(
        ledger_memberships__tenant_id__in=tenants,
        ledger_memberships__role__in=Role.at_or_above(OWNER_ROLE),
    )
    users = get_user_model().objects.filter(is_active=True)
    if not tenants:
        return users.none()
    return users.filter(acting | Q(is_superuser=True)).distinct().order_by("username")


def owner_names(tenants: Iterable[str]) -> list[str]:
    """Usernames of ``people_who_may_own(tenants)``: what an assign control offers."""
    return list(people_who_may_own(tenants).values_list(get_user_model().USERNAME_FIELD, flat=True))


def owner_id_for(tenant: str, tool_name: str) -> int | None:
    """Who owns new attention work of ``tenant`` and ``tool_name``: the first ownership rule (by
    priority) that matches and names someone who may own it, else the default owner if they
    may; None when nobody may (the tenant's reviewers are then told, ``told_of_breach``)."""
    role_here = Membership.objects.filter(user=OuterRef("owner_id"), tenant_id=tenant).values(
        "role"
    )[:1]
    rules = (
        OwnershipRule.objects.filter(owner__is_active=True)
        .annotate(owner_role=Subquery(role_here))
        .values_list(
            "tenant_pattern", "tool_pattern", "owner_id", "owner_role", "owner__is_superuser"
        )
    )
    for tenant_pattern, tool_pattern, owner_id, role, superuser in rules:
        if not (fnmatchcase(tenant, tenant_pattern) and fnmatchcase(tool_name, tool_pattern)):
            continue
        if superuser or Role.can_act(role):
            return owner_id
    default = default_owner()
    return default.pk if default is not None and may_own(default, tenant) else None


def active_person(username: str) -> Any | None:
    """The active person called ``username``, if any: whom "assign to" and the default owner
    name (whether they may own the attempt is ``may_own``'s question)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()


def default_owner() -> Any | None:
    """The active person ``LEDGERWEB_DEFAULT_OWNER`` names, if any."""
    name = settings.LEDGER["DEFAULT_OWNER"]
    if not name:
        return None
    return active_person(name)


def default_owner_problem() -> str | None:
    """What is wrong with ``LEDGERWEB_DEFAULT_OWNER`` (None when unset or usable): it must name
    an active person who may own work in at least one tenant."""
    name = settings.LEDGER["DEFAULT_OWNER"]
    if not name:
        return None
    user = get_user_model().objects.filter(username=name).first()
    if user is None:
        return f"LEDGERWEB_DEFAULT_OWNER names {name!r}, and no such user exists"
    if not user.is_active:
        return f"LEDGERWEB_DEFAULT_OWNER names {name!r}, who is not active"
    if not any(Role.can_act(role) for role in tenant_roles(user, fresh=True).values()):
        return (
            f"LEDGERWEB_DEFAULT_OWNER names {name!r}, who cannot act on attempts in any tenant "
            f"(an owner needs the {OWNER_ROLE} role or higher)"
        )
    return None


def members_of(tenant: str) -> QuerySet:
    """The active people with any role in ``tenant``, and the superusers (admin everywhere), by
    username: the people to ask about each role in it."""
    return (
        get_user_model()
        .objects.filter(is_active=True)
        .filter(Q(ledger_memberships__tenant_id=tenant) | Q(is_superuser=True))
        .distinct()
        .order_by("username")
    )


def reviewers_of(tenant: str) -> list[Any]:
    """The active people who may review the tenant's attempts, by username."""
    return [u for u in members_of(tenant) if has_role(u, tenant, Role.REVIEWER)]


def told_of_breach(attempt: Any, named: Any | None) -> list[Any]:
    """Who hears that ``attempt`` breached its SLA: the person the policy names (else the
    default owner) and the attempt's owner, each only if they may own it; when none of them
    may, the tenant's reviewers, so a breach never goes unheard. The first is who the breach
    is escalated to."""
    candidates = [named if named is not None else default_owner(), attempt.owner]
    told: list[Any] = []
    for person in candidates:
        if (
            person is not None
            and person.is_active
            and person not in told
            and may_own(person, attempt.tenant_id)
        ):
            told.append(person)
    return told or reviewers_of(attempt.tenant_id)


def pattern_problem(
    person: str, pattern: str, tenants: Iterable[str], facts: dict[str, Any] | None
) -> str | None:
    """For a configuration entry that routes work of the tenants matching ``pattern`` to
    ``person`` (``facts``: their ``roles``, ``active`` and ``superuser`` once the file is
    applied; None for an unknown person, reported elsewhere): why it must be refused, when the
    person may own work in none of those tenants."""
    if facts is None:
        return None
    matched = [t for t in tenants if fnmatchcase(t, pattern)]
    if not matched or any(
        may_own_with(facts["roles"], t, active=facts["active"], superuser=facts["superuser"])
        for t in matched
    ):
        return None  # nothing routed yet, or someone who can act on some of it
    if not facts["active"]:
        return f"{person} is not active, so cannot own work"
    where = f"tenant {matched[0]}" if matched == [pattern] else f"any tenant matching {pattern!r}"
    return (
        f"{person} cannot act on attempts in {where} (an owner needs the {OWNER_ROLE} role or "
        f'higher: give them roles = {{ tenant = "{OWNER_ROLE}" }}, or name someone else)'
    )
