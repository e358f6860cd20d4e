"""The ledger's records: attempts, their append-only chained history, and who may do what.

Only ``attempts.states`` changes ``Attempt.state``; everything else asks it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import rfc8785
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import connection, models, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Subquery, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Collate, Upper

from attempts import verify_export
from attempts.money import known_currency

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


class State(models.TextChoices):
    INTENT_RECORDED = "INTENT_RECORDED", "Intent recorded"
    DISPATCHED = "DISPATCHED", "Dispatched"
    OUTCOME_CONFIRMED = "OUTCOME_CONFIRMED", "Outcome confirmed"
    FAILED_RETRYABLE = "FAILED_RETRYABLE", "Failed (retryable)"
    UNKNOWN = "UNKNOWN", "Unknown"
    AWAITING_APPROVAL = "AWAITING_APPROVAL", "Awaiting approval"
    MANUAL_REVIEW = "MANUAL_REVIEW", "Manual review"
    FAILED = "FAILED", "Failed"
    RECONCILED = "RECONCILED", "Reconciled"


TERMINAL_STATES = frozenset({State.OUTCOME_CONFIRMED, State.FAILED, State.RECONCILED})
# States the recovery worker looks at when their next check is due.
RECOVERABLE_STATES = (
    State.INTENT_RECORDED,
    State.DISPATCHED,
    State.UNKNOWN,
    State.FAILED_RETRYABLE,
)
ATTENTION_STATES = (State.UNKNOWN, State.MANUAL_REVIEW)
# The resting states, where a person must act: an attempt in them always has an owner (protocol
# section 3); it may be given to someone else but never unassigned. (An UNKNOWN attempt also
# gets an owner when it enters UNKNOWN, but the worker may still settle it without anyone.)
OWNED_STATES = (State.MANUAL_REVIEW, State.AWAITING_APPROVAL)
# Sent or about to be sent by an agent that may still be at work: stale after STALE_AFTER.
IN_FLIGHT_STATES = (State.INTENT_RECORDED, State.DISPATCHED)
# One person's approval, of a held intent or of a linked attempt or retry (recorded without a
# move): the only record an approval check reads (``Attempt.approval_verdicts``).
APPROVAL_ACTION = "attempt.approval"
# The ``kind`` of an approval event of a held intent (bound to args_hash, policy version and
# an expiry); the others (linked_retry, linked_attempt) approve an attempt in review.
HELD_APPROVAL_KINDS = ("held", "edit_and_approve")
# Field-only events that change what an operator decides on (an open form is stale after one).
DECISIVE_ACTIONS = (
    "attempt.owner_changed",
    "attempt.unassigned",
    APPROVAL_ACTION,
    "attempt.provider_request_attached",
)
# Shortest search term matched as a prefix (shorter ones match exactly only).
MIN_PREFIX = 4
PREFIX_FIELDS = ("idempotency_key", "provider_request_id", "task_id", "attempt_id", "args_hash")


class EffectClass(models.TextChoices):
    IDEMPOTENT = "idempotent", "Idempotent (provider honours the key, has a lookup)"
    RECONCILABLE = "reconcilable", "Reconcilable (lookup only)"
    MANUAL = "manual", "Manual (no key, no lookup)"


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

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# What an attempt id may look like in a URL or a form (ids are ``att_`` + 26 Crockford letters).
ATTEMPT_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def new_attempt_id() -> str:
    """A ULID-style id: 48 bits of milliseconds then 80 random bits, so ids sort by creation."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "att_" + "".join(reversed(chars))


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


def adapter_names() -> list[str]:
    """The adapter names a tool may choose: ``settings.LEDGER["ADAPTERS"]``, never a path."""
    return sorted(settings.LEDGER["ADAPTERS"])


def validate_adapter_name(value: str) -> None:
    if value not in settings.LEDGER["ADAPTERS"]:
        raise ValidationError(
            f"unknown adapter {value!r}: choose one of {', '.join(adapter_names())}"
        )


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


# A top-level argument's name a display hint may point at (a JSON key path never: no "__").
ARGUMENT_NAME = RegexValidator(
    r"^(?!.*__)[A-Za-z][A-Za-z0-9_]*$", "a top-level argument's name (letters, digits, _)"
)


class Tool(models.Model):
    """A tool agents may call, its effect class, and how to reach its provider.

    ``adapter`` names one of the adapters settings list (``LEDGER["ADAPTERS"]``): ``http`` is
    the generic HTTP provider protocol, ``stripe`` Stripe payment intents (see
    ``reconciliation/providers``).
    """

    name = models.CharField(primary_key=True, max_length=100)
    description = models.CharField(max_length=300, blank=True)
    effect_class = models.CharField(max_length=16, choices=EffectClass.choices)
    critical = models.BooleanField(
        default=False,
        help_text="Payments, deletions, messages, deployments: never retried without a person, "
        "and a linked retry needs two distinct reviewers.",
    )
    adapter = models.CharField(
        max_length=200,
        default="http",
        validators=[validate_adapter_name],
        help_text="One of the adapters this deployment lists (LEDGER['ADAPTERS']).",
    )
    dispatch_url = models.URLField(max_length=500, blank=True)
    lookup_url = models.URLField(max_length=500, blank=True)
    timeout_seconds = models.FloatField(default=10.0)
    max_sends = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Overrides LEDGER['MAX_SENDS'] for this tool."
    )
    active = models.BooleanField(default=True)
    # Display hints (attempts/money.py): which argument is an amount in the currency's minor
    # units, and its currency, given as a code or named by another argument. Display only.
    amount_arg = models.CharField(
        max_length=100,
        blank=True,
        validators=[ARGUMENT_NAME],
        help_text="The argument holding an amount in minor units.",
    )
    currency = models.CharField(
        max_length=3,
        blank=True,
        validators=[RegexValidator(r"^[A-Z]{3}$", "an ISO 4217 code such as EUR")],
        help_text="The amount's currency (ISO 4217), when every call uses the same one.",
    )
    currency_arg = models.CharField(
        max_length=100,
        blank=True,
        validators=[ARGUMENT_NAME],
        help_text="The argument holding the currency's code.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Display hints that can be read: an amount names its currency one way."""
        if self.currency and self.currency_arg:
            raise ValidationError({"currency_arg": "give the currency or its argument, not both"})
        if self.amount_arg and not (self.currency or self.currency_arg):
            raise ValidationError(
                {"amount_arg": "an amount needs its currency: set currency or currency_arg"}
            )
        if self.currency and not known_currency(self.currency):
            raise ValidationError({"currency": f"{self.currency} is not an ISO 4217 currency"})

    @property
    def approvals_needed(self) -> int:
        """The one home of "a critical tool needs two approvals": distinct reviewers who must
        approve a linked attempt or retry of this tool."""
        return 2 if self.critical else 1

    @classmethod
    def approvals_needed_for(cls, tool_name: str) -> int:
        """``approvals_needed`` by name (an unconfigured tool needs one)."""
        critical = cls.objects.filter(name=tool_name).values_list("critical", flat=True).first()
        return cls(critical=bool(critical)).approvals_needed


class ByteOrderCharField(models.CharField):
    """A CharField compared in byte order: ``COLLATE "C"`` on PostgreSQL, so its own index
    serves both equality and a prefix search's range (a range under the database's own
    collation is not a prefix range). SQLite compares bytes already (BINARY), so there it is a
    plain CharField."""

    def db_parameters(self, connection):
        params = super().db_parameters(connection)
        if connection.vendor == "postgresql":
            params["collation"] = "C"
        return params


def search_key(field: str) -> Any:
    """The expression a prefix search reads and orders by: the column in byte order. On
    PostgreSQL that is ``column COLLATE "C"``: the byte-order columns' own indexes
    (``ByteOrderCharField``, migration 0013; the planner drops a collation the column already
    has) and ``attempt_id_prefix_idx`` for ``attempt_id``, which foreign keys compare with
    columns of the database's collation. On SQLite the column itself (binary collation, its
    ordinary index)."""
    if connection.vendor == "postgresql":
        return Collate(F(field), "C")
    return F(field)


def prefix_value(term: str, field: str) -> str | None:
    """``term`` as ``field`` stores it (hashes are lower-case hex), or None when it cannot
    be a prefix of that field."""
    if field == "args_hash":
        value = term.lower()
        return value if all(c in "0123456789abcdef" for c in value) else None
    if field == "attempt_id":
        return canonical_attempt_id(term)
    return term


def canonical_attempt_id(term: str) -> str:
    """An attempt id as the ledger writes it (``att_`` then upper-case Crockford base32), from
    however a person typed it: the ids the ledger makes match whatever their case. Keys, task
    ids and provider ids are the agents' and providers' own, where case matters."""
    if term[:4].lower() == "att_":
        return "att_" + term[4:].upper()
    return term


class Grant(models.Model):
    """What a tenant may do with a tool now: the authority intents are recorded and sent under."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="grants")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="grants")
    policy_version = models.CharField(max_length=64)
    allowed_scopes = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool"], name="grant_unique_tenant_tool")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_id}@{self.policy_version}"


class OwnershipRule(models.Model):
    """Who owns attention work: tenant and tool glob patterns to a person. Lowest priority wins."""

    tenant_pattern = models.CharField(max_length=100, default="*")
    tool_pattern = models.CharField(max_length=100, default="*")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    priority = models.PositiveIntegerField(default=100)

    class Meta:
        ordering = ["priority", "id"]

    def __str__(self) -> str:
        return f"{self.tenant_pattern}/{self.tool_pattern} -> {self.owner}"


class ApprovalCondition:
    """A policy's condition: a CEL expression over ``args`` (the normalized arguments),
    ``tenant`` and ``tool_name``, compiled once (by the ``cel`` package, a maintained
    implementation; never ``eval``). An empty condition always holds."""

    VARIABLES = frozenset({"args", "tenant", "tool_name"})
    # Top-level argument names the expression mentions: shown beside a held attempt (display
    # only; CEL alone decides).
    _MENTIONED = re.compile(r"\bargs\.([A-Za-z_][A-Za-z0-9_]*)")

    def __init__(self, source: str) -> None:
        import cel

        self.source = source.strip()
        self.program = None
        if self.source:
            try:
                self.program = cel.compile(self.source)
            except (ValueError, TypeError, RuntimeError) as exc:
                raise ValidationError(f"the condition is not valid CEL: {exc}") from None
            unknown = set(self.program.references().get("variables", [])) - self.VARIABLES
            if unknown:
                raise ValidationError(
                    f"the condition names {', '.join(sorted(unknown))}; it may use "
                    f"{', '.join(sorted(self.VARIABLES))} only"
                )

    def evaluate(self, args: Any, *, tenant: str, tool_name: str) -> tuple[bool, dict[str, Any]]:
        """(holds, what decided it). Fail closed: an expression that raises (a missing field,
        a type error) or does not answer true or false holds the call, with the error shown."""
        if self.program is None:
            return True, {}
        mentioned = {}
        if isinstance(args, dict):
            for name in dict.fromkeys(self._MENTIONED.findall(self.source)):
                mentioned[name] = args.get(name)
        try:
            result = self.program.execute({"args": args, "tenant": tenant, "tool_name": tool_name})
        except Exception as exc:  # noqa: BLE001 (any evaluation error holds the call)
            return True, {"values": mentioned, "error": f"{type(exc).__name__}: {exc}"[:300]}
        if not isinstance(result, bool):
            return True, {"values": mentioned, "error": f"the condition gave {result!r}"[:300]}
        return result, {"values": mentioned}


_CONDITIONS: dict[tuple[str, int, str], ApprovalCondition] = {}


class ApprovalPolicyQuerySet(models.QuerySet):
    def holding(
        self, *, tenant: str, tool_name: str, args: Any
    ) -> tuple[ApprovalPolicy, dict[str, Any]] | None:
        """The policy that holds this intent before dispatch, with what decided it, or None.
        One indexed query per intent; each condition is compiled once per process and version.
        Several matching policies: the one needing most approvals (then by name) holds it."""
        found = []
        for policy in self.filter(tool_id=tool_name, active=True):
            if policy.tenants and tenant not in policy.tenants:
                continue
            holds, decided = policy.condition_program().evaluate(
                args, tenant=tenant, tool_name=tool_name
            )
            if holds:
                found.append((policy, decided))
        if not found:
            return None
        found.sort(key=lambda pair: (-pair[0].approvals_needed, pair[0].name))
        return found[0]


class ApprovalPolicy(models.Model):
    """Approval before dispatch (protocol section 11): calls of ``tool`` (in ``tenants``, or
    every tenant) whose normalized arguments meet ``condition`` wait in AWAITING_APPROVAL for
    ``approvals_needed`` distinct people holding ``approver_role`` (and, when set, in the
    identity-provider group ``approver_group``). An approval counts for ``approval_ttl``; past
    ``max_wait`` without being approved and claimed the attempt is FAILED ``approval_expired``.
    ``version`` goes up whenever a rule changes: approvals are bound to it."""

    name = models.SlugField(primary_key=True, max_length=100)
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="approval_policies")
    tenants = models.JSONField(
        default=list, blank=True, help_text="Tenant slugs it applies to (empty: every tenant)."
    )
    condition = models.TextField(
        blank=True,
        default="",
        help_text="CEL over args, tenant and tool_name, e.g. args.amount_cents > 100000 "
        "(empty: every call).",
    )
    approvals_needed = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct approvers needed (at least two on a critical tool)."
    )
    approver_role = models.CharField(max_length=16, choices=Role.choices, default=Role.REVIEWER)
    approver_group = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Identity-provider group an approver must also be in (empty: any).",
    )
    approval_ttl = models.DurationField(default=dt.timedelta(hours=1))
    max_wait = models.DurationField(default=dt.timedelta(hours=24))
    active = models.BooleanField(default=True)
    version = models.PositiveIntegerField(default=1, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ApprovalPolicyQuerySet.as_manager()

    # A change of any of these is a new version: approvals given under the old one are void.
    RULE_FIELDS = (
        "tool_id",
        "tenants",
        "condition",
        "approvals_needed",
        "approver_role",
        "approver_group",
        "approval_ttl",
        "max_wait",
    )

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["tool", "active"], name="approvalpolicy_tool_idx")]
        verbose_name_plural = "approval policies"

    def __str__(self) -> str:
        return f"{self.name} ({self.tool_id} v{self.version})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        database = kwargs.get("using") or self._state.db or "default"
        stored = (
            type(self)
            .objects.using(database)
            .filter(pk=self.pk)
            .values(*self.RULE_FIELDS, "version")
            .first()
            if self.pk and not self._state.adding
            else None
        )
        if stored is not None and any(stored[n] != getattr(self, n) for n in self.RULE_FIELDS):
            self.version = stored["version"] + 1
        super().save(*args, **kwargs)

    def clean(self) -> None:
        errors: dict[str, str] = {}
        try:
            ApprovalCondition(self.condition)
        except ValidationError as exc:
            errors["condition"] = " ".join(exc.messages)
        if self.approvals_needed < 1:
            errors["approvals_needed"] = "at least one approval"
        tool = Tool.objects.filter(name=self.tool_id).first() if self.tool_id else None
        if tool is not None and self.approvals_needed < tool.approvals_needed:
            errors["approvals_needed"] = (
                f"{self.tool_id} is critical: at least {tool.approvals_needed} approvals "
                "(four eyes)"
            )
        if self.approver_role == Role.VIEWER:
            errors["approver_role"] = "a viewer cannot approve: operator, reviewer or admin"
        if not isinstance(self.tenants, list) or not all(isinstance(t, str) for t in self.tenants):
            errors["tenants"] = "a list of tenant slugs"
        if self.approval_ttl is not None and self.approval_ttl <= dt.timedelta(0):
            errors["approval_ttl"] = "must be positive"
        if self.max_wait is not None and self.max_wait <= dt.timedelta(0):
            errors["max_wait"] = "must be positive"
        if errors:
            raise ValidationError(errors)

    @property
    def approval_ttl_seconds(self) -> int:
        return int(self.approval_ttl.total_seconds())

    @property
    def max_wait_seconds(self) -> int:
        return int(self.max_wait.total_seconds())

    def sla_level(self, age: dt.timedelta) -> str:
        """'' in time, 'warn' past half the maximum wait, 'breach' past four fifths of it: the
        colours the inbox shows, as other screens show their SLAs."""
        if age >= self.max_wait * 0.8:
            return "breach"
        if age >= self.max_wait * 0.5:
            return "warn"
        return ""

    def condition_program(self) -> ApprovalCondition:
        key = (self.name, self.version, self.condition)
        program = _CONDITIONS.get(key)
        if program is None:
            program = _CONDITIONS[key] = ApprovalCondition(self.condition)
        return program

    def approvals_for(self, tool_name: str, *, critical: bool | None = None) -> int:
        """The one home of how many approvals a call of ``tool_name`` held by this policy
        needs: the policy's count, and never fewer than the tool's four-eyes rule
        (``critical``: the tool's flag, when the caller has read it already)."""
        if critical is None:
            by_tool = Tool.approvals_needed_for(tool_name)
        else:
            by_tool = Tool(critical=critical).approvals_needed
        return max(self.approvals_needed, by_tool)

    def approver_rule_digest(self) -> str:
        """SHA-256 (RFC 8785) of who may approve under this version (role and group): what a
        hold records in the chain, so an auditor can tell which rule applied without the
        policy table."""
        rule = {"approver_role": self.approver_role, "approver_group": self.approver_group}
        return hashlib.sha256(rfc8785.dumps(rule)).hexdigest()

    def hold_record(self, tool_name: str, *, critical: bool | None = None) -> dict[str, Any]:
        """What a hold (and each move that relied on approvals) records in the attempt's chain,
        in the clear (``verify_export.PUBLIC_DETAILS``): the policy, its version, how many
        approvals it requires and the digest of who may approve. The verifiers check the
        approvals against it offline."""
        return {
            "name": self.name,
            "version": self.version,
            "needed": self.approvals_for(tool_name, critical=critical),
            "approver_rule": self.approver_rule_digest(),
        }

    def may_approve(self, user: Any, tenant: str, *, fresh: bool = True) -> tuple[bool, str]:
        """Whether ``user`` may approve under this policy in ``tenant``, and why not: roles and
        groups read fresh, or (``fresh=False``) as ``read_people`` read them for this request."""
        if not has_role(user, tenant, self.approver_role, fresh=fresh):
            return False, f"this needs the {self.approver_role} role in tenant {tenant}"
        if self.approver_group and self.approver_group not in sso_groups(user, fresh=fresh):
            return False, f"this needs membership of the group {self.approver_group}"
        return True, ""


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


# An event that changed its attempt's state: the one meaning of "a move" (approvals count from
# the last one; a form is stale after one).
MOVED = ~Q(from_state=F("to_state"))


def attention_age(created_at: dt.datetime, now: dt.datetime) -> dt.timedelta:
    """How old attention work is, for its SLA and what the screens show: counted from when the
    attempt was recorded, whatever state it passed through since."""
    return now - created_at


# A queue's total is exact up to this many rows per lane; beyond it, an estimate.
QUEUE_COUNT_CAP = 1000


class AttemptQuerySet(models.QuerySet):
    def visible_to(self, user: Any, minimum: str = Role.VIEWER) -> AttemptQuerySet:
        """The one place tenant scoping happens for people: views, exports, counts, the admin
        and notifications use it. ``minimum`` narrows to tenants where the role is at least it."""
        return self.filter(tenant_id__in=tenants_where(user, minimum))

    def awaiting_approval_of(self, user: Any) -> AttemptQuerySet:
        """Attempts in MANUAL_REVIEW that wait for this reviewer's approval: a prepared linked
        attempt, or a linked retry one reviewer approved already (critical tools need two), and
        that this person has not approved since the attempt last moved."""
        since = Attempt.last_move_subquery()
        # Most attempts in review wait for no one: the few that may are read from two small
        # indexes (attempt_awaiting_idx, event_approval_idx), and only their last move is looked
        # up, so the cost follows the approvals, not the review backlog.
        me = user.get_username()
        every = AttemptEvent.objects.filter(action=APPROVAL_ACTION)
        approvals = every.filter(attempt=OuterRef("pk"), id__gt=OuterRef("_last_move"))
        candidates = (
            Attempt.objects.filter(awaiting_approval=True, state=State.MANUAL_REVIEW)
            .values("pk")
            .union(every.values("attempt_id"))
        )
        return (
            self.visible_to(user, Role.REVIEWER)
            .filter(state=State.MANUAL_REVIEW, pk__in=candidates)
            .alias(_last_move=Coalesce(since, 0))
            .filter(
                Q(awaiting_approval=True)
                | (Q(pk__in=every.values("attempt_id")) & Q(Exists(approvals)))
            )
            .exclude(
                Q(pk__in=every.filter(actor=me).values("attempt_id"))
                & Q(Exists(approvals.filter(actor=me)))
            )
        )

    def held_for(self, user: Any, which: str = "me", now: Any = None) -> AttemptQuerySet:
        """Attempts an approval policy holds in AWAITING_APPROVAL, oldest first, within the
        user's tenants: ``me``, those this person may approve now (the policy's role and group,
        not recorded by them, not approved by them already under the current version); ``group``,
        those whose policy names an identity-provider group the person is in; ``all``. Roles
        and groups are as this request read them (``read_people`` reads them fresh); approving
        reads them again."""
        from django.utils import timezone

        # Only an approval policy puts an attempt in AWAITING_APPROVAL (states.create, move), so
        # the state alone says "held": read in order from attempt_held_order_idx.
        held = (
            self.visible_to(user).filter(state=State.AWAITING_APPROVAL).order_by("created_at", "id")
        )
        if which == "all":
            return held
        if which == "group":
            groups = sso_groups(user)
            if not groups:
                return held.none()
            return held.filter(approval_policy__approver_group__in=groups)
        policies = list(ApprovalPolicy.objects.all())
        mine_in: dict[str, list[str]] = {}  # tenant: the policies this person may approve there
        for policy in policies:
            for tenant in tenants_where(user, policy.approver_role):
                if policy.may_approve(user, tenant, fresh=False)[0]:
                    mine_in.setdefault(tenant, []).append(policy.pk)
        # A tenant where every policy is theirs needs no test of the policy. PostgreSQL's planner
        # takes a held attempt's policy and state for independent: with the test it expects a
        # handful of rows and sorts every held attempt to show the first page of them.
        mine = Q(pk__in=[])
        for tenant, allowed in mine_in.items():
            if len(allowed) == len(policies):
                mine |= Q(tenant_id=tenant)
            else:
                mine |= Q(tenant_id=tenant, approval_policy__in=allowed)
        approved = Approval.objects.filter(
            attempt=OuterRef("pk"),
            approver_id=user.pk,
            expires_at__gt=now or timezone.now(),
            policy_version=OuterRef("approval_policy__version"),
        )
        # recorded_by is never NULL here: migration 0014 filled it for every attempt a policy
        # held, and an intent records it since. Whoever issued the recording token is a
        # recorder too (``Attempt.recorders``); rows here only choose what to list, the
        # verdict shown on each item is read from the chain.
        me = user.get_username()
        return (
            held.filter(mine)
            .exclude(recorded_by=me)
            .exclude(recorded_by_issuer=me)
            .exclude(Exists(approved))
        )

    def with_amount(self) -> AttemptQuerySet:
        """Annotated with ``amount_minor`` and ``amount_currency``: the amount each attempt's
        arguments carry under its tool's display hints (attempts/money.py), NULL where there is
        none or the argument is not a whole number, so an inbox can filter and sort by it."""
        minor, currency = [], []
        for tool in Tool.objects.exclude(amount_arg=""):
            whole = Q(
                tool_name=tool.name, **{f"args__{tool.amount_arg}__regex": r"^-?[0-9]{1,15}$"}
            )
            value = Cast(KeyTextTransform(tool.amount_arg, "args"), models.BigIntegerField())
            minor.append(When(whole, then=value))
            code = (
                Upper(KeyTextTransform(tool.currency_arg, "args"))
                if tool.currency_arg
                else Value(tool.currency)
            )
            currency.append(When(tool_name=tool.name, then=code))
        if not minor:
            return self.annotate(
                amount_minor=Value(None, models.BigIntegerField()),
                amount_currency=Value(None, models.CharField()),
            )
        return self.annotate(
            amount_minor=Case(*minor, default=None, output_field=models.BigIntegerField()),
            amount_currency=Case(*currency, default=None, output_field=models.CharField()),
        )

    def count_upto(self, cap: int | None = None) -> tuple[int, bool]:
        """How many rows there are, reading no more than ``cap`` (QUEUE_COUNT_CAP) + 1 of them:
        (the count, at most ``cap``; whether there are more). A page's badge: "1000+"."""
        cap = QUEUE_COUNT_CAP if cap is None else cap
        found = self.order_by()[: cap + 1].count()
        return min(found, cap), found > cap

    def prefix_search(self, term: str, field: str) -> AttemptQuerySet:
        """Attempts whose ``field`` (one of PREFIX_FIELDS) starts with ``term``: one range
        ``>= term AND < term + U+10FFFF`` of the field in byte order (``search_key``), with the
        alias ``search_key`` to order by. Empty when ``term`` cannot be such a prefix."""
        value = prefix_value(term, field)
        keyed = self.alias(search_key=search_key(field))
        if value is None:
            return keyed.none()
        return keyed.filter(search_key__gte=value, search_key__lt=value + "\U0010ffff")

    def next_for(self, user: Any, *, after: Attempt) -> Attempt | None:
        """The attempt ``user`` should look at after ``after``: the oldest UNKNOWN or
        MANUAL_REVIEW attempt they own, else the oldest in their tenants."""
        open_work = (
            self.visible_to(user)
            .filter(state__in=ATTENTION_STATES)
            .exclude(pk=after.pk)
            .order_by("created_at", "id")
        )
        return open_work.filter(owner_id=user.pk).first() or open_work.first()

    def for_tenants(self, tenants: list[str] | set[str]) -> AttemptQuerySet:
        """Tenant scoping for agent tokens."""
        return self.filter(tenant_id__in=list(tenants))

    def due(self, now) -> AttemptQuerySet:
        """Attempts whose scheduled check (``next_check_at``) has come."""
        return self.filter(state__in=RECOVERABLE_STATES, next_check_at__lte=now)

    def stale_in_flight(self, now) -> AttemptQuerySet:
        """INTENT_RECORDED and DISPATCHED attempts unchanged for ``LEDGERWEB_STALE_AFTER``
        seconds, read now: the setting applies to attempts recorded before it changed."""
        since = now - dt.timedelta(seconds=settings.LEDGER["STALE_AFTER"])
        return self.filter(state__in=IN_FLIGHT_STATES, updated_at__lte=since)


class Attempt(models.Model):
    """One attempt at one logical side effect (protocol section 2)."""

    attempt_id = models.CharField(
        max_length=32, unique=True, default=new_attempt_id, editable=False
    )
    # Foreign keys without their own single-column index where a composite index below starts
    # with the column (or a partial one covers every non-NULL value): each index is one more
    # B-tree page written, and one more WAL frame committed, for every intent.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="attempts", db_index=False
    )
    task_id = ByteOrderCharField(max_length=200)
    tool_name = models.CharField(max_length=100)
    args = models.JSONField()
    args_hash = ByteOrderCharField(max_length=64)
    # The per-attempt random salt (hex) of its salted digests (chain format 3): erasure
    # replaces it, so what it committed to can no longer be guessed. Empty: an older attempt.
    args_salt = models.CharField(
        max_length=64, blank=True, default="", db_default="", editable=False
    )
    idempotency_key = ByteOrderCharField(max_length=255, unique=True)
    state = models.CharField(max_length=20, choices=State.choices, editable=False)
    version = models.PositiveIntegerField(default=1, editable=False)
    provider_request_id = ByteOrderCharField(max_length=255, blank=True, default="")
    result_ref = models.CharField(max_length=500, blank=True, default="")
    policy_version = models.CharField(max_length=64, blank=True, default="")
    credential_scope = models.JSONField(default=list, blank=True)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="children",
        db_index=False,
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="owned_attempts",
        db_index=False,
    )
    # Why a person is needed (payload_mismatch, not_found, max_age, authority_changed, ...).
    review_reason = models.CharField(max_length=64, blank=True, default="")
    # A linked attempt waiting in MANUAL_REVIEW for a reviewer's approval before it may be sent.
    awaiting_approval = models.BooleanField(default=False)
    # The approval policy that held this intent before dispatch (protocol section 11): set for
    # good when it is recorded in AWAITING_APPROVAL, so every claim checks its approvals.
    approval_policy = models.ForeignKey(
        "ApprovalPolicy",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="held_attempts",
        db_index=False,
    )
    # Who recorded the intent: its creation event's actor, kept on the row so that "never
    # whoever recorded it" (the approval checks, the inbox) is a column test, not a read of
    # the history. NULL only on attempts recorded before migration 0014 that no approval
    # check reads (neither held by a policy nor linked); their first event still says it.
    # NULL, not "": "not kept here" is not a name, and a nullable column is added to a big
    # SQLite table without copying it.
    recorded_by = models.CharField(  # noqa: DJ001
        max_length=150, null=True, blank=True, editable=False
    )
    # Who issued the agent token that recorded the intent (empty: not recorded through a
    # token, or a token nobody issued): with ``recorded_by`` the recorder an approval check
    # refuses (``recorders``); the creation event records it too (``token_issuer``).
    recorded_by_issuer = models.CharField(
        max_length=150, blank=True, default="", db_default="", editable=False
    )
    send_count = models.PositiveIntegerField(default=0)
    lookup_count = models.PositiveIntegerField(default=0)
    # When recovery should next look at this attempt; NULL once it rests or is terminal.
    next_check_at = models.DateTimeField(null=True, blank=True)
    # Reconciler lease; the fencing token is ``version``.
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    # The attempt's own hash chain (attempts/chain.py): the hash of its newest event and how many
    # events it has. Every event changes them in the same compare-and-set as the version, so two
    # writers can never link two events after the same one. ``sealed`` is False from a write until
    # the sealer puts this head into a checkpoint.
    chain_head = models.CharField(max_length=64, editable=False)
    chain_length = models.PositiveIntegerField(default=0, editable=False)
    sealed = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # The W3C traceparent the agent sent with its intent (attempts/tracing.py), and its trace id
    # to find the attempt from a trace; empty when none was sent.
    traceparent = models.CharField(
        max_length=55, blank=True, default="", db_default="", editable=False
    )
    trace_id = models.CharField(
        max_length=32, blank=True, default="", db_default="", editable=False
    )

    objects = AttemptQuerySet.as_manager()
    # Set on the copy a ledger call returns when it repeated a move and wrote nothing.
    repeated_call = False
    # Set on the stand-in ``ledger.record_intent`` returns for a key whose attempt was archived:
    # its ``ArchivedAttempt`` (the stand-in is not in the database; nothing can claim it).
    archived: ArchivedAttempt | None = None

    class Meta:
        indexes = [
            # Recovery's scan: due in-flight work only (terminal rows are not in the index).
            models.Index(
                fields=["next_check_at"],
                name="attempt_due_idx",
                condition=Q(next_check_at__isnull=False),
            ),
            # Queues, newest or oldest first, optionally per tenant.
            models.Index(fields=["state", "created_at", "id"], name="attempt_state_age_idx"),
            models.Index(
                fields=["tenant", "state", "created_at", "id"], name="attempt_tenant_state_idx"
            ),
            # Owned attempts only: ``owner_id = x`` implies NOT NULL, so lookups by owner (and the
            # database's own checks before a user is deleted) use it; new intents skip it.
            models.Index(
                fields=["owner", "state"],
                name="attempt_owner_state_idx",
                condition=Q(owner__isnull=False),
            ),
            # The "all attempts" queue: one ordered range per tenant, whatever the state.
            models.Index(fields=["tenant", "created_at", "id"], name="attempt_tenant_age_idx"),
            # "My work" queues: one ordered range per (owner, tenant, state). Partial, so its
            # statistics are not drowned by the unowned majority.
            models.Index(
                fields=["owner", "tenant", "state", "created_at", "id"],
                name="attempt_owner_queue_idx",
                condition=Q(owner__isnull=False),
            ),
            # The overview's counts by state, tenant, tool and owner, read from the index alone.
            models.Index(
                fields=["state", "tenant", "tool_name", "owner"],
                name="attempt_state_tenant_tool_idx",
            ),
            models.Index(fields=["task_id"], name="attempt_task_idx"),
            models.Index(fields=["provider_request_id"], name="attempt_provider_req_idx"),
            models.Index(fields=["args_hash"], name="attempt_args_hash_idx"),
            # Linked attempts by parent (most attempts have none).
            models.Index(
                fields=["parent"], name="attempt_parent_idx", condition=Q(parent__isnull=False)
            ),
            # The sealer's work list: attempts whose newest events are in no checkpoint yet.
            models.Index(fields=["id"], name="attempt_unsealed_idx", condition=Q(sealed=False)),
            # Attempts of one trace; only intents that came with a traceparent are in it.
            models.Index(fields=["trace_id"], name="attempt_trace_idx", condition=~Q(trace_id="")),
            # Attempts in review that wait for reviewers' approval of a prepared linked attempt
            # (a few): the start of "awaiting my approval".
            models.Index(
                fields=["state"],
                name="attempt_awaiting_idx",
                condition=Q(awaiting_approval=True),
            ),
            # Attempts an approval policy held (a policy's removal check).
            models.Index(
                fields=["approval_policy", "state"],
                name="attempt_held_idx",
                condition=Q(approval_policy__isnull=False),
            ),
            # The approvals inbox: held attempts in its order (oldest first), so a page reads
            # its own rows and not every held attempt; with what "awaiting me" tests, so its
            # bounded count can be read from the index alone.
            models.Index(
                fields=["created_at", "id", "tenant", "approval_policy", "recorded_by"],
                name="attempt_held_order_idx",
                condition=Q(state=State.AWAITING_APPROVAL),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_id} {self.tool_name} {self.state}"

    def identifies_effect(self, provider_id: str) -> bool:
        """Whether this attempt names the provider's effect ``provider_id``: by its provider
        request id, or, confirmed without one, by its receipt (``result_ref``), which must then
        carry the provider's id (docs/api.md, "Confirm without a provider request id"). The one
        home of that rule: crashtest's invariants and the soak ask it."""
        if self.provider_request_id:
            return self.provider_request_id == provider_id
        return bool(provider_id) and provider_id in self.result_ref

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def attention_age(self, now: dt.datetime) -> dt.timedelta:
        return attention_age(self.created_at, now)

    @staticmethod
    def last_move_subquery() -> Subquery:
        """The id of the attempt's latest event that changed its state (for annotations)."""
        return Subquery(
            AttemptEvent.objects.filter(attempt=OuterRef("pk"))
            .filter(MOVED)
            .order_by("-id")
            .values("id")[:1]
        )

    def approvals_needed(self) -> int:
        """How many distinct reviewers must approve a linked attempt or retry of this one."""
        return Tool.approvals_needed_for(self.tool_name)

    def recorders(self) -> frozenset[str]:
        """The one home of "who recorded this intent": the recorder of the lineage's original
        intent (a person, or an agent token's name) and, for a token, whoever issued it. None
        of them may approve, reject or correct it or a linked attempt of it (protocol invariant
        13). A linked attempt's own creator is the person (or worker) who decided it, not its
        recorder: an editor's approval of their correction counts."""
        cached = self.__dict__.get("_recorders")
        if cached is not None:
            return cached
        original: Attempt = self
        for _ in range(100):  # a lineage is a few links; the bound only guards a cycle
            if original.parent_id is None:
                break
            original = Attempt.objects.only(
                "id", "parent_id", "recorded_by", "recorded_by_issuer"
            ).get(pk=original.parent_id)
        names = {original.recorded_by or "", original.recorded_by_issuer or ""}
        if original.recorded_by is None:  # recorded before migration 0014: its first event says
            first = original.events.order_by("id").values_list("actor", flat=True).first()
            names.add(first or "")
        self.__dict__["_recorders"] = found = frozenset(names - {""})
        return found

    def approvers_since_last_move(self) -> list[str]:
        """Distinct reviewers (oldest first) whose approval of this attempt in review counts
        now (``approval_verdicts``)."""
        return list(self.approval_verdict().valid)

    def approval_verdict(self, now: dt.datetime | None = None) -> ApprovalVerdict:
        """What this attempt's approvals amount to at ``now`` (``approval_verdicts`` of one)."""
        return Attempt.approval_verdicts([self], now)[self.pk]

    @classmethod
    def approval_verdicts(
        cls, attempts: list[Attempt], now: dt.datetime | None = None
    ) -> dict[int, ApprovalVerdict]:
        """The one home of "which approvals count", for every approval alike (held intents
        and linked attempts and retries): the ``attempt.approval`` events of the attempt's own
        chain, never rows beside it. The claim (``states.check_approvals``), the inbox, the
        review functions and notifications ask it; the verifiers check the same rule offline
        (``verify_export.approval_problems``).

        - An attempt an approval policy holds (not in MANUAL_REVIEW): distinct people, each
          still allowed to approve under the policy (read fresh by ``read_people``), none of
          them its recorders, whose approval event is for the attempt's args_hash and its
          policy's current version and has not expired at ``now``.
        - An attempt in MANUAL_REVIEW (a linked retry or a prepared linked attempt): distinct
          reviewers who approved since it last moved (a move starts the count again), none of
          them its recorders; the tool's four-eyes rule says how many.

        Several attempts are read at once (a page of the inbox): policies, tools, approval
        events and approvers in a few queries."""
        from django.contrib.auth import get_user_model
        from django.utils import timezone

        now = now or timezone.now()
        attempts = [a for a in attempts]
        critical = dict(
            Tool.objects.filter(name__in={a.tool_name for a in attempts}).values_list(
                "name", "critical"
            )
        )
        names = {a.approval_policy_id for a in attempts if a.approval_policy_id}
        policies = {p.name: p for p in ApprovalPolicy.objects.filter(name__in=names)}
        found: dict[int, list[AttemptEvent]] = {a.pk: [] for a in attempts}
        approvals = AttemptEvent.objects.filter(
            attempt_id__in=list(found), action=APPROVAL_ACTION, actor_kind=ActorKind.USER
        ).only("id", "attempt_id", "actor", "details", "created_at")
        for event in approvals.order_by("id"):
            found[event.attempt_id].append(event)
        since: dict[int, int] = {}
        for attempt in attempts:
            if attempt.state == State.MANUAL_REVIEW and found[attempt.pk]:
                since[attempt.pk] = (
                    attempt.events.filter(MOVED)
                    .order_by("-id")
                    .values_list("id", flat=True)
                    .first()
                    or 0
                )
        usernames = {e.actor for listed in found.values() for e in listed}
        user_model = get_user_model()
        people = {
            u.get_username(): u
            for u in user_model.objects.filter(**{f"{user_model.USERNAME_FIELD}__in": usernames})
        }
        read_people(list(people.values()))
        verdicts: dict[int, ApprovalVerdict] = {}
        for attempt in attempts:
            recorders = attempt.recorders()
            valid: list[str] = []
            void: list[str] = []
            if attempt.state == State.MANUAL_REVIEW or attempt.approval_policy_id is None:
                for event in found[attempt.pk]:
                    if event.id > since.get(attempt.pk, 0) and event.actor not in recorders:
                        if event.actor not in valid:
                            valid.append(event.actor)
                needed = Tool(critical=bool(critical.get(attempt.tool_name))).approvals_needed
                verdicts[attempt.pk] = ApprovalVerdict(needed, tuple(valid), ())
                continue
            policy = policies[attempt.approval_policy_id]
            for event in found[attempt.pk]:
                terms = approval_terms(event.details)
                person = people.get(event.actor)
                counts = (
                    terms is not None
                    and terms["args_hash"] == attempt.args_hash
                    and terms["policy_version"] == policy.version
                    and terms["expires_at"] is not None
                    and terms["expires_at"] > now
                    and event.actor not in recorders
                    and person is not None
                    and person.is_active
                    and policy.may_approve(person, attempt.tenant_id, fresh=False)[0]
                )
                if terms is None:
                    continue  # a linked attempt's approval, before this attempt was held
                if counts and event.actor not in valid:
                    valid.append(event.actor)
                elif not counts and event.actor not in void:
                    void.append(event.actor)
            void = [name for name in void if name not in valid]
            needed = policy.approvals_for(
                attempt.tool_name, critical=critical.get(attempt.tool_name, False)
            )
            verdicts[attempt.pk] = ApprovalVerdict(
                needed, tuple(valid), tuple(void), policy.version, policy.approver_rule_digest()
            )
        return verdicts

    def last_event_id(self) -> int:
        """The id of the newest event of this attempt (0 when it has none): what a form saw."""
        return self.events.order_by("-id").values_list("id", flat=True).first() or 0

    def decisive_changes_since(self, event_id: int) -> list[AttemptEvent]:
        """Events after ``event_id`` that change what a person decided on: a state move, an
        owner change, an approval or a reviewer's decision. Lookups that change nothing, notes,
        acknowledgements and lease claims are not among them."""
        return list(
            self.events.filter(id__gt=event_id)
            .filter(MOVED | Q(action__in=DECISIVE_ACTIONS))
            .order_by("id")
        )


class ActorKind(models.TextChoices):
    AGENT = "agent", "Agent"
    WORKER = "worker", "Reconciliation worker"
    USER = "user", "Person"
    SYSTEM = "system", "System"


class AttemptEvent(models.Model):
    """One entry of an attempt's history. Append-only (database triggers refuse UPDATE/DELETE),
    and chained: ``hash`` covers this event's canonical encoding and ``prev_hash``, the hash of the
    attempt's event before it (format 2; format 1, written before per-attempt chains, links to the
    event before it in the whole ledger), so any edit, deletion, insertion or reordering shows.
    See attempts/chain.py and docs/audit-chain.md.
    """

    # Looked up through event_attempt_idx (attempt, id); no second index on the column alone.
    attempt = models.ForeignKey(
        Attempt, on_delete=models.PROTECT, related_name="events", db_index=False
    )
    action = models.CharField(max_length=64)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor = models.CharField(max_length=150)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    chain_format = models.PositiveSmallIntegerField(default=2, editable=False)
    # Format 3: the salted digest of the free text (reason and private details) the hash
    # covers instead of the text itself; kept when erasure replaces the text.
    text_digest = models.CharField(
        max_length=64, blank=True, default="", db_default="", editable=False
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["attempt", "id"], name="event_attempt_idx"),
            # The approvals alone (a few of the events): who waits for a reviewer's approval.
            models.Index(
                fields=["attempt", "id"],
                name="event_approval_idx",
                condition=Q(action=APPROVAL_ACTION),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_id} {self.action} {self.from_state}->{self.to_state}"

    def export_row(self, attempt_id: str) -> dict[str, Any]:
        """The event as the JSON Lines export writes it (``attempt_id``: its attempt's public
        id), before any rendering of its details: what ``verify_export`` hashes again."""
        row: dict[str, Any] = {"id": self.id, "attempt_id": attempt_id}
        row.update(
            (name, getattr(self, name))
            for name in (*verify_export.HASHED_FIELDS, "prev_hash", "hash")
            if name != "attempt_id"
        )
        row["v"] = self.chain_format
        row["text_digest"] = self.text_digest
        return row


class ErasureRequest(models.Model):
    """A request to erase an attempt's arguments and free text (four eyes): one person asks,
    with a reason; a different person approves, and then ``attempts.erasure`` erases. The
    erasure itself is an event in the attempt's history; this row keeps who asked and when."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ERASED = "erased", "Erased"
        CANCELLED = "cancelled", "Cancelled"

    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="erasures")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField()
    requested_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt"],
                condition=Q(status="pending"),
                name="erasure_one_pending_per_attempt",
            )
        ]

    def __str__(self) -> str:
        return f"erasure of {self.attempt_id} ({self.status})"


# Config-history subjects that concern one tenant (the tenant is in the subject's key).
TENANT_SUBJECT_KINDS = (
    "tenant",
    "membership",
    "grant",
    "sso_group",
    "sla_policy",
    "retention_rule",
)


@dataclass(frozen=True, slots=True)
class ApprovalVerdict:
    """What a held attempt's approvals amount to now: who counts, who no longer does, and
    whether that is enough to send."""

    needed: int
    valid: tuple[str, ...]
    void: tuple[str, ...]
    policy_version: int = 0
    approver_rule: str = ""

    @property
    def enough(self) -> bool:
        return len(self.valid) >= self.needed

    def as_dict(self) -> dict[str, Any]:
        return {
            "needed": self.needed,
            "valid": list(self.valid),
            "void": list(self.void),
            "policy_version": self.policy_version,
        }


def approval_terms(details: Any) -> dict[str, Any] | None:
    """What one held approval event approved: its args_hash, policy version and expiry (None
    for an approval of a linked attempt in review, which binds to no policy). Events written
    since approvals became chain-only keep the expiry in the clear (``valid_until``); older
    ones kept it with their private details (``expires_at``), and still count."""
    if not isinstance(details, dict) or details.get("kind") not in HELD_APPROVAL_KINDS:
        return None
    expires = details.get("valid_until") or details.get("expires_at")
    try:
        expires_at = dt.datetime.fromisoformat(expires) if isinstance(expires, str) else None
    except ValueError:
        expires_at = None
    if expires_at is not None and expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=dt.UTC)
    return {
        "args_hash": details.get("args_hash"),
        "policy_version": details.get("policy_version"),
        "expires_at": expires_at,
    }


class Approval(models.Model):
    """An index of held approvals (one row per ``attempt.approval`` event of a held attempt,
    written in the same transaction): who approved which attempt, under which policy version,
    until when, for the admin and the archives. Rows never decide: which approvals count is
    read from the attempt's chain (``Attempt.approval_verdicts``), so a row inserted behind
    the ledger's back releases nothing. Comments live in the event's reason only (erasure
    redacts them there). Append-only: a void approval stays, and a new one is a new row."""

    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    args_hash = models.CharField(max_length=64)
    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.PROTECT, related_name="approvals")
    policy_version = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["attempt", "expires_at"], name="approval_attempt_idx")]

    def __str__(self) -> str:
        return f"{self.approver_id} approved {self.attempt_id} (v{self.policy_version})"


class ConfigEventQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> ConfigEventQuerySet:
        """The one home of who may read which configuration changes: a superuser every one; a
        reviewer or admin of a tenant that tenant's (its row, memberships, grants, SSO group
        roles, SLA policies) and tools' and SLAs-for-every-tenant's, which concern every
        tenant alike. Changes that span tenants and name them (people, groups, SSO identities,
        agent tokens, ownership rules' patterns) are for superusers. Nobody else sees any."""
        if user is None or not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self.all()
        tenants = tenants_where(user, Role.REVIEWER)
        if not tenants:
            return self.none()
        seen = (
            Q(subject__startswith="tool:")
            | Q(subject="authority")
            | (Q(subject__startswith="sla_policy:") & Q(subject__endswith="/*"))
            | Q(subject__in=self._policies_concerning(set(tenants)))
        )
        for tenant in tenants:
            seen |= (
                Q(subject=f"tenant:{tenant}")
                | Q(subject__startswith=f"membership:{tenant}/")
                | Q(subject__startswith=f"grant:{tenant}/")
                | Q(subject__startswith=f"retention_rule:{tenant}/")
                | (
                    (Q(subject__startswith="sso_group:") | Q(subject__startswith="sla_policy:"))
                    & Q(subject__endswith=f"/{tenant}")
                )
            )
        return self.filter(seen)

    def _policies_concerning(self, tenants: set[str]) -> list[str]:
        """Approval policies' subjects whose recorded tenants (before or after any change) are
        every tenant (an empty list) or include one of ``tenants``: a policy names its tenants
        in its values, not in its subject."""
        found = set()
        rows = ConfigEvent.objects.filter(subject__startswith="approval_policy:")
        for subject, before, after in rows.values_list("subject", "before", "after"):
            for values in (before, after):
                if isinstance(values, dict) and (
                    not values.get("tenants") or tenants & set(values["tenants"])
                ):
                    found.add(subject)
        return sorted(found)

    def affecting(self, attempt: Attempt) -> ConfigEventQuerySet:
        """Changes to what decides the attempt's authority or review: its tenant, its tool, the
        tenant's grant for the tool, and ownership rules (which may match any attempt)."""
        return self.filter(
            Q(subject=f"tenant:{attempt.tenant_id}")
            | Q(subject=f"tool:{attempt.tool_name}")
            | Q(subject=f"grant:{attempt.tenant_id}/{attempt.tool_name}")
            | Q(subject__startswith="ownership_rule:")
            | Q(subject=f"approval_policy:{attempt.approval_policy_id or ''}")
        )


class ConfigEvent(models.Model):
    """One change to configuration that decides authority or review (tenants, tools, grants,
    ownership rules, users and roles), with who made it. Append-only and hash-chained like
    attempt history, in one chain of its own that checkpoints seal (attempts/chain.py)."""

    subject = models.CharField(max_length=200)
    action = models.CharField(max_length=64)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor = models.CharField(max_length=150)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    seq = models.PositiveIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = ConfigEventQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["subject", "seq"], name="configevent_subject_idx")]

    def __str__(self) -> str:
        return f"{self.seq} {self.subject} {self.action}"


class Checkpoint(models.Model):
    """A seal over the history: the Merkle root of the attempt chain heads written since the
    checkpoint before it (``CheckpointLeaf``), the config chain's head, and that checkpoint's hash.
    Keeping the newest checkpoint's hash outside the database is what makes rewriting everything
    up to it detectable (docs/audit-chain.md)."""

    seq = models.PositiveIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    root = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    config_length = models.PositiveIntegerField()
    config_head = models.CharField(max_length=64)
    sealed_at = models.DateTimeField()
    hash = models.CharField(max_length=64, unique=True)
    # Format 1: root and size of this checkpoint's own leaves. Format 2 (the transparency log,
    # attempts/log.py): root and size of the whole log, the authority digest, and the text of
    # its C2SP checkpoint note (signed after sealing, CheckpointSignature).
    format = models.PositiveSmallIntegerField(default=1)
    authority = models.CharField(max_length=64, blank=True, default="")
    note = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"checkpoint {self.seq} {self.hash[:12]}"


class CheckpointLeaf(models.Model):
    """One attempt's chain head as a checkpoint sealed it: the attempt's public id (kept as text,
    so a deleted attempt still shows), how many events its chain had and the newest one's hash."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="leaves")
    position = models.PositiveIntegerField()
    attempt_id = models.CharField(max_length=32)
    length = models.PositiveIntegerField()
    head = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "position"], name="checkpointleaf_unique_position"
            )
        ]
        indexes = [models.Index(fields=["attempt_id", "checkpoint"], name="leaf_attempt_idx")]

    def __str__(self) -> str:
        return f"{self.attempt_id}@{self.length} in checkpoint {self.checkpoint_id}"


class LogEntry(models.Model):
    """A sealed chain head's place in the transparency log (attempts/log.py): leaf ``index``."""

    index = models.PositiveBigIntegerField(unique=True)
    leaf = models.OneToOneField(CheckpointLeaf, on_delete=models.PROTECT, related_name="log_entry")

    def __str__(self) -> str:
        return f"log leaf {self.index}"


class LogNode(models.Model):
    """A stored hash of the log: the root of the complete subtree of 2**level leaves starting at
    leaf ``index * 2**level`` (level 0: the leaf hashes). Proofs and tiles read these, never the
    whole log."""

    level = models.PositiveSmallIntegerField()
    index = models.PositiveBigIntegerField()
    hash = models.BinaryField(max_length=32)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["level", "index"], name="lognode_unique_place")
        ]

    def __str__(self) -> str:
        return f"log node {self.level}/{self.index}"


class CheckpointSignature(models.Model):
    """One signature line of a checkpoint note: the log's own (``log``) or a witness's
    cosignature (``witness``), kept exactly as the note carries it."""

    class Kind(models.TextChoices):
        LOG = "log", "log"
        WITNESS = "witness", "witness"

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="signatures")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=200)
    key_id = models.CharField(max_length=8)
    line = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "kind", "name", "key_id"], name="checkpointsig_unique_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} signature {self.name} on checkpoint {self.checkpoint_id}"


class WitnessState(models.Model):
    """What the publisher knows of one configured witness: the tree size it last cosigned, and
    how its newest submission went."""

    class Status(models.TextChoices):
        OK = "ok", "up to date"
        BEHIND = "behind", "behind"
        REFUSED = "refused", "refused"
        UNREACHABLE = "unreachable", "unreachable"

    name = models.CharField(max_length=200, unique=True)
    size = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.BEHIND)
    message = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"witness {self.name}: {self.status} at {self.size}"


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who an authenticated API request acts as: the live token's id, agent name and tenants."""

    id: int
    name: str
    tenant_slugs: frozenset[str]
    # The username of whoever issued the token ("" when nobody did): a recorder of its intents.
    issuer: str = ""


class AgentToken(models.Model):
    """A bearer token for one agent identity, allowed a set of tenants. Only its hash is kept."""

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False)
    tenants = models.ManyToManyField(Tenant, related_name="agent_tokens")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    TOKEN_PREFIX = "lwt_"  # noqa: S105 (a public marker, not a secret)
    # Writing last_used_at costs a write per request; once a minute per token is enough.
    LAST_USED_RESOLUTION = 60

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_token(raw: str) -> str:
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    @classmethod
    def issue(
        cls, name: str, tenants: list[str], *, created_by: AbstractBaseUser | None = None
    ) -> tuple[AgentToken, str]:
        """Create a token for agent ``name`` allowed ``tenants``; returns (token, raw secret).

        The raw secret is shown once: only its SHA-256 is stored.
        """
        token = cls(name=name, created_by=created_by)
        raw = token.rotate_secret()
        with transaction.atomic():
            token.save(force_insert=True)
            token.tenants.set(tenants)
        return token, raw

    def rotate_secret(self) -> str:
        """Give an unsaved (admin-created) token its secret; returns the raw value, shown once."""
        raw = self.TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = self.hash_token(raw)
        self.prefix = raw[: len(self.TOKEN_PREFIX) + 6]
        return raw

    def touch(self) -> None:
        """Record use, at most once per LAST_USED_RESOLUTION seconds per token."""
        from django.utils import timezone

        now = timezone.now()
        cutoff = now - dt.timedelta(seconds=self.LAST_USED_RESOLUTION)
        if self.last_used_at is not None and self.last_used_at > cutoff:
            return
        AgentToken.objects.filter(pk=self.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=cutoff)
        ).update(last_used_at=now)
        self.last_used_at = now

    def revoke(self) -> bool:
        """Revoke the token (idempotent). Returns whether this call revoked it."""
        from django.utils import timezone

        # A save, not a queryset update: the configuration history records it (signals).
        with transaction.atomic():
            token = AgentToken.objects.select_for_update().get(pk=self.pk)
            changed = token.revoked_at is None
            if changed:
                token.revoked_at = timezone.now()
                token.save(update_fields=["revoked_at"])
        self.revoked_at = token.revoked_at
        return changed


class LoginThrottle(models.Model):
    """Failed log-ins per (username, client address), for the dashboard's login throttling.

    Kept in the database rather than a per-process cache so every web worker sees the same count.
    ``key`` is a hash of the lowercased username and the address.
    """

    key = models.CharField(max_length=64, unique=True)
    # Who and from where, for the admin (an address-wide row has no username).
    username = models.CharField(max_length=150, blank=True, default="")
    address = models.CharField(max_length=64, blank=True, default="")
    failures = models.PositiveIntegerField(default=0)
    first_failure_at = models.DateTimeField()
    locked_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        who = self.username or "any user"
        return f"{who} from {self.address or '?'}: {self.failures} failures"


# ---------------------------------------------------------------------------------------------
# A person's shift: preferences, notifications (an outbox the worker delivers), SLAs


class NoticeKind(models.TextChoices):
    ASSIGNED = "assigned", "Work assigned to me"
    MANUAL_REVIEW = "manual_review", "An attempt I own entered MANUAL_REVIEW"
    APPROVAL = "approval", "An approval waits for me"
    SLA_BREACH = "sla_breach", "An SLA breach escalated to me"
    DIGEST = "digest", "Daily digest"


class PersonSettings(models.Model):
    """One person's dashboard and notification preferences (defaults when there is no row)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_settings"
    )
    time_zone = models.CharField(max_length=64, default="UTC")
    email = models.BooleanField(default=True, help_text="Send my notices by email.")
    chat = models.BooleanField(default=True, help_text="Send my notices to the chat webhook.")
    kinds = models.JSONField(
        default=list, blank=True, help_text="Kinds of notice I want (empty: every kind)."
    )
    digest_hour = models.PositiveSmallIntegerField(
        null=True, blank=True, default=8, help_text="Local hour of the daily digest (empty: none)."
    )

    def __str__(self) -> str:
        return f"settings of {self.user}"

    @classmethod
    def of(cls, user: Any) -> PersonSettings:
        """The person's settings, or unsaved defaults."""
        found = cls.objects.filter(user_id=user.pk).first()
        return found if found is not None else cls(user_id=user.pk)

    def wants(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


class NoticeStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    DEAD = "dead", "Given up"


class NotificationRoute(models.Model):
    """Who else is told of notices about matching attempts: the people on call for a tenant or a
    tool, beside the owner or reviewer a notice is for. Each person's own preferences (channels,
    kinds) still apply, and only people with a role in the attempt's tenant are told."""

    name = models.SlugField(max_length=64, unique=True)
    tenant_pattern = models.CharField(max_length=100, default="*")
    tool_pattern = models.CharField(max_length=100, default="*")
    # NoticeKind values this route carries; empty: every kind about an attempt.
    kinds = models.JSONField(default=list, blank=True)
    people = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="notification_routes", blank=True
    )
    active = models.BooleanField(default=True)
    # A Slack channel's id: held calls this route matches are posted there with Approve / Reject
    # buttons (attempts/slack.py), beside the notices to the route's people.
    slack_channel = models.CharField(
        max_length=80,
        blank=True,
        default="",
        help_text="Slack channel id (C...) where held calls this route matches are posted with "
        "Approve / Reject buttons (empty: none).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"route {self.name} ({self.tenant_pattern}/{self.tool_pattern})"

    def matches(self, kind: str, tenant: str, tool: str) -> bool:
        from fnmatch import fnmatchcase

        return (
            self.active
            and (not self.kinds or kind in self.kinds)
            and fnmatchcase(tenant, self.tenant_pattern)
            and fnmatchcase(tool, self.tool_pattern)
        )


class Notification(models.Model):
    """One notice to one person on one channel: the outbox row the worker delivers.

    Enqueued with a ``dedupe_key`` (unique), so whatever enqueues twice enqueues once. Delivered
    under a lease (``claim_token``, ``lease_until``): a worker killed mid-send leaves the row
    pending and another claims it when the lease ends. The ``notice_id`` goes out with every
    delivery (email Message-ID, webhook header and body) so a receiver can drop the copy a crash
    between "sent" and "recorded as sent" can produce.
    """

    dedupe_key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=20, choices=NoticeKind.choices)
    channel = models.CharField(max_length=10)  # email | chat
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_notices"
    )
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    subject = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(
        max_length=10, choices=NoticeStatus.choices, default=NoticeStatus.PENDING
    )
    created_at = models.DateTimeField()
    next_try_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="notice_due_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["recipient", "created_at"], name="notice_recipient_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.recipient_id} by {self.channel} ({self.status})"

    @property
    def notice_id(self) -> str:
        return f"ledgerweb-notice-{self.pk}"


class NotifyCursor(models.Model):
    """How far the notifier has read the attempts' history (one row, name ``events``)."""

    name = models.CharField(max_length=40, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} read to event {self.last_event_id}"


class SlackIdentity(models.Model):
    """A Slack user an administrator verified as one ledger user: a click on an Approve or
    Reject button by this Slack user decides as ``user`` (attempts/slack.py). Without a row, a
    Slack user is mapped only by an email Slack confirmed that equals the email of exactly one
    active ledger user who signs in through the identity provider."""

    team_id = models.CharField(max_length=40)
    slack_user_id = models.CharField(max_length=40)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slackidentity_unique"
            )
        ]
        verbose_name_plural = "Slack identities"

    def __str__(self) -> str:
        return f"Slack {self.team_id}/{self.slack_user_id} is {self.user}"


class SlackMessage(models.Model):
    """The interactive message about one held attempt in one Slack channel: an outbox row like
    ``Notification``. ``wanted`` goes up whenever what the message should show changes (it was
    held, approved, decided, expired); the worker posts or updates it under a lease and records
    the revision it showed in ``shown``, so a change while it was posting is posted again."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="slack_messages")
    channel = models.CharField(max_length=80)
    ts = models.CharField(max_length=40, blank=True, default="")
    wanted = models.PositiveIntegerField(default=1)
    shown = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim_token = models.CharField(max_length=40, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    dead = models.BooleanField(default=False)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "channel"], name="slackmessage_unique")
        ]
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="slackmessage_due_idx",
                condition=Q(shown__lt=F("wanted"), dead=False),
            )
        ]

    def __str__(self) -> str:
        return f"Slack message about {self.attempt_id} in {self.channel}"


class SlackRequest(models.Model):
    """Interaction requests from Slack seen recently (their signature, and the click's own id):
    a request sent again is refused. Rows older than the signature's five minutes go."""

    key = models.CharField(max_length=200, unique=True)
    received_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"Slack request {self.key[:20]} at {self.received_at}"


class SlaPolicy(models.Model):
    """How old UNKNOWN and MANUAL_REVIEW work may grow for a tool (optionally one tenant only).

    Past ``*_warn_after`` an age shows amber, past ``*_breach_after`` red, and a breach is
    escalated once to ``escalate_to`` (else the default owner) unless someone acknowledged it.
    The most specific policy wins: tenant and tool, then tool for every tenant.
    """

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="sla_policies")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="sla_policies"
    )
    unknown_warn_after = models.DurationField(default=dt.timedelta(hours=1))
    unknown_breach_after = models.DurationField(default=dt.timedelta(hours=4))
    review_warn_after = models.DurationField(default=dt.timedelta(hours=4))
    review_breach_after = models.DurationField(default=dt.timedelta(hours=24))
    escalate_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tool", "tenant"],
                name="sla_unique_tool_tenant",
                condition=Q(tenant__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["tool"], name="sla_unique_tool", condition=Q(tenant__isnull=True)
            ),
        ]
        verbose_name = "SLA policy"
        verbose_name_plural = "SLA policies"

    def __str__(self) -> str:
        return f"SLA {self.tool_id}/{self.tenant_id or '*'}"

    def thresholds(self, state: str) -> tuple[dt.timedelta, dt.timedelta] | None:
        """(warn after, breach after) for a state, None for states without an SLA."""
        if state == State.UNKNOWN:
            return self.unknown_warn_after, self.unknown_breach_after
        if state == State.MANUAL_REVIEW:
            return self.review_warn_after, self.review_breach_after
        return None

    @classmethod
    def table(cls) -> dict[tuple[str, str | None], SlaPolicy]:
        """Every policy by (tool, tenant or None)."""
        return {(p.tool_id, p.tenant_id): p for p in cls.objects.all()}

    @staticmethod
    def pick(
        table: dict[tuple[str, str | None], SlaPolicy], tool: str, tenant: str
    ) -> SlaPolicy | None:
        """The one home of "which SLA applies": tenant-specific first, then the tool's."""
        return table.get((tool, tenant)) or table.get((tool, None))

    @staticmethod
    def level(policy: SlaPolicy | None, state: str, age: dt.timedelta) -> str:
        """'' (no SLA or in time), 'warn' or 'breach'."""
        limits = policy.thresholds(state) if policy is not None else None
        if limits is None:
            return ""
        warn, breach = limits
        if age >= breach:
            return "breach"
        if age >= warn:
            return "warn"
        return ""


class SlaEscalation(models.Model):
    """An SLA breach of one attempt in one state: escalated once, acknowledged by a person."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="sla_escalations")
    state = models.CharField(max_length=20)
    escalated_to = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    escalated_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "state"], name="sla_escalation_unique")
        ]

    def __str__(self) -> str:
        return f"SLA {self.attempt_id} {self.state}"


class TerminalDayCount(models.Model):
    """How many attempts recorded on ``day`` (UTC) rest in terminal ``state``, per tenant and
    tool, as the reconcile worker's count pass last found them (``attempts.counts``). Terminal
    states are final, so a day's counts change only while it still holds live work."""

    day = models.DateField()
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    state = models.CharField(max_length=20)
    n = models.PositiveBigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant_id", "tool_name", "state"], name="terminal_day_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class TerminalCount(models.Model):
    """The terminal counts summed over every day, per tenant, tool and state: what the overview
    reads (a few rows per tenant, whatever the size of the ledger)."""

    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    state = models.CharField(max_length=20)
    n = models.PositiveBigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "tool_name", "state"], name="terminal_count_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class LiveDayCount(models.Model):
    """How many live (not terminal) attempts recorded on ``day`` (UTC) are in ``state``, per
    tenant, tool and whether anyone owns them, as the count pass last found them. The overview
    reads these instead of counting a live backlog too large to count per request
    (``attempts.counts.LIVE_EXACT``); below that size it counts live work itself."""

    day = models.DateField()
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    state = models.CharField(max_length=20)
    unowned = models.BooleanField()
    n = models.PositiveBigIntegerField()

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.tool_name} {self.state}: {self.n}"


class TerminalCountPass(models.Model):
    """The one row saying when the terminal counts were taken and how many live attempts each
    day held then (what the next pass compares to find the days it must count again)."""

    counted_at = models.DateTimeField()
    live_by_day = models.JSONField(default=dict)
    seconds = models.FloatField(default=0.0)
    days_counted = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"terminal counts as of {self.counted_at}"


# -- Retention and archives (reconciliation/archive, docs/archive.md)


class RetentionRule(models.Model):
    """How long one tenant's settled, sealed attempts of one tool stay in the database:
    ``ledgerweb archive run`` moves those whose last change is older than ``archive_after_days``
    to an archive file with their receipts, then removes them. Configuration as code
    (``[[retention_rules]]``), recorded in the configuration history."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="retention_rules")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="retention_rules")
    archive_after_days = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool"], name="retention_rule_unique")
        ]

    def __str__(self) -> str:
        return f"retention {self.tenant_id}/{self.tool_id}: {self.archive_after_days} days"


class Archive(models.Model):
    """One archive written by ``ledgerweb archive run``: where it is, the SHA-256 of its
    manifest (also recorded in the configuration history), what it holds and the signed
    checkpoint its receipts prove inclusion in. Append-only (attempts/history_guard.py)."""

    name = models.CharField(max_length=100, unique=True)
    location = models.CharField(max_length=1000)
    manifest_sha256 = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    checkpoint_seq = models.PositiveIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"archive {self.name}"


class ArchivedAttemptQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> ArchivedAttemptQuerySet:
        """Tenant scoping, as for attempts (``tenants_where``)."""
        return self.filter(tenant_id__in=tenants_where(user))

    def matching(self, term: str) -> ArchivedAttemptQuerySet:
        """Archived attempts whose attempt id, idempotency key or provider request id is
        ``term`` exactly."""
        term = term.strip()
        if not term:
            return self.none()
        return self.filter(
            Q(attempt_id=term) | Q(idempotency_key=term) | Q(provider_request_id=term)
        )


class ArchivedAttempt(models.Model):
    """An attempt removed from the database after it was archived: which archive holds it, and
    the identifiers a search may ask for. ``row_id`` is the attempt's database id: the events'
    append-only trigger lets exactly the events of these rows be deleted, and nothing else.
    Append-only itself (attempts/history_guard.py)."""

    row_id = models.BigIntegerField(unique=True)
    attempt_id = models.CharField(max_length=32, unique=True)
    archive = models.ForeignKey(Archive, on_delete=models.PROTECT, related_name="archived")
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=255)
    provider_request_id = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=20)
    # The outcome's durable reference, answered to an agent that replays the key after the
    # attempt was archived (``RecordedKey``). NULL: archived before this column was kept (the
    # archive file has it). Nullable so the column is added without rewriting the table.
    result_ref = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    chain_length = models.PositiveIntegerField()
    chain_head = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    archived_at = models.DateTimeField()

    objects = ArchivedAttemptQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["idempotency_key"], name="archived_key_idx"),
            models.Index(
                fields=["provider_request_id"],
                name="archived_request_idx",
                condition=~Q(provider_request_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_id} in {self.archive_id}"


def key_digest(idempotency_key: str) -> str:
    """The lowercase hex SHA-256 of an idempotency key's UTF-8: how ``RecordedKey`` names it."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class RecordedKey(models.Model):
    """The permanent index of every idempotency key ever recorded (protocol section 7,
    invariant 11): written with the attempt, in the same statement or transaction, and never
    changed or removed (append-only, attempts/history_guard.py), so a key takes effect at most
    once for the life of the ledger, whether its attempt is live or archived.

    Its primary key is THE uniqueness check of a new intent: two intents racing on one key
    cannot both insert it. The key is kept as its digest (``key_digest``): refusing a repeat
    and answering it need only the digest of what the agent sends, and a key that carries a
    person's data is not copied into a table erasure may never touch. Keys are unique across
    the ledger (not per tenant), as the attempts' own key is. Where the attempt went is
    ``ArchivedAttempt`` (by ``attempt_id``) once it is archived, the attempts table before.
    ``args_hash`` is empty only for an attempt archived before this index existed (migration
    0018 filled it from ``ArchivedAttempt``, which did not keep the hash): such a key is
    refused, never sent again."""

    key_digest = models.CharField(max_length=64, primary_key=True)
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    args_hash = models.CharField(max_length=64, blank=True)
    attempt_id = models.CharField(max_length=32)

    def __str__(self) -> str:
        return f"key {self.key_digest[:12]} -> {self.attempt_id}"


class ProviderEffect(models.Model):
    """Which attempt a provider's effect (its tool, its provider request id) belongs to: one
    effect is claimed by one attempt for the life of the ledger (protocol section 7, invariant
    12). Written by ``attempts.rows`` in the same statement or transaction as the move that
    first sets an attempt's ``provider_request_id``; its unique constraint is what makes two
    concurrent claims of one effect end with one winner (the other attempt goes to
    MANUAL_REVIEW, ``effect_claimed``). Append-only; it outlives archiving."""

    tool_name = models.CharField(max_length=100)
    provider_request_id = models.CharField(max_length=255)
    attempt_id = models.CharField(max_length=32)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tool_name", "provider_request_id"], name="provider_effect_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.provider_request_id} -> {self.attempt_id}"
