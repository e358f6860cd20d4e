"""Every change of who may do what, recorded in the tamper-evident history, from every path.

``AUTHORITIES`` is the one declaration of the models whose rows decide authority or review
(tenants, people and their groups, memberships, SSO mappings and identities, agent tokens, tools,
grants, ownership rules, SLA policies) and of the fields of each that are recorded. A model added
later (approval policies, notification routes) is one ``register(Authority(...))``.

How a change gets into the history: Django's model signals (``pre_save``/``post_save``,
``pre_delete``/``post_delete``, ``m2m_changed``) on every declared model append a
``ConfigEvent`` (``attempts.chain.record_config_change``) in the transaction of the change, with
the subject (``tenant:acme``, ``membership:acme/rita``...), what changed (before and after, the
changed fields only) and who changed it. So the admin, ``ledger_config apply``, an SSO sign-in,
the management commands and any code written later are recorded without calling anything. Who
acted comes from ``acting(actor, reason)`` (the admin and dashboard requests set it through
``ActingMiddleware``; commands and SSO set their own); a change made with no actor given is still
recorded, as ``system:unattributed`` with the process that made it.

What escapes signals (a queryset ``update()``, ``bulk_create``, SQL typed into the database) is
caught by verification: ``live_authority()`` reads the declared rows as they are,
``history_authority()`` rebuilds what the history says they are (``verify_export.authority_state``,
which the standalone verifier runs on an export too), and ``verify_audit`` reports every
difference as ``[config-drift]``. ``authority_digest()`` is the SHA-256 of the live rows'
canonical JSON (RFC 8785), which checkpoints commit to.

A ledger that existed before a model was declared has rows the history never saw: the first
change or verification after the upgrade records a baseline (``authority.baseline`` and one
``snapshot`` per row, by ``system:baseline``) for each model no baseline covers yet.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.db.models import signals

from attempts import dbadapter
from attempts.actors import Actor
from attempts.chain import record_config_change
from attempts.locking import write_transaction
from attempts.models import (
    ActorKind,
    AgentToken,
    ApprovalPolicy,
    ConfigEvent,
    Grant,
    Membership,
    NotificationRoute,
    OwnershipRule,
    RetentionRule,
    SlackIdentity,
    SlaPolicy,
    SsoGroupRole,
    SsoIdentity,
    Tenant,
    Tool,
)
from attempts.verify_export import (
    AUTHORITY_BASELINE,
    AUTHORITY_SUBJECT,
    authority_digest_of,
    authority_state,
)

# A field's recorded value: an attribute path ("owner.username") or a function of the row.
Value = str | Callable[[Any], Any]


# What the history records of a tool (its name is the row's key; its description is not
# authority): the admin's tool form edits these.
TOOL_FIELDS = (
    "effect_class",
    "critical",
    "active",
    "adapter",
    "dispatch_url",
    "lookup_url",
    "timeout_seconds",
    "max_sends",
)


@dataclass(frozen=True)
class Authority:
    """One model whose rows decide who may do what, and what of each row is recorded.

    ``key`` gives the subject's key (the subject is ``<kind>:<key>``); ``fields`` the recorded
    values by name; ``many`` many-to-many relations, by name: (attribute, value of one related
    row), recorded as a sorted list. ``watch`` names the columns whose change can change the
    record (a save with ``update_fields`` outside them is not looked at: ``last_login``)."""

    model: type[models.Model]
    kind: str
    key: Callable[[Any], str]
    fields: dict[str, Value]
    many: dict[str, tuple[str, Callable[[Any], str]]] = field(default_factory=dict)
    related: tuple[str, ...] = ()
    watch: frozenset[str] = frozenset()

    def subject(self, row: Any) -> str:
        return f"{self.kind}:{self.key(row)}"

    def _query(self) -> models.QuerySet:
        rows = self.model._default_manager.all()
        return rows.select_related(*self.related) if self.related else rows

    def rows(self) -> models.QuerySet:
        return self._query().prefetch_related(*(attr for attr, _ in self.many.values()))

    def fresh(self, pk: Any) -> Any | None:
        """The row as the database has it now (no cached relations)."""
        if pk is None:
            return None
        return self._query().filter(pk=pk).first()

    def snapshot(self, row: Any) -> dict[str, Any]:
        """The recorded fields of ``row``, as plain JSON values."""
        values: dict[str, Any] = {}
        for name, value in self.fields.items():
            values[name] = value(row) if callable(value) else _path(row, value)
        for name, (attr, one) in self.many.items():
            values[name] = sorted(one(item) for item in getattr(row, attr).all())
        return json.loads(json.dumps(values, cls=DjangoJSONEncoder))

    def watches(self, update_fields: frozenset[str] | None) -> bool:
        return update_fields is None or not self.watch or bool(update_fields & self.watch)


def _path(row: Any, path: str) -> Any:
    value = row
    for part in path.split("."):
        if value is None:
            return None
        value = getattr(value, part)
    return list(value) if isinstance(value, list | tuple) else value


def _permission(permission: Permission) -> str:
    return f"{permission.content_type.app_label}.{permission.codename}"


def _username(path: str) -> Callable[[Any], str | None]:
    def read(row: Any) -> str | None:
        person = _path(row, path)
        return person.get_username() if person is not None else None

    return read


User = get_user_model()

AUTHORITIES: list[Authority] = [
    Authority(Tenant, "tenant", lambda t: t.slug, {"name": "name"}),
    Authority(
        User,
        "user",
        lambda u: u.get_username(),
        {
            "active": "is_active",
            "staff": "is_staff",
            "superuser": "is_superuser",
            # Whether the person can log in with a password; never the hash.
            "password_login": lambda u: u.has_usable_password(),
        },
        many={
            "groups": ("groups", lambda g: g.name),
            "permissions": ("user_permissions", _permission),
        },
        watch=frozenset({User.USERNAME_FIELD, "is_active", "is_staff", "is_superuser", "password"}),
    ),
    Authority(
        Group, "group", lambda g: g.name, {}, many={"permissions": ("permissions", _permission)}
    ),
    Authority(
        Membership,
        "membership",
        lambda m: f"{m.tenant_id}/{m.user.get_username()}",
        {"role": "role"},
        related=("user",),
    ),
    Authority(SsoGroupRole, "sso_group", lambda r: f"{r.group}/{r.tenant_id}", {"role": "role"}),
    # Which ledger user a Slack user's Approve / Reject clicks decide as (attempts/slack.py).
    Authority(
        SlackIdentity,
        "slack_identity",
        lambda r: f"{r.team_id}/{r.slack_user_id}",
        {"user": _username("user")},
        related=("user",),
    ),
    Authority(
        SsoIdentity,
        "sso_identity",
        lambda i: i.user.get_username(),
        {"subject": "subject"},
        related=("user",),
        watch=frozenset({"user", "user_id", "subject"}),
    ),
    Authority(
        AgentToken,
        "agent_token",
        lambda t: t.name,
        {
            # The prefix tells tokens apart; the secret and its hash are never recorded.
            "prefix": "prefix",
            "revoked": lambda t: t.revoked_at is not None,
            "created_by": _username("created_by"),
        },
        many={"tenants": ("tenants", lambda t: t.slug)},
        related=("created_by",),
        watch=frozenset({"name", "prefix", "token_hash", "revoked_at", "created_by"}),
    ),
    Authority(
        Tool,
        "tool",
        lambda t: t.name,
        {name: name for name in TOOL_FIELDS},
    ),
    Authority(
        Grant,
        "grant",
        lambda g: f"{g.tenant_id}/{g.tool_id}",
        {
            name: name
            for name in ("tenant_id", "tool_id", "policy_version", "allowed_scopes", "active")
        },
    ),
    Authority(
        OwnershipRule,
        "ownership_rule",
        lambda r: str(r.pk),
        {
            "tenant_pattern": "tenant_pattern",
            "tool_pattern": "tool_pattern",
            "priority": "priority",
            "owner": _username("owner"),
        },
        related=("owner",),
    ),
    Authority(
        SlaPolicy,
        "sla_policy",
        lambda p: f"{p.tool_id}/{p.tenant_id or '*'}",
        {
            "unknown_warn_after": "unknown_warn_after",
            "unknown_breach_after": "unknown_breach_after",
            "review_warn_after": "review_warn_after",
            "review_breach_after": "review_breach_after",
            "escalate_to": _username("escalate_to"),
        },
        related=("escalate_to",),
    ),
    Authority(
        NotificationRoute,
        "notification_route",
        lambda r: r.name,
        {
            "tenant_pattern": "tenant_pattern",
            "tool_pattern": "tool_pattern",
            "kinds": lambda r: sorted(r.kinds),
            "slack_channel": "slack_channel",
            "active": "active",
        },
        many={"people": ("people", lambda p: p.get_username())},
    ),
    Authority(
        ApprovalPolicy,
        "approval_policy",
        lambda p: p.name,
        {
            "tool": "tool_id",
            "tenants": lambda p: sorted(p.tenants),
            "condition": "condition",
            "approvals_needed": "approvals_needed",
            "approver_role": "approver_role",
            "approver_group": "approver_group",
            "approval_ttl": "approval_ttl",
            "max_wait": "max_wait",
            "active": "active",
            "version": "version",
        },
    ),
    Authority(
        RetentionRule,
        "retention_rule",
        lambda r: f"{r.tenant_id}/{r.tool_id}",
        {"archive_after_days": "archive_after_days"},
    ),
]

# Subjects recorded beside the declared models' rows: the authority baseline and archives.
OTHER_KINDS = ("authority", "archive")


def subject_kinds() -> tuple[str, ...]:
    """Every kind a change's subject may have (the prefix before ``:``), for filters."""
    return (*(authority.kind for authority in AUTHORITIES), *OTHER_KINDS)


_BY_MODEL: dict[type[models.Model], Authority] = {}
# many-to-many through model -> (authority, attribute)
_BY_THROUGH: dict[type[models.Model], tuple[Authority, str]] = {}


def register(authority: Authority) -> None:
    """Declare one more authority model (its changes are recorded from then on)."""
    if authority.model in _BY_MODEL or any(a.kind == authority.kind for a in AUTHORITIES):
        if _BY_MODEL.get(authority.model) is authority:
            return
        raise ValueError(f"{authority.model.__name__} ({authority.kind}) is already declared")
    AUTHORITIES.append(authority)
    _connect(authority)


def authority_for(model: type[models.Model]) -> Authority | None:
    """The declaration of ``model`` (None when its rows decide nothing)."""
    return _BY_MODEL.get(model._meta.concrete_model)


def snapshot(instance: models.Model) -> dict[str, Any]:
    """The recorded fields of ``instance`` as JSON values."""
    authority = authority_for(type(instance))
    if authority is None:
        raise TypeError(f"{type(instance).__name__} is not tracked configuration")
    return authority.snapshot(instance)


# ---------------------------------------------------------------------------------------------
# Who acts


@dataclass(frozen=True)
class _Acting:
    actor: Actor | Callable[[], Actor]
    reason: str | Callable[[], str]


_acting: contextvars.ContextVar[_Acting | None] = contextvars.ContextVar(
    "ledgerweb_acting", default=None
)


@contextlib.contextmanager
def acting(
    actor: Actor | Callable[[], Actor], reason: str | Callable[[], str] = ""
) -> Iterator[None]:
    """Record the authority changes made inside as ``actor``'s, for ``reason`` (either may be
    a function, asked only when a change is recorded)."""
    token = _acting.set(_Acting(actor, reason))
    try:
        yield
    finally:
        _acting.reset(token)


def _who() -> tuple[Actor, str]:
    current = _acting.get()
    if current is None:
        process = " ".join(os.path.basename(part) for part in sys.argv[:2]) or "python"
        return Actor.system("unattributed"), f"no actor given (process {process})"
    actor = current.actor() if callable(current.actor) else current.actor
    reason = current.reason() if callable(current.reason) else current.reason
    return actor, reason


class ActingMiddleware:
    """Changes made while serving a request are the signed-in person's (``admin`` for the
    admin site); an anonymous request's (a password reset) are ``system:anonymous``."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        def actor() -> Actor:
            user = getattr(request, "user", None)
            if user is not None and user.is_authenticated:
                return Actor.user(user)
            return Actor.system("anonymous")

        def reason() -> str:
            match = getattr(request, "resolver_match", None)
            if match is not None and match.namespace == "admin":
                return "admin"
            return f"web {match.view_name if match else request.method}"

        with acting(actor, reason):
            return self.get_response(request)


# ---------------------------------------------------------------------------------------------
# Recording


def _record(subject: str, action: str, before: Any, after: Any, *, note: str = "") -> None:
    actor, reason = _who()
    if note:
        reason = f"{reason}; {note}" if reason else note
    record_config_change(
        subject=subject, action=action, actor=actor, before=before, after=after, reason=reason
    )


def _in_transaction(function: Callable[[], None]) -> None:
    if dbadapter.in_atomic_block(connection):
        function()
    else:  # a change saved outside a transaction: its record follows at once
        with write_transaction():
            function()


def _changed(
    before: dict[str, Any] | None, after: dict[str, Any], *, keep: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Only the fields that changed (everything for a creation)."""
    if keep is None or before is None:
        return keep
    return {name: keep[name] for name in after if before.get(name) != after.get(name)}


def _record_move(
    old: tuple[str, dict[str, Any]] | None, new: tuple[str, dict[str, Any]] | None
) -> None:
    """Record one row going from ``old`` (subject, values) to ``new``."""
    if old is None and new is None:
        return
    if old is not None and new is not None and old[0] != new[0]:
        _record(old[0], "deleted", old[1], None, note=f"now {new[0]}")
        _record(new[0], "created", None, new[1], note=f"was {old[0]}")
    elif old is None:
        _record(new[0], "created", None, new[1])
    elif new is None:
        _record(old[0], "deleted", old[1], None)
    elif old[1] != new[1]:
        before, after = old[1], new[1]
        _record(
            new[0],
            "changed",
            _changed(before, after, keep=before),
            _changed(before, after, keep=after),
        )


def _state_of(authority: Authority, row: Any | None) -> tuple[str, dict[str, Any]] | None:
    return None if row is None else (authority.subject(row), authority.snapshot(row))


def _elsewhere(kwargs: dict[str, Any]) -> bool:
    """A change written to another database than the ledger's own (a crashtest scratch
    database seeded from outside): its history belongs to that database, whose own processes
    record their changes (a baseline covers what they find there)."""
    return kwargs.get("using", DEFAULT_DB_ALIAS) != DEFAULT_DB_ALIAS


def _pre_save(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    authority = _BY_MODEL.get(sender)
    if authority is None or raw or _elsewhere(kwargs):
        return
    fields = frozenset(update_fields) if update_fields is not None else None
    if not authority.watches(fields):
        instance._authority_before = False
        return
    ensure_baseline()
    stored = authority.fresh(instance.pk)
    instance._authority_before = (_state_of(authority, stored), getattr(stored, "password", None))


def _post_save(sender, instance, raw=False, **kwargs) -> None:
    authority = _BY_MODEL.get(sender)
    if authority is None or raw or _elsewhere(kwargs):
        return
    pending = instance.__dict__.pop("_authority_before", None)
    if pending is False:
        return
    old, old_password = pending if pending is not None else (None, None)
    new = _state_of(authority, authority.fresh(instance.pk))

    def record() -> None:
        _record_move(old, new)
        if (
            authority.kind == "user"
            and old is not None
            and new is not None
            and old_password != getattr(instance, "password", None)
        ):
            _record(new[0], "password.set", None, None)

    _in_transaction(record)


def _pre_delete(sender, instance, **kwargs) -> None:
    authority = _BY_MODEL.get(sender)
    if authority is None or _elsewhere(kwargs):
        return
    ensure_baseline()
    instance._authority_deleted = _state_of(authority, authority.fresh(instance.pk) or instance)


def _post_delete(sender, instance, **kwargs) -> None:
    old = instance.__dict__.pop("_authority_deleted", None)
    if old is not None:
        _in_transaction(lambda: _record_move(old, None))


def _m2m_changed(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
    entry = _BY_THROUGH.get(sender)
    if entry is None or _elsewhere(kwargs):
        return
    authority, attr = entry
    if action.startswith("pre_"):
        ensure_baseline()
        if not reverse:
            owners = [instance.pk]
        elif pk_set is not None:
            owners = list(pk_set)
        else:  # clearing from the other side: every owner that names this row
            owners = list(
                authority.model._default_manager.filter(**{attr: instance}).values_list(
                    "pk", flat=True
                )
            )
        before = {pk: _state_of(authority, authority.fresh(pk)) for pk in owners}
        pending = instance.__dict__.setdefault("_authority_m2m", {})
        pending[(sender, action[4:])] = before
        return
    before = instance.__dict__.get("_authority_m2m", {}).pop((sender, action[5:]), None)
    if before is None:
        return

    def record() -> None:
        for pk, old in before.items():
            _record_move(old, _state_of(authority, authority.fresh(pk)))

    _in_transaction(record)


def _connect(authority: Authority) -> None:
    model = authority.model
    _BY_MODEL[model] = authority
    uid = f"authority:{model._meta.label}"
    signals.pre_save.connect(_pre_save, sender=model, dispatch_uid=uid + ":pre_save")
    signals.post_save.connect(_post_save, sender=model, dispatch_uid=uid + ":post_save")
    signals.pre_delete.connect(_pre_delete, sender=model, dispatch_uid=uid + ":pre_delete")
    signals.post_delete.connect(_post_delete, sender=model, dispatch_uid=uid + ":post_delete")
    for attr, _ in authority.many.values():
        through = getattr(model, attr).through
        _BY_THROUGH[through] = (authority, attr)
        signals.m2m_changed.connect(_m2m_changed, sender=through, dispatch_uid=f"{uid}:{attr}")


for _authority in AUTHORITIES:
    _connect(_authority)


def save_with_history(instance: models.Model, *, actor: Actor, reason: str = "", save=None) -> bool:
    """Save ``instance`` (with ``save()``, or the given callable) as ``actor``'s change, in one
    transaction. Returns whether anything recorded changed."""
    with acting(actor, reason), write_transaction():
        length = _config_length()
        (save or instance.save)()
        return _config_length() != length


def _config_length() -> int:
    return ConfigEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


# ---------------------------------------------------------------------------------------------
# Baseline, live rows and what the history says


# Kinds a committed baseline covers, learnt once per process.
_covered: set[str] = set()


def _baselined_kinds() -> set[str]:
    kinds: set[str] = set()
    for after in ConfigEvent.objects.filter(
        subject=AUTHORITY_SUBJECT, action=AUTHORITY_BASELINE
    ).values_list("after", flat=True):
        kinds.update((after or {}).get("kinds", []))
    return kinds


def ensure_baseline(*, force: bool = False) -> list[str]:
    """Record a baseline of every declared model no baseline covers yet (a ledger from before
    it was declared); returns the kinds baselined now. Runs inside the caller's transaction
    (or its own). What is covered is remembered per process; ``force`` asks the database."""
    wanted = {a.kind for a in AUTHORITIES}
    if not force and wanted <= _covered:
        return []
    with write_transaction():
        covered = _baselined_kinds()
        missing = [a for a in AUTHORITIES if a.kind not in covered]
        if missing:
            actor = Actor.system("baseline")
            reason = "rows that existed before their changes were recorded"
            record_config_change(
                subject=AUTHORITY_SUBJECT,
                action=AUTHORITY_BASELINE,
                actor=actor,
                before=None,
                after={"kinds": sorted(a.kind for a in missing)},
                reason=reason,
            )
            for authority in missing:
                for row in authority.rows().order_by("pk"):
                    record_config_change(
                        subject=authority.subject(row),
                        action="snapshot",
                        actor=actor,
                        before=None,
                        after=authority.snapshot(row),
                        reason=reason,
                    )
        done = covered | {a.kind for a in missing}
        transaction.on_commit(lambda: _covered.update(done))
    return sorted(a.kind for a in missing)


def live_authority() -> dict[str, dict[str, Any]]:
    """Every declared row as it is now: subject -> recorded fields."""
    state: dict[str, dict[str, Any]] = {}
    for authority in AUTHORITIES:
        for row in authority.rows():
            state[authority.subject(row)] = authority.snapshot(row)
    return state


def history_authority() -> dict[str, dict[str, Any]]:
    """What the configuration history says the declared rows are now."""
    events = ConfigEvent.objects.order_by("seq").values("subject", "action", "after").iterator()
    kinds = {a.kind for a in AUTHORITIES}
    return {
        subject: values
        for subject, values in authority_state(events).items()
        if subject.split(":", 1)[0] in kinds
    }


def authority_digest() -> str:
    """SHA-256 (hex) of the canonical JSON (RFC 8785) of every live authority row."""
    return authority_digest_of(live_authority())


def drift(
    live: dict[str, dict[str, Any]] | None = None, recorded: dict[str, dict[str, Any]] | None = None
) -> list[str]:
    """How the live rows differ from what the history says, one line per subject."""
    live = live_authority() if live is None else live
    recorded = history_authority() if recorded is None else recorded
    lines = []
    for subject in sorted(live.keys() | recorded.keys()):
        now, said = live.get(subject), recorded.get(subject)
        if now == said:
            continue
        if said is None:
            lines.append(f"{subject}: exists but the history never recorded it (added outside it)")
        elif now is None:
            lines.append(
                f"{subject}: the history says it exists but it is gone (deleted outside it)"
            )
        else:
            fields = sorted(
                name for name in now.keys() | said.keys() if now.get(name) != said.get(name)
            )
            shown = ", ".join(
                f"{n} is {now.get(n)!r}, history says {said.get(n)!r}" for n in fields
            )
            lines.append(f"{subject}: {shown}")
    return lines


def operator(name: str | None = None) -> Actor:
    """Who runs a command, as the history records it: ``name``, else the operating-system
    user. ValueError when neither is usable."""
    import getpass

    if name is None:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):
            raise ValueError("cannot tell who you are: give --actor NAME") from None
    name = name.strip()
    if not 0 < len(name) <= 150:
        raise ValueError("--actor must be 1 to 150 characters")
    return Actor(ActorKind.USER, name)
