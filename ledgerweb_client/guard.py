"""One agent tool call in the safe order, for the framework adapters and the MCP gateway.

The pieces every integration shares, so each rule has one home:

* ``KeyTemplate``: the idempotency key of a call, built from a template over its arguments and
  the tenant and task it runs for (``"ticket:{tenant}:{args.customer}:{args.title}"``).
* ``LedgerContext``: which ledger, tenant and task a call is recorded under; set per task with
  ``with use_ledger(...)`` or handed over through the framework's own run context.
* ``ToolCallError`` and its subclasses: the ledger's refusals (idempotency conflict, not granted,
  not dispatchable, outcome unknown...) as one family of exceptions that each adapter turns into
  its framework's tool error.
* ``GuardedCall``: record the intent, claim, let the caller send, then record the receipt, a
  refusal or UNKNOWN. Split into steps (``begin`` / ``succeeded`` / ``raised``) so that async
  frameworks can run the ledger's blocking HTTP calls in a thread around their own awaited send.
* ``json_receipt`` / ``read_json_receipt``: a small JSON result kept in ``result_ref`` so that a
  repeated call can return the recorded result instead of sending again.
* ``ledger_decision``: the ledger's answer to a framework that paused a call for approval
  (approved, rejected, or still pending), so each adapter only maps it onto its framework.

Standard library only, like the rest of the client.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .client import Attempt, AttemptCall, LedgerClient, State
from .errors import (
    IdempotencyConflict,
    InvalidRequest,
    LedgerError,
    LedgerUnavailable,
    ProviderRefused,
    Refused,
    Unauthorized,
)

__all__ = [
    "MAX_RESULT_REF",
    "ApprovalDecision",
    "GuardedCall",
    "KeyTemplate",
    "LedgerContext",
    "Recorded",
    "ToolCallConflict",
    "ToolCallAwaitingApproval",
    "ToolCallError",
    "ToolCallFailed",
    "ToolCallInvalid",
    "ToolCallLedgerUnavailable",
    "ToolCallNotDispatchable",
    "ToolCallNotGranted",
    "ToolCallOutcomeUnknown",
    "ToolCallRejected",
    "ToolSpec",
    "current_ledger",
    "json_receipt",
    "ledger_decision",
    "ledger_in",
    "read_json_receipt",
    "use_ledger",
]

log = logging.getLogger("ledgerweb_client")

T = TypeVar("T")

#: The longest ``result_ref`` the ledger stores.
MAX_RESULT_REF = 500
JSON_RECEIPT_PREFIX = "json:"
DIGEST_RECEIPT_PREFIX = "sha256:"

# ---------------------------------------------------------------------------------------------
# Idempotency keys from templates

_FIELD = re.compile(r"\{([^{}]*)\}")
_PATH_PART = re.compile(r"^[A-Za-z0-9_\-]+$")
_MISSING = object()


def template_value(value: Any) -> str:
    """How one value is written into a key: strings as they are, anything else as compact JSON
    with sorted keys (so the same arguments always give the same key)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class KeyTemplate:
    """A template for an idempotency key (or any other string built from a call).

    Fields in braces: the context names given as ``names`` (by default ``tenant``, ``task_id``
    and ``tool``), ``args`` (all arguments as compact JSON) or ``args.<name>[.<name>...]`` (one
    argument, or a field inside one). ``{{`` and ``}}`` are literal braces. An unknown field is
    a ``ValueError`` when the template is made, not when a call arrives.
    """

    def __init__(self, template: str, *, names: Sequence[str] = ("tenant", "task_id", "tool")):
        if not isinstance(template, str) or not template.strip():
            raise ValueError("a key template must be a non-empty string")
        self.template = template
        self._names = frozenset(names)
        self._parts: list[tuple[str, str | tuple[str, ...] | None]] = []
        position = 0
        escaped = template.replace("{{", "\0").replace("}}", "\1")
        for match in _FIELD.finditer(escaped):
            literal = escaped[position : match.start()]
            self._add_literal(literal)
            self._parts.append(("field", self._parse_field(match.group(1))))
            position = match.end()
        self._add_literal(escaped[position:])

    def _add_literal(self, literal: str) -> None:
        if "{" in literal or "}" in literal:
            raise ValueError(f"unbalanced brace in key template {self.template!r}")
        if literal:
            self._parts.append(("text", literal.replace("\0", "{").replace("\1", "}")))

    def _parse_field(self, field: str) -> str | tuple[str, ...]:
        if field in self._names:
            return field
        if field == "args":
            return ()
        if field.startswith("args."):
            path = tuple(field[len("args.") :].split("."))
            if all(_PATH_PART.match(part) for part in path):
                return path
        allowed = ", ".join(sorted(self._names | {"args", "args.<name>"}))
        raise ValueError(
            f"unknown field {{{field}}} in key template {self.template!r} (allowed: {allowed})"
        )

    @property
    def argument_paths(self) -> list[tuple[str, ...]]:
        """The argument paths the template reads (``()`` stands for all arguments)."""
        return [part for kind, part in self._parts if kind == "field" and isinstance(part, tuple)]

    def render(self, args: Mapping[str, Any], **names: str) -> str:
        """The key for one call; ``ValueError`` naming the argument when one is missing."""
        out = []
        for kind, part in self._parts:
            if kind == "text":
                out.append(str(part))
            elif isinstance(part, tuple):
                value: Any = dict(args)
                for step in part:
                    value = value.get(step, _MISSING) if isinstance(value, Mapping) else _MISSING
                    if value is _MISSING:
                        raise ValueError(
                            f"the key template {self.template!r} needs argument "
                            f"{'.'.join(part)!r}, which the call does not have"
                        )
                out.append(template_value(value))
            else:
                value = names.get(str(part))
                if value is None:
                    raise ValueError(f"the key template needs {{{part}}}, which is not set")
                out.append(template_value(value))
        return "".join(out)

    def __repr__(self) -> str:
        return f"KeyTemplate({self.template!r})"


# ---------------------------------------------------------------------------------------------
# Which ledger, tenant and task a call runs under


@dataclass(frozen=True)
class LedgerContext:
    """The ledger client and the authority (tenant, task, optional policy version and scope)
    tool calls are recorded under."""

    client: LedgerClient
    tenant: str
    task_id: str
    policy_version: str | None = None
    credential_scope: tuple[str, ...] | None = None

    def record(
        self,
        tool_name: str,
        idempotency_key: str,
        args: Mapping[str, Any],
        *,
        wait_for_approval: float = 0,
    ) -> Attempt:
        """Record a call's intent under this authority (``LedgerClient.record_and_wait``: a
        held call long-polls up to ``wait_for_approval`` seconds); the attempt as it stands."""
        return self.client.record_and_wait(
            tenant=self.tenant,
            task_id=self.task_id,
            tool_name=tool_name,
            idempotency_key=idempotency_key,
            args=args,
            policy_version=self.policy_version,
            credential_scope=self.credential_scope,
            wait_for_approval=wait_for_approval,
        )


_current: contextvars.ContextVar[LedgerContext | None] = contextvars.ContextVar(
    "ledgerweb_context", default=None
)


@contextmanager
def use_ledger(
    client: LedgerClient,
    *,
    tenant: str,
    task_id: str,
    policy_version: str | None = None,
    credential_scope: Sequence[str] | None = None,
) -> Iterator[LedgerContext]:
    """Record the guarded tool calls made inside the block under this tenant and task."""
    context = LedgerContext(
        client,
        tenant,
        task_id,
        policy_version,
        tuple(credential_scope) if credential_scope is not None else None,
    )
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def ledger_in(candidate: Any) -> LedgerContext:
    """The ``LedgerContext`` a framework hands a tool: ``candidate`` itself (a run's context or
    dependencies), or its ``ledger`` attribute, else the ``use_ledger`` one."""
    if isinstance(candidate, LedgerContext):
        return candidate
    nested = getattr(candidate, "ledger", None)
    if isinstance(nested, LedgerContext):
        return nested
    return current_ledger()


def current_ledger() -> LedgerContext:
    """The ``LedgerContext`` set by the innermost ``use_ledger`` block; ``ToolCallInvalid``
    outside one (a guarded tool must not run unrecorded)."""
    context = _current.get()
    if context is None:
        raise ToolCallInvalid(
            "no ledger context for this tool call: run it inside 'with use_ledger(client, "
            "tenant=..., task_id=...)' or pass the context through the framework"
        )
    return context


# ---------------------------------------------------------------------------------------------
# The ledger's refusals as tool errors


class ToolCallError(Exception):
    """A guarded tool call that the ledger refused, or whose outcome it could not settle.

    ``code`` is machine-readable (the subclasses' ``CODE``); ``attempt`` the attempt as the
    ledger last reported it, when there is one. ``sent`` says whether this call reached the
    provider (True only for ``ToolCallOutcomeUnknown`` and ``ToolCallFailed`` after a send).
    """

    CODE = "ledger_error"

    def __init__(self, message: str, *, attempt: Attempt | None = None, sent: bool = False):
        super().__init__(message)
        self.message = message
        self.attempt = attempt
        self.sent = sent

    @property
    def code(self) -> str:
        return self.CODE

    @property
    def for_model(self) -> str:
        """What a framework tells the model: ``ledgerweb <code>: <message>``."""
        return f"ledgerweb {self.code}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """What a framework may show the agent: code, message, and the attempt's id and state."""
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.attempt is not None:
            data["attempt_id"] = self.attempt.attempt_id
            data["state"] = self.attempt.state
            data["idempotency_key"] = self.attempt.idempotency_key
        return data


class ToolCallInvalid(ToolCallError):
    """The call cannot be recorded as given (a key field is missing, the ledger refused a field,
    the tool is unknown to it). Nothing was recorded or sent."""

    CODE = "invalid_call"


class ToolCallConflict(ToolCallError):
    """The idempotency key is already recorded with other arguments (or tenant, or tool).
    Nothing was overwritten or sent: the key names another effect than the caller thinks."""

    CODE = "idempotency_conflict"


class ToolCallNotGranted(ToolCallError):
    """The ledger does not let this agent run this tool for this tenant (or scope). Nothing
    was recorded or sent."""

    CODE = "not_granted"


class ToolCallNotDispatchable(ToolCallError):
    """The attempt under this key is in flight, waits for a person, or was superseded: this
    call must not send. ``attempt.state`` says which."""

    CODE = "not_dispatchable"


class ToolCallOutcomeUnknown(ToolCallError):
    """The effect may or may not have happened (timeout, lost answer, crash, or an earlier call
    left it so). The ledger holds it as UNKNOWN and reconciliation looks it up; do not retry
    with another key."""

    CODE = "outcome_unknown"


class ToolCallFailed(ToolCallError):
    """The provider definitively did not perform the effect (now, or in an earlier call under
    the same key). ``retryable`` says whether the same key may be sent again later."""

    CODE = "failed"

    def __init__(
        self,
        message: str,
        *,
        attempt: Attempt | None = None,
        sent: bool = False,
        retryable: bool = False,
    ):
        super().__init__(message, attempt=attempt, sent=sent)
        self.retryable = retryable


class ToolCallRejected(ToolCallFailed):
    """An approver rejected the held call, or nobody approved it within the policy's maximum
    wait (``reason``: ``approval_rejected`` or ``approval_expired``). Nothing was sent and
    nothing will be under this key."""

    CODE = "approval_rejected"

    def __init__(self, message: str, *, attempt: Attempt | None = None, reason: str = ""):
        super().__init__(message, attempt=attempt)
        self.reason = reason or "approval_rejected"


class ToolCallAwaitingApproval(ToolCallError):
    """An approval policy holds the call (AWAITING_APPROVAL): nothing was sent; people decide on
    the ledger's dashboard. The same call (same key) later continues it: claimed and sent once
    approved, ``ToolCallRejected`` when rejected or expired. ``approval_request`` is what a
    person or a framework's pause needs to know."""

    CODE = "awaiting_approval"

    def __init__(self, message: str, *, attempt: Attempt, dashboard_url: str | None = None):
        super().__init__(message, attempt=attempt)
        self.dashboard_url = dashboard_url

    @property
    def approval_request(self) -> dict[str, Any]:
        """JSON-ready: ``attempt_id``, ``state``, ``tenant``, ``tool``, ``idempotency_key``,
        ``args``, ``args_hash`` (what approvals are bound to), ``approval_policy``,
        ``dashboard_url`` and ``message``."""
        attempt = self.attempt
        assert attempt is not None
        return {
            "kind": "ledgerweb.approval",
            "attempt_id": attempt.attempt_id,
            "state": attempt.state,
            "tenant": attempt.tenant,
            "tool": attempt.tool_name,
            "idempotency_key": attempt.idempotency_key,
            "args": dict(attempt.args) if attempt.args is not None else None,
            "args_hash": attempt.args_hash,
            "approval_policy": attempt.raw.get("approval_policy"),
            "dashboard_url": self.dashboard_url,
            "message": self.message,
        }

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), **self.approval_request}


def awaiting_approval(context: LedgerContext, attempt: Attempt) -> ToolCallAwaitingApproval:
    """The refusal for a held attempt, with its dashboard link."""
    return ToolCallAwaitingApproval(
        f"an approval policy ({attempt.raw.get('approval_policy') or 'unnamed'}) holds this call "
        f"until a person approves it: nothing was sent. Attempt {attempt.attempt_id}; the same "
        "call later continues it (sent once approved, refused if rejected)",
        attempt=attempt,
        dashboard_url=context.client.dashboard_url(attempt.attempt_id),
    )


class ToolCallLedgerUnavailable(ToolCallError):
    """The ledger could not be reached before anything was sent. Safe to call again later with
    the same arguments."""

    CODE = "ledger_unavailable"


def _refusal(exc: LedgerError) -> ToolCallError:
    """A ledger error raised while recording the intent or claiming: nothing was sent."""
    if isinstance(exc, IdempotencyConflict):
        return ToolCallConflict(f"idempotency key already used for another call: {exc.message}")
    if isinstance(exc, Refused | Unauthorized):
        return ToolCallNotGranted(f"the ledger refused this call: {exc.message}")
    if isinstance(exc, InvalidRequest):
        return ToolCallInvalid(f"the ledger cannot record this call: {exc.message}")
    if isinstance(exc, LedgerUnavailable):
        return ToolCallLedgerUnavailable(f"the ledger is unavailable, nothing was sent: {exc}")
    return ToolCallError(f"the ledger refused this call: {exc}")


# ---------------------------------------------------------------------------------------------
# Receipts small enough for result_ref


def json_receipt(value: Any, *, prefix: str = JSON_RECEIPT_PREFIX) -> str:
    """``value`` as a ``result_ref``: ``json:<compact JSON>`` when it is JSON and fits the
    ledger's 500 characters, so a repeated call can return it; otherwise ``sha256:<digest>`` of
    its text, which proves what was received but cannot be returned again."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = None
    if text is not None and len(prefix) + len(text) <= MAX_RESULT_REF:
        return prefix + text
    raw = text if text is not None else repr(value)
    return DIGEST_RECEIPT_PREFIX + hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()


def read_json_receipt(result_ref: str | None, *, prefix: str = JSON_RECEIPT_PREFIX) -> Any:
    """The value kept by ``json_receipt``; ``_MISSING`` (use ``has_value``) for anything else."""
    if result_ref and result_ref.startswith(prefix):
        try:
            return json.loads(result_ref[len(prefix) :])
        except ValueError:
            return _MISSING
    return _MISSING


def has_value(value: Any) -> bool:
    """False for what ``read_json_receipt`` returns when the receipt holds no value."""
    return value is not _MISSING


@dataclass(frozen=True)
class Recorded:
    """The outcome an earlier call recorded under the same key; nothing was sent this time."""

    attempt: Attempt

    @property
    def result_ref(self) -> str | None:
        return self.attempt.result_ref

    def value(self, default: Any = None) -> Any:
        """The earlier call's result when its receipt kept it (``json_receipt``), else
        ``default``."""
        value = read_json_receipt(self.attempt.result_ref)
        return value if has_value(value) else default

    def value_or_text(self) -> Any:
        """What a framework's tool returns for a repeated call: the kept result, else the text
        that says it was done already (``str(self)``)."""
        return self.value(default=str(self))

    def __str__(self) -> str:
        return (
            f"already done: attempt {self.attempt.attempt_id} was confirmed earlier under key "
            f"{self.attempt.idempotency_key!r} (receipt {self.attempt.result_ref!r})"
        )


# ---------------------------------------------------------------------------------------------
# The safe order, one step at a time


def _not_approved(attempt: Attempt) -> str | None:
    """``approval_rejected`` or ``approval_expired`` for a held call that people rejected or let
    expire (FAILED: it is never sent), else None."""
    reason = attempt.raw.get("review_reason")
    if attempt.state == State.FAILED and reason in ("approval_rejected", "approval_expired"):
        return str(reason)
    return None


def _not_sending(attempt: Attempt) -> Recorded:
    """What a call that may not send gets: the recorded outcome, or the refusal that says why."""
    state = attempt.state
    if state == State.OUTCOME_CONFIRMED:
        return Recorded(attempt)
    if state == State.UNKNOWN:
        raise ToolCallOutcomeUnknown(
            "an earlier call under this key may or may not have taken effect; reconciliation is "
            "looking it up, so it is not sent again",
            attempt=attempt,
        )
    reason = _not_approved(attempt)
    if reason is not None:
        why = (
            "an approver rejected it"
            if reason == "approval_rejected"
            else "nobody approved it within the approval policy's maximum wait"
        )
        raise ToolCallRejected(
            f"this call was held for approval and {why}: nothing was sent, and nothing will be "
            "under this key",
            attempt=attempt,
            reason=reason,
        )
    if state == State.FAILED:
        raise ToolCallFailed(
            "an earlier call under this key definitively failed; it will not be sent again",
            attempt=attempt,
        )
    if state == State.MANUAL_REVIEW:
        why = "waits for a person to decide"
    elif state == State.RECONCILED:
        why = "was superseded by a linked attempt"
    else:
        why = f"is in flight ({state})"
    raise ToolCallNotDispatchable(
        f"the attempt under this key {why}; this call does not send", attempt=attempt
    )


class GuardedCall:
    """The safe order around one tool call, in steps.

    ``begin()`` records the intent and claims the dispatch. It returns ``None`` when this call
    holds the claim (send now), or the ``Recorded`` outcome of an earlier call under the same
    key; it raises a ``ToolCallError`` for every refusal, before anything is sent. After the
    send, call exactly one of ``succeeded(...)`` (records the provider's id and, when given, the
    durable receipt that confirms the attempt) or ``raised(exc)`` (records UNKNOWN, or the
    refusal a ``ProviderRefused`` describes, and returns the ``ToolCallError`` to raise).

    Every step blocks on HTTP: async callers run them in a worker thread.
    """

    def __init__(
        self,
        context: LedgerContext,
        *,
        tool_name: str,
        idempotency_key: str,
        args: Mapping[str, Any],
    ) -> None:
        self.context = context
        self.tool_name = tool_name
        self.idempotency_key = idempotency_key
        self.args = dict(args)
        self._call: AttemptCall | None = None
        self._linked = False

    @property
    def attempt(self) -> Attempt | None:
        """The attempt as the ledger last reported it (None before ``begin`` recorded it)."""
        try:
            return self._call.attempt if self._call is not None else None
        except RuntimeError:
            return None

    @property
    def linked(self) -> bool:
        """True when the attempt this call claimed is a linked one (edit-and-approve corrected
        the arguments, or a reviewer approved a linked retry): send ``send_args`` under
        ``attempt.idempotency_key``, not the arguments the call came with."""
        return self._linked

    @property
    def send_args(self) -> dict[str, Any]:
        """The arguments to send: the linked attempt's when ``linked``, else the call's."""
        attempt = self.attempt
        if self._linked and attempt is not None and attempt.args is not None:
            return dict(attempt.args)
        return self.args

    def begin(self, *, wait_for_approval: float = 0, other_args: bool = False) -> Recorded | None:
        """Record the intent and claim the send (see the class docstring).

        A held call (AWAITING_APPROVAL) waits up to ``wait_for_approval`` seconds for people to
        decide, holding nothing (a long poll), then raises ``ToolCallAwaitingApproval`` if it is
        still held, ``ToolCallRejected`` if it was rejected or expired. A RECONCILED attempt with
        a linked attempt (edit-and-approve) is followed to it; when its arguments differ from
        the call's, it is claimed only with ``other_args=True`` (the caller can send
        ``send_args``); otherwise ``ToolCallNotDispatchable`` says so, before any claim."""
        context = self.context
        client = context.client
        try:
            attempt = context.record(
                self.tool_name,
                self.idempotency_key,
                self.args,
                wait_for_approval=wait_for_approval,
            )
        except LedgerError as exc:
            raise _refusal(exc) from exc
        self._linked = attempt.idempotency_key != self.idempotency_key
        if attempt.state == State.AWAITING_APPROVAL:
            raise awaiting_approval(context, attempt)
        if self._linked and not other_args and attempt.args != self.args:
            raise ToolCallNotDispatchable(
                f"an approver corrected the arguments: the work goes on in linked attempt "
                f"{attempt.attempt_id}, which this tool cannot send (it sends only the arguments "
                "it was called with); call it with the corrected arguments, or let the reconcile "
                "worker send it",
                attempt=attempt,
            )
        # Recorded already: the block claims this attempt (the linked one, after a link).
        self._call = AttemptCall(client, {}, start=attempt)
        try:
            self._call.__enter__()
        except LedgerError as exc:
            raise _refusal(exc) from exc
        if self._call.should_send:
            return None
        if self._call.attempt.state == State.AWAITING_APPROVAL:
            # Its approvals became void just before the claim (expired, approver left).
            raise awaiting_approval(context, self._call.attempt)
        return _not_sending(self._call.attempt)

    def succeeded(
        self, *, provider_request_id: str | None = None, result_ref: str | None = None
    ) -> Attempt:
        """The provider answered: record its request id and, when ``result_ref`` (a durable
        receipt) is given, confirm the attempt. Without a receipt the attempt stays DISPATCHED
        and reconciliation confirms it by lookup.

        A ledger that cannot record this does not undo the effect: the error is logged, the
        attempt stays DISPATCHED for reconciliation, and the caller keeps the provider's answer.
        """
        call = self._require_claim()
        try:
            if provider_request_id:
                call.provider_request(provider_request_id)
            if result_ref:
                call.confirm(result_ref[:MAX_RESULT_REF], provider_request_id or None)
        except LedgerError as exc:
            log.warning(
                "ledgerweb: could not record the outcome of attempt %s (%s); it stays "
                "DISPATCHED until reconciliation looks it up",
                call.attempt.attempt_id,
                exc,
            )
        call.__exit__(None, None, None)
        return call.attempt

    def raised(self, exc: BaseException) -> ToolCallError:
        """The send raised ``exc``: record what it means and return the error to raise (chain
        it: ``raise guard.raised(exc) from exc``).

        ``ProviderRefused`` records FAILED or FAILED_RETRYABLE and returns ``ToolCallFailed``;
        everything else (``ProviderTimeout``, a lost answer, a bug, a cancelled task) may have
        happened after the provider acted, so it is recorded as UNKNOWN and returns
        ``ToolCallOutcomeUnknown``.
        """
        call = self._require_claim()
        try:
            call.__exit__(type(exc), exc, exc.__traceback__)
        except LedgerError as ledger_exc:
            return ToolCallOutcomeUnknown(
                f"the send ended with {type(exc).__name__} and the ledger could not record it "
                f"({ledger_exc}); the attempt stays DISPATCHED until reconciliation looks it up",
                attempt=call.attempt,
                sent=True,
            )
        attempt = call.attempt
        if isinstance(exc, ProviderRefused):
            return ToolCallFailed(
                f"the provider refused: {exc.reason}",
                attempt=attempt,
                sent=True,
                retryable=exc.retryable,
            )
        text = str(exc) or type(exc).__name__
        return ToolCallOutcomeUnknown(
            f"the outcome is unknown ({text}); the ledger holds the attempt as {attempt.state} "
            "and reconciliation looks it up, so do not retry with another key",
            attempt=attempt,
            sent=True,
        )

    def _require_claim(self) -> AttemptCall:
        if self._call is None or not self._call.should_send:
            raise RuntimeError("succeeded()/raised() only after begin() returned None")
        return self._call


# ---------------------------------------------------------------------------------------------
# A tool's mapping onto the ledger, and the whole guarded call

Receipt = bool | Callable[[Any], str | None]
RequestId = str | Callable[[Any], str | None] | None
KeySource = str | KeyTemplate | Callable[[Mapping[str, Any], LedgerContext], str]


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


@dataclass(frozen=True)
class ToolSpec:
    """How one tool's calls are recorded: the ledger's tool name, the idempotency key, and what
    of the provider's answer is kept.

    ``key``: a template string (see ``KeyTemplate``) or a function ``(args, context) -> str``.
    ``receipt``: ``False`` (the answer is not a durable receipt: the attempt stays DISPATCHED
    and reconciliation confirms it by lookup), ``True`` (the answer is the durable receipt: it
    confirms the attempt and is kept with ``json_receipt``, so a repeated call returns it), or a
    function ``answer -> result_ref`` (``None`` for no receipt). ``request_id``: the name of the
    answer's field (or attribute) holding the provider's id for the request, or a function.
    """

    tool_name: str
    key: KeySource
    receipt: Receipt = False
    request_id: RequestId = None
    #: Seconds a held call waits (a long poll, holding nothing) before it is reported as
    #: ``ToolCallAwaitingApproval``; 0: report at once.
    wait_for_approval: float = 0

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            object.__setattr__(self, "key", KeyTemplate(self.key))
        if not self.tool_name:
            raise ValueError("tool_name must not be empty")

    def key_for(self, args: Mapping[str, Any], context: LedgerContext) -> str:
        """The idempotency key of a call; ``ToolCallInvalid`` when it cannot be built."""
        try:
            if isinstance(self.key, KeyTemplate):
                key = self.key.render(
                    args, tenant=context.tenant, task_id=context.task_id, tool=self.tool_name
                )
            else:
                key = self.key(args, context)  # type: ignore[operator]
        except ValueError as exc:
            raise ToolCallInvalid(f"cannot build the idempotency key: {exc}") from exc
        if not isinstance(key, str) or not key.strip():
            raise ToolCallInvalid("the idempotency key is empty")
        return key

    def outcome_of(self, answer: Any) -> tuple[str | None, str | None]:
        """(provider request id, result_ref) to record for the provider's answer."""
        if callable(self.request_id):
            provider_id = self.request_id(answer)
        elif self.request_id:
            provider_id = _field(answer, self.request_id)
        else:
            provider_id = None
        result_ref: str | None
        if self.receipt is True:
            result_ref = json_receipt(answer)
        elif callable(self.receipt):
            result_ref = self.receipt(answer)
        else:
            result_ref = None
        return (str(provider_id) if provider_id not in (None, "") else None), result_ref

    def guard(self, context: LedgerContext, args: Mapping[str, Any]) -> GuardedCall:
        return GuardedCall(
            context,
            tool_name=self.tool_name,
            idempotency_key=self.key_for(args, context),
            args=args,
        )

    def run(
        self,
        context: LedgerContext,
        args: Mapping[str, Any],
        send: Callable[[], T],
        replay: Callable[[Recorded], Any] | None = None,
        *,
        send_args: Callable[[dict[str, Any]], T] | None = None,
        wait_for_approval: float | None = None,
    ) -> T | Any:
        """The whole call: record, claim, ``send()``, record its answer. A repeated call
        returns ``replay(recorded)`` (by default the kept value, or the ``Recorded``) without
        sending; refusals raise ``ToolCallError``. ``send_args(args)`` sends other arguments
        than the call's: a linked attempt's, after edit-and-approve (``GuardedCall.begin``).
        ``wait_for_approval`` overrides the spec's."""
        guard = self.guard(context, args)
        recorded = guard.begin(
            wait_for_approval=self._wait(wait_for_approval), other_args=send_args is not None
        )
        if recorded is not None:
            return (replay or _default_replay)(recorded)
        try:
            if guard.linked and send_args is not None:
                answer = send_args(guard.send_args)
            else:
                answer = send()
        except BaseException as exc:
            raise guard.raised(exc) from exc
        provider_id, result_ref = self.outcome_of(answer)
        guard.succeeded(provider_request_id=provider_id, result_ref=result_ref)
        return answer

    async def arun(
        self,
        context: LedgerContext,
        args: Mapping[str, Any],
        send: Callable[[], Awaitable[T]],
        replay: Callable[[Recorded], Any] | None = None,
        *,
        send_args: Callable[[dict[str, Any]], Awaitable[T]] | None = None,
        wait_for_approval: float | None = None,
    ) -> T | Any:
        """``run`` for an awaited send; the ledger's blocking calls run in a worker thread."""
        guard = self.guard(context, args)
        recorded = await asyncio.to_thread(
            lambda: guard.begin(
                wait_for_approval=self._wait(wait_for_approval), other_args=send_args is not None
            )
        )
        if recorded is not None:
            return (replay or _default_replay)(recorded)
        try:
            if guard.linked and send_args is not None:
                answer = await send_args(guard.send_args)
            else:
                answer = await send()
        except BaseException as exc:
            # Record even when the task is being cancelled: the send may have happened.
            error = await asyncio.shield(asyncio.to_thread(guard.raised, exc))
            raise error from exc
        provider_id, result_ref = self.outcome_of(answer)
        await asyncio.to_thread(
            guard.succeeded, provider_request_id=provider_id, result_ref=result_ref
        )
        return answer

    def _wait(self, override: float | None) -> float:
        return self.wait_for_approval if override is None else max(0.0, float(override))


def _default_replay(recorded: Recorded) -> Any:
    return recorded.value(default=recorded)


# ---------------------------------------------------------------------------------------------
# The ledger's answer to a framework that paused a call for approval


@dataclass(frozen=True)
class ApprovalDecision:
    """What the ledger decided on a call a framework paused for approval.

    ``outcome``: ``"approved"`` (no policy holds it, people approved it, or a linked attempt
    after edit-and-approve carries it on: the tool sends when it runs), ``"rejected"`` (people
    rejected it or it expired: ``reason``; nothing is ever sent) or ``"pending"`` (still held).
    """

    outcome: Literal["approved", "rejected", "pending"]
    reason: str = ""

    @classmethod
    def of(cls, attempt: Attempt) -> ApprovalDecision:
        """The decision an attempt's state says."""
        if attempt.state == State.AWAITING_APPROVAL:
            return cls("pending")
        reason = _not_approved(attempt)
        return cls("approved") if reason is None else cls("rejected", reason)

    @property
    def for_model(self) -> str:
        """What the model is told of a rejected call."""
        return (
            f"ledgerweb {ToolCallRejected.CODE}: the ledger's approvers did not approve this call "
            f"({self.reason}); nothing was sent"
        )


async def ledger_decision(
    spec: ToolSpec,
    context: LedgerContext,
    arguments: Callable[[], Mapping[str, Any]],
    *,
    wait: float = 0,
) -> ApprovalDecision:
    """Ask the ledger about a call a framework paused: its intent is recorded (the same one its
    tool records when it runs: same key), waiting up to ``wait`` seconds while it is held. A
    call the ledger refuses, or whose ``arguments()`` do not bind (``ValueError``,
    ``TypeError``), is approved: its tool refuses it when it runs, and says why."""
    try:
        args = arguments()
        key = spec.key_for(args, context)
        attempt = await asyncio.to_thread(
            functools.partial(context.record, spec.tool_name, key, args, wait_for_approval=wait)
        )
    except (ValueError, TypeError, ToolCallError, LedgerError):
        return ApprovalDecision("approved")
    return ApprovalDecision.of(attempt)
