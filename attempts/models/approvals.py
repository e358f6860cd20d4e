"""Approval before dispatch (protocol section 11): policies and their CEL conditions, the
approvals index, and which approvals count (``Attempt.approval_verdicts`` asks ``review_verdict``
and ``held_verdict``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import rfc8785
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from attempts.models.roles import Role, has_role, read_people, sso_groups
from attempts.models.tools import Tool

# The ``kind`` of an approval event of a held intent (bound to args_hash, policy version and
# an expiry); the others (linked_retry, linked_attempt) approve an attempt in review.
HELD_APPROVAL_KINDS = ("held", "edit_and_approve")


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


def approvers(usernames: set[str]) -> dict[str, Any]:
    """The people who gave these approvals, by username, their roles and groups read fresh."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    field = f"{user_model.USERNAME_FIELD}__in"
    people = {u.get_username(): u for u in user_model.objects.filter(**{field: usernames})}
    read_people(list(people.values()))
    return people


def review_verdict(
    events: list[Any], *, since: int, recorders: frozenset[str], critical: bool
) -> ApprovalVerdict:
    """An attempt in MANUAL_REVIEW (a linked retry or a prepared linked attempt): distinct
    reviewers who approved since it last moved (event ``since``), none of them its recorders;
    the tool's four-eyes rule says how many."""
    valid: list[str] = []
    for event in events:
        if event.id > since and event.actor not in recorders and event.actor not in valid:
            valid.append(event.actor)
    return ApprovalVerdict(Tool(critical=critical).approvals_needed, tuple(valid), ())


def held_verdict(
    attempt: Any,
    policy: ApprovalPolicy,
    events: list[Any],
    *,
    recorders: frozenset[str],
    people: dict[str, Any],
    critical: bool,
    now: dt.datetime,
) -> ApprovalVerdict:
    """An attempt an approval policy holds: distinct people, each still allowed to approve under
    the policy (as ``approvers`` read them), none of them its recorders, whose approval is for
    the attempt's args_hash and the policy's current version and has not expired at ``now``."""
    valid: list[str] = []
    void: list[str] = []
    for event in events:
        terms = approval_terms(event.details)
        if terms is None:
            continue  # a linked attempt's approval, before this attempt was held
        person = people.get(event.actor)
        counts = (
            terms["args_hash"] == attempt.args_hash
            and terms["policy_version"] == policy.version
            and terms["expires_at"] is not None
            and terms["expires_at"] > now
            and event.actor not in recorders
            and person is not None
            and person.is_active
            and policy.may_approve(person, attempt.tenant_id, fresh=False)[0]
        )
        if counts and event.actor not in valid:
            valid.append(event.actor)
        elif not counts and event.actor not in void:
            void.append(event.actor)
    return ApprovalVerdict(
        policy.approvals_for(attempt.tool_name, critical=critical),
        tuple(valid),
        tuple(name for name in void if name not in valid),
        policy.version,
        policy.approver_rule_digest(),
    )


class Approval(models.Model):
    """An index of held approvals (one row per ``attempt.approval`` event of a held attempt,
    written in the same transaction): who approved which attempt, under which policy version,
    until when, for the admin and the archives. Rows never decide: which approvals count is
    read from the attempt's chain (``Attempt.approval_verdicts``), so a row inserted behind
    the ledger's back releases nothing. Comments live in the event's reason only (erasure
    redacts them there). Append-only: a void approval stays, and a new one is a new row."""

    attempt = models.ForeignKey("Attempt", on_delete=models.PROTECT, related_name="approvals")
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

    @classmethod
    def index(
        cls, attempt: Any, approver: Any, policy: ApprovalPolicy, now: dt.datetime
    ) -> Approval:
        """The row of ``approver``'s approval of ``attempt`` at ``now``: bound to its args_hash
        and the policy's version, expiring after the policy's ``approval_ttl``."""
        return cls.objects.create(
            attempt=attempt,
            approver=approver,
            args_hash=attempt.args_hash,
            policy=policy,
            policy_version=policy.version,
            created_at=now,
            expires_at=now + policy.approval_ttl,
        )
