"""The attempt (protocol section 2), its states and its queryset: tenant scoping, approvals
awaiting a person, held work, amounts, prefix search.

Only ``attempts.states`` changes ``Attempt.state``; everything else asks it.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, models
from django.db.models import Case, Exists, F, OuterRef, Q, Subquery, Value, When, signals
from django.db.models.base import ModelState
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Collate, Upper

from attempts.models.approvals import (
    Approval,
    ApprovalPolicy,
    ApprovalVerdict,
    approvers,
    held_verdict,
    review_verdict,
)
from attempts.models.events import (
    APPROVAL_ACTION,
    DECISIVE_ACTIONS,
    MOVED,
    ActorKind,
    AttemptEvent,
)
from attempts.models.querysets import LedgerQuerySet
from attempts.models.roles import Role, Tenant, sso_groups, tenants_where
from attempts.models.tools import Tool

if TYPE_CHECKING:
    from attempts.models.retention import ArchivedAttempt


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


# Shortest search term matched as a prefix (shorter ones match exactly only).
MIN_PREFIX = 4


PREFIX_FIELDS = ("idempotency_key", "provider_request_id", "task_id", "attempt_id", "args_hash")


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Every pair of Crockford letters, by the 10 bits it spells: an id is 13 lookups, not 26.
_CROCKFORD_PAIRS = [first + second for first in _CROCKFORD for second in _CROCKFORD]
_PAIR_SHIFTS = range(120, -1, -10)


# What an attempt id may look like in a URL or a form (ids are ``att_`` + 26 Crockford letters).
ATTEMPT_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def new_attempt_id() -> str:
    """A ULID-style id: 48 bits of milliseconds then 80 random bits, so ids sort by creation."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    return "att_" + "".join([_CROCKFORD_PAIRS[value >> shift & 1023] for shift in _PAIR_SHIFTS])


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


# How many leading characters of an args hash its index keeps (``HashPrefix``).
HASH_PREFIX = 16


class HashPrefix(models.Func):
    """The first HASH_PREFIX characters of a hex digest: the key of ``attempt_args_hash16_idx``.
    Sixteen hex characters (64 bits) tell a ledger's hashes apart as well as the whole 64 do for
    a search, in a third of the index. Its bounds are in the SQL text, not parameters: SQLite
    uses an index on an expression only for the very same expression."""

    template = f"substr(%(expressions)s, 1, {HASH_PREFIX})"
    output_field = models.CharField()


def search_key(field: str) -> Any:
    """The expression a prefix search reads and orders by: the column in byte order. On
    PostgreSQL that is ``column COLLATE "C"``: the byte-order columns' own indexes
    (``ByteOrderCharField``, migration 0013; the planner drops a collation the column already
    has) and ``attempt_id_prefix_idx`` for ``attempt_id``, which foreign keys compare with
    columns of the database's collation. On SQLite the column itself (binary collation, its
    ordinary index). An args hash is read by its first HASH_PREFIX characters (``HashPrefix``,
    in byte order on both: the column is ``COLLATE "C"``)."""
    if field == "args_hash":
        return HashPrefix(F(field))
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


def attention_age(created_at: dt.datetime, now: dt.datetime) -> dt.timedelta:
    """How old attention work is, for its SLA and what the screens show: counted from when the
    attempt was recorded, whatever state it passed through since."""
    return now - created_at


# A queue's total is exact up to this many rows per lane; beyond it, an estimate.
QUEUE_COUNT_CAP = 1000


class AttemptQuerySet(LedgerQuerySet):
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
        if field == "args_hash" and len(value) > HASH_PREFIX:
            # The index range of its first characters, then the rest checked on each row.
            whole = keyed.filter(args_hash__gte=value, args_hash__lt=value + "\U0010ffff")
            keyed, value = whole, value[:HASH_PREFIX]
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
            # A prefix search of args hashes (``HashPrefix``): their first characters only.
            models.Index(HashPrefix("args_hash"), name="attempt_args_hash16_idx"),
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

    @classmethod
    def new(cls, **values: Any) -> Attempt:
        """A new, unsaved attempt: ``Attempt(**values)``, built straight into the instance's
        ``__dict__`` when every value is given by its column's attribute name (``tenant_id``,
        not ``tenant``), as the write path gives them, and nothing listens for its
        ``pre_init``/``post_init``: Django's per-field ``setattr`` in ``Model.__init__`` was a
        visible share of an intent (docs/scaling.md). What ``Model.__init__`` makes of the same
        values (its state, each column's value by attribute name) is held equal by
        tests/attempts/test_attempt_new.py. Fields not given get their defaults, as by keyword."""
        columns = _columns()
        if (
            not values.keys() <= columns.keys()
            or signals.pre_init.has_listeners(cls)
            or signals.post_init.has_listeners(cls)
        ):
            return cls(**values)  # a related object (parent=, approval_policy=) goes by keyword
        attempt = cls.__new__(cls)
        state = attempt.__dict__
        state["_state"] = ModelState()
        for name, (default, made) in columns.items():
            state[name] = values[name] if name in values else default() if made else default
        return attempt

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
        """The one home of "which approvals count", for held intents and linked attempts
        alike: the ``attempt.approval`` events of each attempt's own chain, never rows beside
        it (``approvals.review_verdict``, ``approvals.held_verdict``; the verifiers check the
        same rule offline). A page of attempts is read in a few queries."""
        from django.utils import timezone

        now = now or timezone.now()
        attempts = list(attempts)
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
        people = approvers({e.actor for listed in found.values() for e in listed})
        verdicts: dict[int, ApprovalVerdict] = {}
        for attempt in attempts:
            events, recorders = found[attempt.pk], attempt.recorders()
            by_tool = bool(critical.get(attempt.tool_name))
            if attempt.state == State.MANUAL_REVIEW or attempt.approval_policy_id is None:
                in_review = events and attempt.state == State.MANUAL_REVIEW
                since = attempt._last_move_id() if in_review else 0
                verdicts[attempt.pk] = review_verdict(
                    events, since=since, recorders=recorders, critical=by_tool
                )
            else:
                verdicts[attempt.pk] = held_verdict(
                    attempt,
                    policies[attempt.approval_policy_id],
                    events,
                    recorders=recorders,
                    people=people,
                    critical=by_tool,
                    now=now,
                )
        return verdicts

    def _last_move_id(self) -> int:
        return self.events.filter(MOVED).order_by("-id").values_list("id", flat=True).first() or 0

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


@functools.cache
def _columns() -> dict[str, tuple[Any, bool]]:
    """The attempt's columns by attribute name, in ``Model.__init__``'s positional order, each
    with its default: (a function that makes it, True) for a callable default, a new value each
    time; (the value, False) otherwise, one value for every attempt as Django shares it."""
    return {
        field.attname: (field.get_default, True)
        if field.has_default() and callable(field.default)
        else (field.get_default(), False)
        for field in Attempt._meta.concrete_fields
    }
