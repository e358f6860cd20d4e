"""The parts of the configuration file, one ``Section`` each: what an entry looks like with its
defaults filled in, how today's database reads as entries, and how one change is made.

Adding a part (SLAs, notification targets, ...) is one subclass here, registered with
``register()``, and its property in ``docs/config.schema.json``; plan, apply, dump, history and
line-numbered errors come with it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import ProtectedError
from django.utils import timezone

from attempts import memberships, owners
from attempts.models import (
    TERMINAL_STATES,
    ApprovalCondition,
    ApprovalPolicy,
    Attempt,
    Grant,
    Membership,
    NotificationRoute,
    OwnershipRule,
    RetentionRule,
    SlaPolicy,
    SsoGroupRole,
    Tenant,
    Tool,
)
from attempts.states import Actor
from reconciliation.providers.base import ProviderError
from reconciliation.providers.registry import adapter_for

CREATE, UPDATE, REMOVE = "created", "updated", "removed"


class Refused(Exception):
    """A change the database's current state does not allow; the message says what to do."""


@dataclass(frozen=True)
class By:
    """Who applies the file and why: what the history records with each change."""

    actor: Actor
    reason: str


@dataclass
class Change:
    """One object created, updated or removed by applying a file."""

    section: Section
    key: str
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    where: tuple[Any, ...] = ()

    def describe(self) -> str:
        sign = {CREATE: "+", UPDATE: "~", REMOVE: "-"}[self.action]
        text = f"{sign} {self.section.noun} {self.key}"
        if self.action == UPDATE and self.before is not None and self.after is not None:
            fields = [
                f"{name} {_show(self.before.get(name))} -> {_show(self.after.get(name))}"
                for name in self.after
                if self.before.get(name) != self.after.get(name)
            ]
            text += ": " + ", ".join(fields)
        return text


def _show(value: Any) -> str:
    return "(none)" if value is None else repr(value)


class Section:
    """One kind of object in the file. Subclasses set the class attributes and the four
    database methods; ``defaults`` lists every field besides the key fields."""

    name: ClassVar[str]  # the file's key, e.g. "tools"
    noun: ClassVar[str]  # "tool", in plans and errors
    subject_prefix: ClassVar[str]  # history subjects are "<prefix>:<key>"
    key_fields: ClassVar[tuple[str, ...]]
    defaults: ClassVar[dict[str, Any]]
    # field -> section whose key it names (checked against the state after the file is applied)
    references: ClassVar[dict[str, str]] = {}

    def key(self, entry: dict[str, Any]) -> str:
        return "/".join(str(entry[field]) for field in self.key_fields)

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry as stored: key fields, then every field with its default when omitted."""
        normal = {field: entry[field] for field in self.key_fields}
        for field, default in self.defaults.items():
            value = entry.get(field, default)
            if isinstance(default, float) and isinstance(value, int):
                value = float(value)
            normal[field] = value
        return normal

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        """Checks beyond the schema for one normalized entry: (field or None, message)."""
        return []

    def warnings(self, entry: dict[str, Any]) -> list[str]:
        return []

    def final_problems(
        self, entry: dict[str, Any], state: dict[str, dict[str, dict[str, Any]]]
    ) -> list[tuple[str | None, str]]:
        """Checks against every section's entries once the file is applied (``state``:
        section name -> key -> entry)."""
        return []

    def current(self) -> dict[str, dict[str, Any]]:
        """Today's objects as normalized entries, by key."""
        raise NotImplementedError

    def create(self, entry: dict[str, Any], by: By) -> str:
        """Make the object; returns its history subject."""
        raise NotImplementedError

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        raise NotImplementedError

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        raise NotImplementedError

    def subject(self, key: str) -> str:
        return f"{self.subject_prefix}:{key}"

    def dump_entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry as ``dump`` writes it (TOML has no null: None is left out)."""
        return {field: value for field, value in entry.items() if value is not None}


def _refuse_unsettled(attempts: Any, message: str) -> None:
    """Refuse with ``message`` while any of ``attempts`` (a queryset) is not settled."""
    if attempts.exclude(state__in=TERMINAL_STATES).exists():
        raise Refused(message)


def _delete(what: str, hint: str, target: Any) -> None:
    """Delete ``target`` (an object or a queryset); refused, with ``hint``, while a protected
    row still refers to it."""
    try:
        target.delete()
    except ProtectedError:
        raise Refused(f"{what} is still referred to; {hint}") from None


class Tenants(Section):
    name, noun, subject_prefix = "tenants", "tenant", "tenant"
    key_fields = ("slug",)
    defaults: ClassVar[dict[str, Any]] = {"name": None}

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {"slug": entry["slug"], "name": entry.get("name") or entry["slug"]}

    def current(self) -> dict[str, dict[str, Any]]:
        return {t.slug: {"slug": t.slug, "name": t.name} for t in Tenant.objects.order_by("slug")}

    def create(self, entry: dict[str, Any], by: By) -> str:
        Tenant.objects.create(**entry)
        return self.subject(entry["slug"])

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        tenant = Tenant.objects.get(slug=key)
        tenant.name = after["name"]
        tenant.save()
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        if Attempt.objects.filter(tenant_id=key).exists():
            raise Refused(f"tenant {key} has attempts, whose history stays; deactivate its grants")
        if Grant.objects.filter(tenant_id=key).exists():
            raise Refused(f"tenant {key} still has grants: remove them in the same file")
        Tenant.objects.filter(slug=key).delete()  # memberships and SSO roles go with it
        return self.subject(key)


TOOL_DEFAULTS: dict[str, Any] = {
    "description": "",
    "effect_class": None,
    "critical": False,
    "adapter": "http",
    "dispatch_url": "",
    "lookup_url": "",
    "timeout_seconds": 10.0,
    "max_sends": None,
    "active": True,
    "amount_arg": "",
    "currency": "",
    "currency_arg": "",
}


class Tools(Section):
    name, noun, subject_prefix = "tools", "tool", "tool"
    key_fields = ("name",)
    defaults = TOOL_DEFAULTS

    def _instance(self, entry: dict[str, Any]) -> Tool:
        return Tool(**entry)

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        tool = self._instance(entry)
        try:
            tool.full_clean(validate_unique=False)
        except ValidationError as exc:
            return [(field, " ".join(messages)) for field, messages in exc.message_dict.items()]
        try:
            adapter_for(tool)
        except ProviderError as exc:
            return [("adapter", str(exc))]
        return []

    def warnings(self, entry: dict[str, Any]) -> list[str]:
        # Usable by agents but not yet by recovery (no lookup URL yet, say): said, not refused.
        try:
            return adapter_for(self._instance(entry)).check()
        except ProviderError:
            return []

    def current(self) -> dict[str, dict[str, Any]]:
        return {
            tool.name: {"name": tool.name, **{f: getattr(tool, f) for f in TOOL_DEFAULTS}}
            for tool in Tool.objects.order_by("name")
        }

    def create(self, entry: dict[str, Any], by: By) -> str:
        self._instance(entry).save(force_insert=True)
        return self.subject(entry["name"])

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        self._instance(after).save(force_update=True)
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        _refuse_unsettled(
            Attempt.objects.filter(tool_name=key),
            f"tool {key} has unsettled attempts; set active = false instead",
        )
        _delete(f"tool {key}", "remove its grants in the same file", Tool.objects.filter(name=key))
        return self.subject(key)


class Users(Section):
    """People with a password login. Their ``roles`` (tenant -> role) are their memberships,
    recorded in the history as ``membership:<tenant>/<username>`` changes."""

    name, noun, subject_prefix = "users", "user", "user"
    key_fields = ("username",)
    defaults: ClassVar[dict[str, Any]] = {
        "email": "",
        "first_name": "",
        "last_name": "",
        "active": True,
        "staff": False,
        "superuser": False,
        "roles": {},
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "email": "email",
        "first_name": "first_name",
        "last_name": "last_name",
        "active": "is_active",
        "staff": "is_staff",
        "superuser": "is_superuser",
    }

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        normal = super().normalize(entry)
        normal["roles"] = dict(sorted(normal["roles"].items()))
        return normal

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        # staff opens the admin site with what the person's roles allow there
        # (attempts.memberships.RolePermissionBackend); without a role that is nothing.
        if entry["staff"] and not entry["superuser"] and not entry["roles"]:
            return [
                (
                    "staff",
                    "staff = true opens the admin site with the permissions of the person's "
                    'roles, and this user has none: give them roles = { tenant = "role" } '
                    "(or superuser = true for every permission)",
                )
            ]
        return []

    def current(self) -> dict[str, dict[str, Any]]:
        roles: dict[int, dict[str, str]] = {}
        for user_id, tenant, role in Membership.objects.order_by("tenant_id").values_list(
            "user_id", "tenant_id", "role"
        ):
            roles.setdefault(user_id, {})[tenant] = role
        users = get_user_model().objects.order_by("username")
        return {
            user.username: {
                "username": user.username,
                **{field: getattr(user, column) for field, column in self.FIELDS.items()},
                "roles": roles.get(user.pk, {}),
            }
            for user in users
        }

    def create(self, entry: dict[str, Any], by: By) -> str:
        user = get_user_model()(username=entry["username"])
        for field, column in self.FIELDS.items():
            setattr(user, column, entry[field])
        user.set_unusable_password()  # the person sets it: manage.py password_link
        user.save()
        memberships.set_roles(user, entry["roles"], actor=by.actor, reason=by.reason)
        return self.subject(entry["username"])

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        user = get_user_model().objects.get(username=key)
        for field, column in self.FIELDS.items():
            setattr(user, column, after[field])
        user.save()
        memberships.set_roles(user, after["roles"], actor=by.actor, reason=by.reason)
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        user = get_user_model().objects.get(username=key)
        memberships.set_roles(user, {}, actor=by.actor, reason=by.reason)
        _delete(
            f"user {key}", "they own attempts or ownership rules: set active = false instead", user
        )
        return self.subject(key)

    def tenants_named(self, entry: dict[str, Any]) -> list[str]:
        return sorted(entry["roles"])


class Grants(Section):
    name, noun, subject_prefix = "grants", "grant", "grant"
    key_fields = ("tenant", "tool")
    defaults: ClassVar[dict[str, Any]] = {"policy_version": None, "scopes": [], "active": True}
    references: ClassVar[dict[str, str]] = {"tenant": "tenants", "tool": "tools"}

    def current(self) -> dict[str, dict[str, Any]]:
        return {
            f"{g.tenant_id}/{g.tool_id}": {
                "tenant": g.tenant_id,
                "tool": g.tool_id,
                "policy_version": g.policy_version,
                "scopes": list(g.allowed_scopes),
                "active": g.active,
            }
            for g in Grant.objects.order_by("tenant_id", "tool_id")
        }

    def _values(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {
            "policy_version": entry["policy_version"],
            "allowed_scopes": entry["scopes"],
            "active": entry["active"],
        }

    def create(self, entry: dict[str, Any], by: By) -> str:
        Grant.objects.create(
            tenant_id=entry["tenant"], tool_id=entry["tool"], **self._values(entry)
        )
        return self.subject(self.key(entry))

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        grant = Grant.objects.get(tenant_id=after["tenant"], tool_id=after["tool"])
        for field, value in self._values(after).items():
            setattr(grant, field, value)
        grant.save()
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        Grant.objects.get(tenant_id=before["tenant"], tool_id=before["tool"]).delete()
        return self.subject(key)


def routing_problem(
    person: str | None, tenant_pattern: str, state: dict[str, dict[str, dict[str, Any]]]
) -> str | None:
    """Why an entry that routes work of ``tenant_pattern`` to ``person`` must be refused, judged
    on the file's final state (``owners`` holds the rule)."""
    if person is None:
        return None
    return owners.pattern_problem(
        person, tenant_pattern, state["tenants"], state["users"].get(person)
    )


class OwnershipRules(Section):
    """One rule per (tenant pattern, tool pattern); its history subject is its database id."""

    name, noun, subject_prefix = "ownership_rules", "ownership rule", "ownership_rule"
    key_fields = ("tenant", "tool")
    defaults: ClassVar[dict[str, Any]] = {"owner": None, "priority": 100}
    references: ClassVar[dict[str, str]] = {"owner": "users"}

    def final_problems(self, entry, state):
        problem = routing_problem(entry["owner"], entry["tenant"], state)
        return [("owner", problem)] if problem else []

    def current(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for rule in OwnershipRule.objects.select_related("owner").order_by("priority", "id"):
            entry = {
                "tenant": rule.tenant_pattern,
                "tool": rule.tool_pattern,
                "owner": rule.owner.get_username(),
                "priority": rule.priority,
            }
            found.setdefault(self.key(entry), entry)  # a duplicate pair never wins: not listed
        return found

    def _rule(self, entry: dict[str, Any]) -> OwnershipRule:
        return (
            OwnershipRule.objects.filter(tenant_pattern=entry["tenant"], tool_pattern=entry["tool"])
            .order_by("priority", "id")
            .first()
        )

    def create(self, entry: dict[str, Any], by: By) -> str:
        owner = get_user_model().objects.get(username=entry["owner"])
        rule = OwnershipRule.objects.create(
            tenant_pattern=entry["tenant"],
            tool_pattern=entry["tool"],
            owner=owner,
            priority=entry["priority"],
        )
        return f"{self.subject_prefix}:{rule.pk}"

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        rule = self._rule(after)
        rule.owner = get_user_model().objects.get(username=after["owner"])
        rule.priority = after["priority"]
        rule.save()
        return f"{self.subject_prefix}:{rule.pk}"

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        rule = self._rule(before)
        subject = f"{self.subject_prefix}:{rule.pk}"
        rule.delete()
        return subject


class SsoGroups(Section):
    """Identity-provider groups and the roles they give (``attempts.sso``)."""

    name, noun, subject_prefix = "sso_groups", "SSO group", "sso_group"
    key_fields = ("group",)
    defaults: ClassVar[dict[str, Any]] = {"roles": {}}

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {"group": entry["group"], "roles": dict(sorted(entry.get("roles", {}).items()))}

    def current(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for group, tenant, role in SsoGroupRole.objects.order_by("group", "tenant_id").values_list(
            "group", "tenant_id", "role"
        ):
            found.setdefault(group, {"group": group, "roles": {}})["roles"][tenant] = role
        return found

    def create(self, entry: dict[str, Any], by: By) -> str:
        return self.update(entry["group"], {"roles": {}}, entry, by)

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        SsoGroupRole.objects.filter(group=key).exclude(tenant_id__in=after["roles"]).delete()
        for tenant, role in after["roles"].items():
            SsoGroupRole.objects.update_or_create(
                group=key, tenant_id=tenant, defaults={"role": role}
            )
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        SsoGroupRole.objects.filter(group=key).delete()
        return self.subject(key)

    def tenants_named(self, entry: dict[str, Any]) -> list[str]:
        return sorted(entry["roles"])


# In the order changes are made (removals run in the reverse order, after every other change).
SECTIONS: list[Section] = [Tenants(), Tools(), Users(), Grants(), OwnershipRules(), SsoGroups()]


def register(section: Section, *, after: str | None = None) -> None:
    """Add a section (placed after the section named ``after``, else last)."""
    names = [existing.name for existing in SECTIONS]
    if section.name in names:
        raise ValueError(f"a section named {section.name!r} is already registered")
    SECTIONS.insert(names.index(after) + 1 if after else len(SECTIONS), section)


# --- SLA policies and notification routes -----------------------------------------------------

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> dt.timedelta:
    """``"1d12h"``, ``"90m"``, ``"45s"``: the file's durations (the schema checks the form)."""
    match = _DURATION.match(text)
    if not match or not text:
        raise ValueError(f"{text!r} is not a duration such as 4h, 90m or 1d12h")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def format_duration(value: dt.timedelta) -> str:
    """The canonical form ``dump`` writes: largest units first, ``0s`` for nothing."""
    left, parts = int(value.total_seconds()), []
    for unit, size in _UNITS:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


class SlaPolicies(Section):
    """How old UNKNOWN and MANUAL_REVIEW work may grow per tool (``tenant = "*"``: every tenant
    without its own policy), and who a breach is escalated to (``attempts.SlaPolicy``)."""

    name, noun, subject_prefix = "sla_policies", "SLA policy", "sla_policy"
    key_fields = ("tool", "tenant")
    AGES: ClassVar[tuple[str, ...]] = (
        "unknown_warn_after",
        "unknown_breach_after",
        "review_warn_after",
        "review_breach_after",
    )
    defaults: ClassVar[dict[str, Any]] = {
        "unknown_warn_after": "1h",
        "unknown_breach_after": "4h",
        "review_warn_after": "4h",
        "review_breach_after": "1d",
        "escalate_to": None,
    }
    references: ClassVar[dict[str, str]] = {
        "tool": "tools",
        "tenant": "tenants",
        "escalate_to": "users",
    }
    wildcard_fields = ("tenant",)

    def key(self, entry: dict[str, Any]) -> str:
        return f"{entry['tool']}/{entry.get('tenant', '*')}"

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        normal = super().normalize({"tenant": "*", **entry})
        for age in self.AGES:
            try:
                normal[age] = format_duration(parse_duration(normal[age]))
            except ValueError:
                pass  # reported by problems() with the field's line
        return normal

    def final_problems(self, entry, state):
        problem = routing_problem(entry["escalate_to"], entry["tenant"], state)
        return [("escalate_to", problem)] if problem else []

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        found: list[tuple[str | None, str]] = []
        ages: dict[str, dt.timedelta] = {}
        for age in self.AGES:
            try:
                ages[age] = parse_duration(entry[age])
            except ValueError as exc:
                found.append((age, str(exc)))
                continue
            if ages[age] <= dt.timedelta(0):
                found.append((age, f"{age} must be longer than 0s"))
        for state in ("unknown", "review"):
            warn, breach = ages.get(f"{state}_warn_after"), ages.get(f"{state}_breach_after")
            if warn is not None and breach is not None and warn > breach:
                found.append(
                    (
                        f"{state}_warn_after",
                        f"{state}_warn_after ({entry[f'{state}_warn_after']}) is later than "
                        f"{state}_breach_after ({entry[f'{state}_breach_after']})",
                    )
                )
        return found

    def current(self) -> dict[str, dict[str, Any]]:
        found = {}
        for policy in SlaPolicy.objects.select_related("escalate_to").order_by(
            "tool_id", "tenant_id"
        ):
            entry = {
                "tool": policy.tool_id,
                "tenant": policy.tenant_id or "*",
                **{age: format_duration(getattr(policy, age)) for age in self.AGES},
                "escalate_to": policy.escalate_to.get_username() if policy.escalate_to else None,
            }
            found[self.key(entry)] = entry
        return found

    def _fill(self, policy: SlaPolicy, entry: dict[str, Any]) -> SlaPolicy:
        for age in self.AGES:
            setattr(policy, age, parse_duration(entry[age]))
        policy.escalate_to = (
            get_user_model().objects.get(username=entry["escalate_to"])
            if entry["escalate_to"]
            else None
        )
        return policy

    def _find(self, entry: dict[str, Any]) -> SlaPolicy:
        tenant = None if entry["tenant"] == "*" else entry["tenant"]
        return SlaPolicy.objects.get(tool_id=entry["tool"], tenant_id=tenant)

    def create(self, entry: dict[str, Any], by: By) -> str:
        tenant = None if entry["tenant"] == "*" else entry["tenant"]
        self._fill(SlaPolicy(tool_id=entry["tool"], tenant_id=tenant), entry).save()
        return self.subject(self.key(entry))

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        self._fill(self._find(after), after).save()
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        self._find(before).delete()  # its open escalations go with it (CASCADE)
        return self.subject(key)


class NotificationRoutes(Section):
    """Who else is told of notices about matching attempts (``attempts.NotificationRoute``)."""

    name, noun, subject_prefix = "notification_routes", "notification route", "notification_route"
    key_fields = ("name",)
    defaults: ClassVar[dict[str, Any]] = {
        "tenant": "*",
        "tool": "*",
        "kinds": [],
        "notify": [],
        "slack_channel": "",
        "active": True,
    }
    references: ClassVar[dict[str, str]] = {"notify": "users"}

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        normal = super().normalize(entry)
        normal["kinds"] = sorted(set(normal["kinds"]))
        normal["notify"] = sorted(set(normal["notify"]))
        return normal

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        if not entry["notify"]:
            return [("notify", "a route needs at least one username in notify")]
        return []

    def current(self) -> dict[str, dict[str, Any]]:
        return {
            route.name: {
                "name": route.name,
                "tenant": route.tenant_pattern,
                "tool": route.tool_pattern,
                "kinds": sorted(route.kinds),
                "notify": sorted(p.get_username() for p in route.people.all()),
                "slack_channel": route.slack_channel,
                "active": route.active,
            }
            for route in NotificationRoute.objects.prefetch_related("people").order_by("name")
        }

    def _save(self, route: NotificationRoute, entry: dict[str, Any]) -> str:
        route.tenant_pattern, route.tool_pattern = entry["tenant"], entry["tool"]
        route.kinds, route.active = entry["kinds"], entry["active"]
        route.slack_channel = entry["slack_channel"]
        route.save()
        route.people.set(get_user_model().objects.filter(username__in=entry["notify"]))
        return self.subject(route.name)

    def create(self, entry: dict[str, Any], by: By) -> str:
        return self._save(NotificationRoute(name=entry["name"]), entry)

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        return self._save(NotificationRoute.objects.get(name=key), after)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        NotificationRoute.objects.filter(name=key).delete()
        return self.subject(key)


register(SlaPolicies())
register(NotificationRoutes())


class ApprovalPolicies(Section):
    """Approval before dispatch (protocol section 11, ``attempts.models.ApprovalPolicy``): a
    tool's calls whose arguments meet a CEL condition wait for approvers. Durations are in
    seconds. A change of any rule gives the policy a new version, which voids approvals given
    under the old one."""

    name, noun, subject_prefix = "approval_policies", "approval policy", "approval_policy"
    key_fields = ("name",)
    defaults: ClassVar[dict[str, Any]] = {
        "tool": None,
        "tenants": [],
        "condition": "",
        "approvals_needed": 1,
        "approver_role": "reviewer",
        "approver_group": "",
        "approval_ttl_seconds": 3600,
        "max_wait_seconds": 86400,
        "active": True,
    }
    references: ClassVar[dict[str, str]] = {"tool": "tools"}
    # How far back ``plan`` looks for attempts a new or changed condition would have held.
    LOOK_BACK = dt.timedelta(days=7)
    LOOK_BACK_ATTEMPTS = 500

    def normalize(self, entry: dict[str, Any]) -> dict[str, Any]:
        normal = super().normalize(entry)
        normal["tenants"] = sorted(set(normal["tenants"]))
        normal["condition"] = normal["condition"].strip()
        return normal

    def _fill(self, policy: ApprovalPolicy, entry: dict[str, Any]) -> ApprovalPolicy:
        policy.tool_id = entry["tool"]
        policy.tenants = list(entry["tenants"])
        policy.condition = entry["condition"]
        policy.approvals_needed = entry["approvals_needed"]
        policy.approver_role = entry["approver_role"]
        policy.approver_group = entry["approver_group"]
        policy.approval_ttl = dt.timedelta(seconds=entry["approval_ttl_seconds"])
        policy.max_wait = dt.timedelta(seconds=entry["max_wait_seconds"])
        policy.active = entry["active"]
        return policy

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        # The tool may be new in the same file: its critical flag is checked again at apply.
        try:
            self._fill(ApprovalPolicy(name=entry["name"]), entry).clean()
        except ValidationError as exc:
            names = {"approval_ttl": "approval_ttl_seconds", "max_wait": "max_wait_seconds"}
            return [
                (names.get(field, field), " ".join(messages))
                for field, messages in exc.message_dict.items()
            ]
        return []

    def current(self) -> dict[str, dict[str, Any]]:
        return {
            p.name: {
                "name": p.name,
                "tool": p.tool_id,
                "tenants": sorted(p.tenants),
                "condition": p.condition,
                "approvals_needed": p.approvals_needed,
                "approver_role": p.approver_role,
                "approver_group": p.approver_group,
                "approval_ttl_seconds": p.approval_ttl_seconds,
                "max_wait_seconds": p.max_wait_seconds,
                "active": p.active,
            }
            for p in ApprovalPolicy.objects.order_by("name")
        }

    def _save(self, policy: ApprovalPolicy, entry: dict[str, Any]) -> None:
        self._fill(policy, entry)
        try:
            policy.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise Refused(
                f"approval policy {entry['name']}: "
                + "; ".join(f"{f}: {' '.join(m)}" for f, m in exc.message_dict.items())
            ) from None
        policy.save()

    def create(self, entry: dict[str, Any], by: By) -> str:
        self._save(ApprovalPolicy(name=entry["name"]), entry)
        return self.subject(entry["name"])

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        self._save(ApprovalPolicy.objects.get(name=key), after)
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        _refuse_unsettled(
            Attempt.objects.filter(approval_policy_id=key),
            f"approval policy {key} holds unsettled attempts; set active = false",
        )
        _delete(
            f"approval policy {key}",
            "it held attempts: set active = false instead",
            ApprovalPolicy.objects.filter(name=key),
        )
        return self.subject(key)

    def tenants_named(self, entry: dict[str, Any]) -> list[str]:
        return list(entry["tenants"])

    def notes(self, entry: dict[str, Any]) -> list[str]:
        """For a new or changed rule: which recent attempts of its tool it would have held."""
        before = self.current().get(entry["name"])
        rule = ("tool", "tenants", "condition", "active")
        if not entry["active"] or (before and all(before[f] == entry[f] for f in rule)):
            return []
        try:
            condition = ApprovalCondition(entry["condition"])
        except ValidationError:
            return []
        since = timezone.now() - self.LOOK_BACK
        recent = Attempt.objects.filter(tool_name=entry["tool"], created_at__gte=since)
        if entry["tenants"]:
            recent = recent.filter(tenant_id__in=entry["tenants"])
        rows = list(
            recent.order_by("-created_at").values_list("attempt_id", "tenant_id", "args")[
                : self.LOOK_BACK_ATTEMPTS
            ]
        )
        held = [
            attempt_id
            for attempt_id, tenant, args in rows
            if condition.evaluate(args, tenant=tenant, tool_name=entry["tool"])[0]
        ]
        shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
        return [
            f"approval policy {entry['name']} would have held {len(held)} of the last "
            f"{len(rows)} {entry['tool']} attempts (7 days)" + (f": {shown}" if held else "")
        ]


register(ApprovalPolicies())


# --- Retention rules (reconciliation/archive, docs/archive.md) --------------------------------


class RetentionRules(Section):
    """How many days one tenant's settled, sealed attempts of one tool stay in the database
    before ``ledgerweb archive run`` moves them to an archive (``attempts.RetentionRule``)."""

    name, noun, subject_prefix = "retention_rules", "retention rule", "retention_rule"
    key_fields = ("tenant", "tool")
    defaults: ClassVar[dict[str, Any]] = {"archive_after_days": None}
    references: ClassVar[dict[str, str]] = {"tenant": "tenants", "tool": "tools"}

    def problems(self, entry: dict[str, Any]) -> list[tuple[str | None, str]]:
        days = entry["archive_after_days"]
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            return [
                (
                    "archive_after_days",
                    "archive_after_days must be a whole number of days, 1 or more",
                )
            ]
        return []

    def current(self) -> dict[str, dict[str, Any]]:
        return {
            f"{rule.tenant_id}/{rule.tool_id}": {
                "tenant": rule.tenant_id,
                "tool": rule.tool_id,
                "archive_after_days": rule.archive_after_days,
            }
            for rule in RetentionRule.objects.order_by("tenant_id", "tool_id")
        }

    def notes(self, entry: dict[str, Any]) -> list[str]:
        """How many attempts the rule would archive on the next run, said beside the plan."""
        from reconciliation.archive.retention import eligible_count

        days = entry["archive_after_days"]
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            return []
        count = eligible_count(tenant=entry["tenant"], tool=entry["tool"], days=days)
        return [
            f"retention rule {self.key(entry)} would archive {count} attempts on the next "
            "`ledgerweb archive run`"
        ]

    def create(self, entry: dict[str, Any], by: By) -> str:
        RetentionRule(
            tenant_id=entry["tenant"],
            tool_id=entry["tool"],
            archive_after_days=entry["archive_after_days"],
        ).save()
        return self.subject(self.key(entry))

    def update(self, key: str, before: dict[str, Any], after: dict[str, Any], by: By) -> str:
        rule = RetentionRule.objects.get(tenant_id=after["tenant"], tool_id=after["tool"])
        rule.archive_after_days = after["archive_after_days"]
        rule.save()
        return self.subject(key)

    def remove(self, key: str, before: dict[str, Any], by: By) -> str:
        RetentionRule.objects.get(tenant_id=before["tenant"], tool_id=before["tool"]).delete()
        return self.subject(key)


register(RetentionRules())
