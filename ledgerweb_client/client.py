"""The ledgerweb agent client: record an intent, claim the send, record the outcome.

Standard library only; it never imports Django, so agent code can use it anywhere. It speaks the
agent-facing HTTP API of the ledger (section 9 of the protocol) over one persistent keep-alive
connection per ``LedgerClient``.

The safe order (section 4 of the protocol) is packaged twice:

* ``LedgerClient.call(..., send=fn)``: records the intent, claims the dispatch, calls ``fn`` only
  if this process won the claim, then records what ``fn`` reported.
* ``with LedgerClient.attempt(...) as call:``: the same steps around a block of the caller's own
  code, for when the send does not fit in one function.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from . import receipts
from .errors import (
    IdempotencyConflict,
    InvalidRequest,
    LedgerError,
    LedgerUnavailable,
    NotDispatchable,
    NotFound,
    ProviderError,
    ProviderRefused,
    Refused,
    StateConflict,
    Unauthorized,
)

__all__ = [
    "DISPATCHABLE_STATES",
    "TERMINAL_STATES",
    "Attempt",
    "AttemptCall",
    "CallResult",
    "LedgerClient",
    "SendResult",
    "State",
]

__version__ = "1.1.0"

if TYPE_CHECKING:
    # typing.Self is 3.11+; the checker's own typing_extensions has it for 3.10, and
    # annotations are never evaluated at run time.
    from typing_extensions import Self

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10: the same behaviour, str() and format() give the value

    class StrEnum(str, Enum):
        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]  # str's, as 3.11's StrEnum


# The longest long-poll the server allows by default (LEDGERWEB_APPROVAL_WAIT_MAX).
_POLL_MAX = 20
# Longest reason the client sends when it writes an exception's text into the ledger.
_MAX_REASON = 1000
# Most links followed from one attempt (edit-and-approve twice, a linked retry after it...).
_MAX_LINKS = 8


class State(StrEnum):
    """The states of an attempt (protocol section 3). Members compare equal to plain strings."""

    INTENT_RECORDED = "INTENT_RECORDED"
    DISPATCHED = "DISPATCHED"
    OUTCOME_CONFIRMED = "OUTCOME_CONFIRMED"
    FAILED_RETRYABLE = "FAILED_RETRYABLE"
    UNKNOWN = "UNKNOWN"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    MANUAL_REVIEW = "MANUAL_REVIEW"
    FAILED = "FAILED"
    RECONCILED = "RECONCILED"


#: States with a final outcome: nothing will be sent for the attempt again.
TERMINAL_STATES: frozenset[str] = frozenset(
    {State.OUTCOME_CONFIRMED, State.FAILED, State.RECONCILED}
)
#: States from which an agent's dispatch call may claim the send.
DISPATCHABLE_STATES: frozenset[str] = frozenset({State.INTENT_RECORDED, State.FAILED_RETRYABLE})


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; Python 3.10 has no notes, so the note goes where 3.11 keeps them
    (``__notes__``, which tracebacks print from 3.11 on) and stays readable by callers."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]  # 3.10's BaseException has none
        notes.append(note)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        # An owner may be given as a small object; keep its name.
        for key in ("username", "name", "id"):
            if value.get(key) is not None:
                return str(value[key])
    return str(value)


@dataclass(frozen=True)
class Attempt:
    """One attempt at one logical side effect, as the ledger reported it.

    A snapshot: it does not change when the ledger does; ask ``LedgerClient.get`` for a fresh one.
    ``args`` is the normalized arguments when the server included them, ``raw`` the whole object
    as received (including any fields this client does not know about). Neither takes part in
    equality: two snapshots are equal when their ledger fields are.
    """

    attempt_id: str
    tenant: str
    task_id: str
    tool_name: str
    idempotency_key: str
    args_hash: str
    state: str
    provider_request_id: str | None = None
    result_ref: str | None = None
    policy_version: str | None = None
    credential_scope: tuple[str, ...] | None = None
    parent_attempt_id: str | None = None
    owner: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    #: For a RECONCILED attempt, the newest attempt linked to it (a linked retry, or
    #: edit-and-approve with corrected arguments): its work continues there.
    linked_attempt_id: str | None = None
    #: The attempt's version: it grows by one with each change of its state.
    version: int | None = None
    #: Why it is in MANUAL_REVIEW (or was), e.g. ``approval_rejected`` or ``approval_expired``:
    #: what tells a rejected held call from an expired one.
    review_reason: str | None = None
    #: The approval policy that held the intent before dispatch, or None.
    approval_policy: str | None = None
    #: How many times the provider request was sent (the worker's sends of approved work count).
    send_count: int | None = None
    #: The W3C trace context the agent sent with the intent, and its trace id.
    traceparent: str | None = None
    trace_id: str | None = None
    args: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_terminal(self) -> bool:
        """True for OUTCOME_CONFIRMED, FAILED and RECONCILED: the attempt is settled for good."""
        return self.state in TERMINAL_STATES

    @property
    def is_dispatchable(self) -> bool:
        """True when an agent's dispatch call could claim the send (INTENT_RECORDED or
        FAILED_RETRYABLE). Only the ledger decides; this is a hint from the snapshot."""
        return self.state in DISPATCHABLE_STATES

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attempt:
        """Build an attempt from the ledger's JSON object.

        Lenient about everything except ``attempt_id`` and ``state``, which the client's own
        decisions depend on; raises ``ValueError`` when either is missing.
        """
        attempt_id = data.get("attempt_id")
        state = data.get("state")
        if attempt_id is None or isinstance(attempt_id, bool | dict | list):
            raise ValueError("attempt object without a usable 'attempt_id'")
        if not isinstance(state, str) or not state:
            raise ValueError("attempt object without a usable 'state'")
        scope = data.get("credential_scope")
        if isinstance(scope, str):
            scope_tuple: tuple[str, ...] | None = (scope,)
        elif isinstance(scope, list | tuple):
            scope_tuple = tuple(str(item) for item in scope)
        else:
            scope_tuple = None
        args = data.get("args")
        return cls(
            attempt_id=str(attempt_id),
            tenant=_opt_str(data.get("tenant")) or "",
            task_id=_opt_str(data.get("task_id")) or "",
            tool_name=_opt_str(data.get("tool_name")) or "",
            idempotency_key=_opt_str(data.get("idempotency_key")) or "",
            args_hash=_opt_str(data.get("args_hash")) or "",
            state=state,
            provider_request_id=_opt_str(data.get("provider_request_id")),
            result_ref=_opt_str(data.get("result_ref")),
            policy_version=_opt_str(data.get("policy_version")),
            credential_scope=scope_tuple,
            parent_attempt_id=_opt_str(data.get("parent_attempt_id")),
            owner=_opt_str(data.get("owner")),
            created_at=_opt_str(data.get("created_at")),
            updated_at=_opt_str(data.get("updated_at")),
            linked_attempt_id=_opt_str(data.get("linked_attempt_id")),
            version=_opt_int(data.get("version")),
            review_reason=_opt_str(data.get("review_reason")),
            approval_policy=_opt_str(data.get("approval_policy")),
            send_count=_opt_int(data.get("send_count")),
            traceparent=_opt_str(data.get("traceparent")),
            trace_id=_opt_str(data.get("trace_id")),
            args=dict(args) if isinstance(args, Mapping) else None,
            raw=dict(data),
        )


@dataclass(frozen=True)
class SendResult:
    """What the caller's send function returns after the provider accepted the request.

    ``provider_request_id`` is recorded the moment it is returned. ``result_ref`` must be a
    *durable* receipt (a receipt id, a lookup answer), not merely "the provider said 200": it
    confirms the attempt. Leave it ``None`` when there is no such receipt; the attempt then stays
    DISPATCHED and reconciliation confirms it by looking it up.
    """

    provider_request_id: str | None = None
    result_ref: str | None = None


@dataclass(frozen=True)
class CallResult:
    """The outcome of ``LedgerClient.call``.

    ``sent`` is True when this call claimed the dispatch and invoked the send function; False
    when the attempt already had an outcome or someone else holds it (then ``attempt`` says
    where it stands, and nothing was sent). ``provider_error`` is the ``ProviderTimeout``,
    ``ProviderLostResponse`` or ``ProviderRefused`` the send function raised, if any.
    """

    attempt: Attempt
    sent: bool
    send_result: SendResult | None = None
    provider_error: ProviderError | None = None

    @property
    def state(self) -> str:
        """The attempt's state after the call."""
        return self.attempt.state

    @property
    def confirmed(self) -> bool:
        """True when the attempt is OUTCOME_CONFIRMED (now, or from an earlier call)."""
        return self.attempt.state == State.OUTCOME_CONFIRMED

    @property
    def result_ref(self) -> str | None:
        """The durable receipt of the confirmed outcome, if any."""
        return self.attempt.result_ref


def _describe(exc: BaseException) -> str:
    text = str(exc)
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return described[:_MAX_REASON]


class AttemptCall:
    """The safe order around a block of the caller's code; made by ``LedgerClient.attempt``.

    Entering the block records the intent and, unless the attempt already has an outcome, tries
    to claim the dispatch. Send only when ``should_send`` is True. Then, inside the block:

    * ``provider_request(id)`` as soon as the provider returns its request id;
    * ``confirm(result_ref)`` with a durable receipt.

    Leaving the block with an exception, after this process claimed the send and before an
    outcome was recorded:

    * ``ProviderTimeout`` / ``ProviderLostResponse`` -> the attempt is marked UNKNOWN (never a
      success, never a failure) and the exception is swallowed: it was a report, not an error;
    * ``ProviderRefused`` -> FAILED_RETRYABLE or FAILED per its ``retryable``, swallowed;
    * anything else (a socket timeout, a bug, KeyboardInterrupt) -> marked UNKNOWN with the
      exception's text as the reason, because the send may have happened; then re-raised.

    ``provider_error`` keeps the swallowed exception. If the ledger cannot record a swallowed
    report, the ``LedgerError`` is raised instead (chained to the report); if it cannot record an
    unexpected exception, the original exception is raised with a note. Either way the attempt
    stays DISPATCHED and reconciliation picks it up. A report's ``provider_request_id`` is
    recorded before the outcome; if the ledger refuses it (another id is recorded), the outcome
    is still recorded and then that ``StateConflict`` is raised.

    Leaving the block normally after a claim without ``confirm`` leaves the attempt DISPATCHED:
    that is the right state for "sent, outcome not yet verified", and reconciliation will look it
    up at the provider and settle it. Exceptions when nothing was claimed, or after an outcome
    was recorded, pass through untouched.
    """

    def __init__(
        self, client: LedgerClient, intent: dict[str, Any], start: Attempt | None = None
    ) -> None:
        self._client = client
        self._intent = intent
        # An attempt already recorded (and possibly reached by following a link): entering
        # claims it instead of recording the intent again.
        self._start = start
        self._attempt: Attempt | None = None
        self._entered = False
        self._claimed = False
        self._outcome_recorded = False
        self._provider_error: ProviderError | None = None

    def __enter__(self) -> Self:
        if self._entered:
            raise RuntimeError("an AttemptCall can be entered only once")
        self._entered = True
        attempt = self._start or self._client.record_intent(**self._intent)
        self._attempt = attempt
        if attempt.is_terminal:
            # Settled already (by an earlier run, or recovery): never send again.
            return self
        claimed, after = self._client._claim(attempt.attempt_id)
        self._claimed = claimed
        # After a claim the ledger normally returns the attempt; if it did not, or if the claim
        # was refused, read where the attempt stands now.
        self._attempt = after if after is not None else self._client.get(attempt.attempt_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None or not self._claimed or self._outcome_recorded:
            return False
        attempt_id = self.attempt.attempt_id
        if isinstance(exc, ProviderError):
            self._provider_error = exc
            attach_error: LedgerError | None = None
            if exc.provider_request_id is not None:
                try:
                    self.provider_request(exc.provider_request_id)
                except LedgerError as ledger_exc:
                    attach_error = ledger_exc  # still record the outcome first
            try:
                if isinstance(exc, ProviderRefused):
                    self.fail(exc.reason or _describe(exc), exc.retryable)
                else:
                    self.mark_unknown(_describe(exc))
            except LedgerError as ledger_exc:
                raise ledger_exc from exc
            if attach_error is not None:
                raise attach_error from exc
            return True
        # The send may or may not have happened: UNKNOWN is the only honest record.
        kind = "timeout" if isinstance(exc, TimeoutError) else "unexpected exception"
        try:
            self.mark_unknown(f"{kind} after dispatch: {_describe(exc)}"[:_MAX_REASON])
        except LedgerError as ledger_exc:
            _add_note(
                exc,
                f"ledgerweb: could not mark attempt {attempt_id} UNKNOWN ({ledger_exc}); it "
                "stays DISPATCHED until reconciliation looks it up",
            )
        return False

    def _require_claim(self, what: str) -> str:
        if not self._entered or self._attempt is None:
            raise RuntimeError(f"{what}: use the AttemptCall in a 'with' block first")
        if not self._claimed:
            raise RuntimeError(f"{what}: this process did not claim the dispatch; do not send")
        return self._attempt.attempt_id

    @property
    def attempt(self) -> Attempt:
        """The latest snapshot of the attempt this block works on."""
        if self._attempt is None:
            raise RuntimeError("the attempt is known only inside the 'with' block")
        return self._attempt

    @property
    def should_send(self) -> bool:
        """True only when this process claimed the dispatch: then, and only then, send."""
        return self._claimed

    @property
    def outcome_recorded(self) -> bool:
        """True once this block recorded an outcome (confirmed, failed or UNKNOWN)."""
        return self._outcome_recorded

    @property
    def provider_error(self) -> ProviderError | None:
        """The provider report (timeout, lost response, refusal) that ended the block, if any."""
        return self._provider_error

    def provider_request(self, provider_request_id: str) -> Attempt:
        """Record the provider's request id; call it the moment the provider returns it."""
        attempt_id = self._require_claim("provider_request")
        self._attempt = self._client.attach_provider_request(attempt_id, provider_request_id)
        return self._attempt

    def confirm(self, result_ref: str, provider_request_id: str | None = None) -> Attempt:
        """Confirm the outcome with a durable receipt (not just an HTTP 200)."""
        attempt_id = self._require_claim("confirm")
        self._attempt = self._client.confirm(attempt_id, result_ref, provider_request_id)
        self._outcome_recorded = True
        return self._attempt

    def fail(self, reason: str, retryable: bool) -> Attempt:
        """Record that the provider definitively did not perform the effect."""
        attempt_id = self._require_claim("fail")
        self._attempt = self._client.fail(attempt_id, reason, retryable)
        self._outcome_recorded = True
        return self._attempt

    def mark_unknown(self, reason: str) -> Attempt:
        """Record that the outcome is unknown (timeout, lost response)."""
        attempt_id = self._require_claim("mark_unknown")
        self._attempt = self._client.mark_unknown(attempt_id, reason)
        self._outcome_recorded = True
        return self._attempt


# Errors that mean "the peer closed the connection". On a connection that already carried a
# request, this is the classic keep-alive race: the server dropped the idle connection just as
# we reused it.
_DROPPED_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


def _error_class(status: int, code: str | None) -> type[LedgerError]:
    if status == 409:
        if code == "idempotency_conflict":
            return IdempotencyConflict
        if code == "not_dispatchable":
            return NotDispatchable
        return StateConflict
    if status in (400, 413, 422):
        return InvalidRequest
    if status == 401:
        return Unauthorized
    if status == 403:
        return Refused
    if status == 404:
        return NotFound
    if status in (408, 429) or status >= 500:
        return LedgerUnavailable
    return LedgerError


# The server refuses larger bodies (LEDGERWEB_MAX_BODY_BYTES, 1 MiB by default) with 413.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class LedgerClient:
    """A client of the ledger's agent API, over one persistent keep-alive connection.

    ``base_url`` is the server's root (``https://ledger.example.com``, optionally with a path
    prefix); the client adds ``/api/v1/``. ``token`` is the agent's bearer token. ``timeout``
    (seconds) bounds connecting and each read. ``max_body_bytes`` (default 1 MiB, the server's
    default ``LEDGERWEB_MAX_BODY_BYTES``) refuses a larger request body before sending it, with
    ``InvalidRequest`` (status 413, code ``too_large``): not retryable, unlike
    ``LedgerUnavailable``.

    Thread safety: a client may be shared between threads; a lock serialises the calls on its
    single connection. For calls in parallel, give each thread its own client.

    Every method raises a ``LedgerError`` subclass when the ledger refuses the call or cannot be
    reached; an answer that is not the contract's JSON is a ``LedgerError`` with code
    ``malformed_response``, never a ``JSONDecodeError``.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not parts.hostname:
            raise ValueError(f"base_url has no host: {base_url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"base_url must not have a query or fragment: {base_url!r}")
        if not token:
            raise ValueError("token must not be empty")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/api/v1"):
            prefix = prefix[: -len("/api/v1")]
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = prefix + "/api/v1"
        self._timeout = timeout
        self._max_body_bytes = max_body_bytes
        self._ssl_context = ssl_context
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "User-Agent": f"ledgerweb-client/{__version__}",
        }
        self._lock = threading.RLock()
        self._conn: http.client.HTTPConnection | None = None
        # True once the current connection completed an exchange, i.e. it may have gone idle.
        self._conn_reused = False

    def __repr__(self) -> str:
        port = f":{self._port}" if self._port else ""
        return f"<LedgerClient {self._scheme}://{self._host}{port}{self._prefix}>"

    # -- connection management ---------------------------------------------------------------

    def close(self) -> None:
        """Close the connection. The client stays usable: the next call reconnects."""
        with self._lock:
            self._discard_connection()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _discard_connection(self) -> None:
        conn, self._conn, self._conn_reused = self._conn, None, False
        if conn is not None:
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    self._host,
                    self._port,
                    timeout=self._timeout,
                    context=self._ssl_context or ssl.create_default_context(),
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout
                )
            self._conn_reused = False
        return self._conn

    def _exchange(
        self, method: str, target: str, payload: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        """Send one request and read the whole answer (so the connection can be reused)."""
        with self._lock:
            for first_try in (True, False):
                conn = self._connection()
                reused = self._conn_reused
                try:
                    try:
                        conn.request(method, target, body=payload, headers=headers)
                    except _DROPPED_CONNECTION_ERRORS:
                        # A server may answer (413) and close before reading a whole body:
                        # its answer, when it arrived, says more than the broken pipe.
                        early = self._early_answer(conn) if payload else None
                        if early is None:
                            raise
                        self._discard_connection()
                        return early
                    response = conn.getresponse()
                    data = response.read()
                except _DROPPED_CONNECTION_ERRORS as exc:
                    self._discard_connection()
                    # Reconnect and send again once, only when a reused idle connection was
                    # dropped. Sending the same request twice to the LEDGER is safe, POSTs
                    # included, because every ledger call is idempotent by key or by state: the
                    # same intent returns the existing attempt; the same confirm, fail, unknown or
                    # provider-request is answered as success and writes nothing new; and a
                    # repeated dispatch can never make a second claim (if the first one was
                    # committed, the repeat gets 409 not_dispatchable, the caller does not send,
                    # and the attempt stays DISPATCHED for reconciliation). This reasoning is
                    # about the ledger only: never resend a *provider* request this way.
                    if first_try and reused:
                        continue
                    raise LedgerUnavailable(
                        f"the ledger closed the connection during {method} {target}: {exc!r}"
                    ) from exc
                except TimeoutError as exc:
                    # Not retried: a slow ledger is not an idle drop, and waiting twice as long
                    # helps nobody. The caller sees LedgerUnavailable and decides.
                    self._discard_connection()
                    raise LedgerUnavailable(
                        f"the ledger did not answer {method} {target} within {self._timeout}s"
                    ) from exc
                except (OSError, http.client.HTTPException) as exc:
                    self._discard_connection()
                    raise LedgerUnavailable(
                        f"cannot talk to the ledger at {self._host} ({method} {target}): {exc!r}"
                    ) from exc
                if response.will_close:
                    self._discard_connection()
                else:
                    self._conn_reused = True
                return response.status, response.reason, data
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _early_answer(conn: http.client.HTTPConnection) -> tuple[int, str, bytes] | None:
        """The answer a server sent before the request body was all written, if any."""
        try:
            response = conn.getresponse()
            return response.status, response.reason, response.read()
        except (OSError, http.client.HTTPException):
            return None

    # -- request / answer --------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """Make one API call; return (status, decoded JSON) for a 2xx, raise otherwise."""
        target = self._prefix + path
        if query:
            target += "?" + urlencode(query)
        headers = {**self._headers, **(extra_headers or {})}
        payload = None
        if body is not None:
            try:
                payload = json.dumps(
                    body, ensure_ascii=False, allow_nan=False, separators=(",", ":")
                ).encode("utf-8")
            except (TypeError, ValueError) as exc:
                raise InvalidRequest(
                    f"the request body cannot be encoded as JSON: {exc}",
                    code="unserializable",
                ) from exc
            headers["Content-Type"] = "application/json"
            if len(payload) > self._max_body_bytes:
                raise InvalidRequest(
                    f"the request body is {len(payload)} bytes; the ledger accepts at most "
                    f"{self._max_body_bytes} (max_body_bytes): not sent",
                    status=413,
                    code="too_large",
                )
        status, reason, data = self._exchange(method, target, payload, headers)
        if 200 <= status < 300:
            try:
                return status, json.loads(data)
            except (ValueError, UnicodeDecodeError) as exc:
                raise LedgerError(
                    f"the ledger answered {method} {target} with {status} but not with JSON",
                    status=status,
                    code="malformed_response",
                ) from exc
        code, message = self._error_fields(data)
        error_class = _error_class(status, code)
        raise error_class(
            message or f"the ledger answered {method} {target} with {status} {reason}".rstrip(),
            status=status,
            code=code,
        )

    @staticmethod
    def _error_fields(data: bytes) -> tuple[str | None, str | None]:
        """The (code, message) of a contract error body; (None, None) for anything else."""
        try:
            decoded = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None, None
        error = decoded.get("error") if isinstance(decoded, dict) else None
        if isinstance(error, dict):
            code, message = error.get("code"), error.get("message")
            return (
                code if isinstance(code, str) else None,
                message if isinstance(message, str) else None,
            )
        if isinstance(error, str):
            return None, error
        return None, None

    @staticmethod
    def _attempt_from(status: int, body: Any) -> Attempt:
        """The attempt in a success body: under ``"attempt"``, or the body itself."""
        candidate = None
        if isinstance(body, dict):
            inner = body.get("attempt")
            candidate = inner if isinstance(inner, dict) else body
        try:
            if candidate is None:
                raise ValueError("the body is not a JSON object")
            return Attempt.from_dict(candidate)
        except ValueError as exc:
            raise LedgerError(
                f"the ledger's answer does not hold an attempt: {exc}",
                status=status,
                code="malformed_response",
            ) from exc

    @staticmethod
    def _path(attempt_id: str, action: str = "") -> str:
        if not attempt_id:
            raise ValueError("attempt_id must not be empty")
        suffix = f"/{action}" if action else ""
        return f"/attempts/{quote(str(attempt_id), safe='')}{suffix}"

    # -- the API -----------------------------------------------------------------------------

    def record_intent(
        self,
        *,
        tenant: str,
        task_id: str,
        tool_name: str,
        idempotency_key: str,
        args: Mapping[str, Any],
        policy_version: str | None = None,
        credential_scope: Sequence[str] | None = None,
        traceparent: str | None = None,
    ) -> Attempt:
        """Record the intent durably (step 2 of the safe order) and return the attempt.

        ``traceparent`` (W3C Trace Context of the caller's span) links the attempt to its trace;
        the ledger refuses a malformed one (``InvalidRequest``, code ``invalid_traceparent``).

        The same key with the same arguments returns the existing attempt, whatever its state:
        look at ``state`` before sending. ``idempotency_key`` names the logical side effect and
        must be stable across restarts, never a random per-try value.

        Raises ``IdempotencyConflict`` (key already used with other arguments, tenant or tool),
        ``InvalidRequest`` (422 invalid field or unknown tool, 413 too large), ``Refused``
        (tenant or scope not granted to this token).
        """
        body: dict[str, Any] = {
            "tenant": tenant,
            "task_id": task_id,
            "tool_name": tool_name,
            "idempotency_key": idempotency_key,
            # Anything but a mapping is sent as is, for the ledger to refuse with a 422.
            "args": dict(args) if isinstance(args, Mapping) else args,
        }
        if policy_version is not None:
            body["policy_version"] = policy_version
        if credential_scope is not None:
            if isinstance(credential_scope, str):
                raise TypeError("credential_scope is a list of scope strings, not one string")
            body["credential_scope"] = list(credential_scope)
        headers = {"traceparent": traceparent} if traceparent else None
        status, answer = self._request("POST", "/attempts", body, extra_headers=headers)
        return self._attempt_from(status, answer)

    # -- receipts and the transparency log (ledgerweb_client.receipts) ------------------------

    def receipt(self, attempt_id: str) -> dict[str, Any]:
        """The attempt's receipt: the signed checkpoint, the leaf and its inclusion proof. Keep
        it; check it any time with ``verify_receipt``. Raises ``StateConflict`` (409,
        ``not_sealed``) until the sealer has put the attempt's current state in a signed
        checkpoint (a few seconds), ``NotFound`` for an attempt outside the token's tenants."""
        _, answer = self._request("GET", self._path(attempt_id, "receipt"))
        receipt = answer.get("receipt") if isinstance(answer, dict) else None
        if not isinstance(receipt, dict):
            raise LedgerError("the ledger's answer holds no receipt", code="malformed_response")
        return receipt

    @staticmethod
    def verify_receipt(
        receipt: Mapping[str, Any],
        verifier_key: Any,
        *,
        witness_keys: Sequence[str] = (),
        quorum: int = 0,
        sent: Mapping[str, Any] | None = None,
    ) -> receipts.Checkpoint:
        """Check a receipt with no help from the server: signed by the log's ``verifier_key``
        (the ``NAME+KEYID+BASE64`` text ``manage.py ledger_log key`` prints, or a list of them
        after a key rotation), cosigned by ``quorum`` of ``witness_keys``, the attempt's state
        in the signed tree, and the events the receipt carries hash to that state. With
        ``sent`` (what this agent sent: ``tenant``, ``task_id``, ``tool_name``,
        ``idempotency_key``, ``args``, any of them), the history must record exactly that.
        Returns the checkpoint; raises ``receipts.ReceiptError``. Needs ``pip install
        'ledgerweb-client[verify]'``."""
        return receipts.verify_receipt(
            receipt, verifier_key, witness_keys=witness_keys, quorum=quorum, sent=sent
        )

    def _log_text(self, path: str) -> str:
        target = self._prefix[: -len("/api/v1")] + "/log/" + path
        status, reason, data = self._exchange("GET", target, None, dict(self._headers))
        if status != 200:
            raise LedgerError(
                f"the ledger answered GET {target} with {status} {reason}", status=status
            )
        return data.decode("utf-8")

    def check_log(
        self,
        view: receipts.LogView,
        verifier_key: Any,
        *,
        witness_keys: Sequence[str] = (),
        quorum: int = 0,
    ) -> receipts.Checkpoint:
        """Fetch the log's newest checkpoint (``/log/checkpoint``), verify it, and check it is
        consistent with the one ``view`` holds (``/log/consistency``), then move ``view`` to
        it. Raises ``receipts.ReceiptError`` when the log was rewritten or rolled back."""
        checkpoint = receipts.open_checkpoint(
            self._log_text("checkpoint"),
            [verifier_key] if isinstance(verifier_key, str) else verifier_key,
            witness_keys=witness_keys,
            quorum=quorum,
        )
        proof: list[bytes] = []
        if 0 < view.size < checkpoint.size:
            text = self._log_text(f"consistency/{view.size}/{checkpoint.size}")
            proof = receipts.hashes(line for line in text.splitlines() if line)
        view.advance(checkpoint, proof)
        return checkpoint

    def _claim(self, attempt_id: str) -> tuple[bool, Attempt | None]:
        """Try to claim the send; (claimed, attempt as returned or None)."""
        try:
            status, answer = self._request("POST", self._path(attempt_id, "dispatch"), {})
        except StateConflict:
            # 409 not_dispatchable, or any other 409 from this endpoint: the claim is not ours.
            return False, None
        if not isinstance(answer, dict) or not isinstance(answer.get("dispatch"), bool):
            raise LedgerError(
                "the ledger's dispatch answer has no boolean 'dispatch'",
                status=status,
                code="malformed_response",
            )
        attempt = None
        if isinstance(answer.get("attempt"), dict) or "attempt_id" in answer:
            attempt = self._attempt_from(status, answer)
        return answer["dispatch"], attempt

    def dispatch(self, attempt_id: str) -> bool:
        """Claim the send (INTENT_RECORDED or FAILED_RETRYABLE -> DISPATCHED), committed before
        anything is sent.

        Returns True only when this call claimed it: then, and only then, send. Returns False
        when the ledger answers 409 ``not_dispatchable`` (someone else claimed it, it already has
        an outcome, or it is UNKNOWN, which only reconciliation resends): do not send.
        """
        return self._claim(attempt_id)[0]

    def attach_provider_request(self, attempt_id: str, provider_request_id: str) -> Attempt:
        """Record the provider's request id the moment it is known. Repeating the same id is
        harmless; a different id than the one recorded raises ``StateConflict``."""
        status, answer = self._request(
            "POST",
            self._path(attempt_id, "provider-request"),
            {"provider_request_id": provider_request_id},
        )
        return self._attempt_from(status, answer)

    def confirm(
        self, attempt_id: str, result_ref: str, provider_request_id: str | None = None
    ) -> Attempt:
        """Confirm the outcome with a durable receipt or lookup answer, not a bare HTTP 200.

        Repeating the same confirmation is answered as success. ``StateConflict`` when the
        attempt is in a state that cannot be confirmed.
        """
        body: dict[str, Any] = {"result_ref": result_ref}
        if provider_request_id is not None:
            body["provider_request_id"] = provider_request_id
        status, answer = self._request("POST", self._path(attempt_id, "confirm"), body)
        return self._attempt_from(status, answer)

    def fail(self, attempt_id: str, reason: str, retryable: bool) -> Attempt:
        """Record that the provider definitively refused without effect: FAILED_RETRYABLE when
        ``retryable`` (it may be sent again with the same key), FAILED otherwise."""
        status, answer = self._request(
            "POST", self._path(attempt_id, "fail"), {"reason": reason, "retryable": retryable}
        )
        return self._attempt_from(status, answer)

    def mark_unknown(self, attempt_id: str, reason: str) -> Attempt:
        """Record that the outcome is unknown (timeout, lost response): the attempt becomes
        UNKNOWN and reconciliation looks it up. Never treat a timeout as success or failure."""
        status, answer = self._request(
            "POST", self._path(attempt_id, "unknown"), {"reason": reason}
        )
        return self._attempt_from(status, answer)

    def get(self, attempt_id: str) -> Attempt:
        """The attempt as it stands now. ``NotFound`` also for another tenant's attempt."""
        status, answer = self._request("GET", self._path(attempt_id))
        return self._attempt_from(status, answer)

    def dashboard_url(self, attempt_id: str) -> str:
        """The attempt's page on the ledger's dashboard (for a person: approve, reject, edit)."""
        port = f":{self._port}" if self._port else ""
        base = self._prefix[: -len("/api/v1")]
        return (
            f"{self._scheme}://{self._host}{port}{base}/attempts/{quote(str(attempt_id), safe='')}/"
        )

    def follow_links(self, attempt: Attempt) -> Attempt:
        """Where the attempt's work goes on: while it is RECONCILED with a ``linked_attempt_id``
        (edit-and-approve made a linked attempt with corrected arguments, or a reviewer
        approved a linked retry), the linked attempt; else ``attempt`` itself. The linked
        attempt has its own key and arguments: send with *its* ``args`` and
        ``idempotency_key``. ``LedgerError`` (``malformed_link``) if a link leaves the tenant or
        the tool, or the chain is longer than any the ledger makes."""
        for _ in range(_MAX_LINKS):
            if attempt.state != State.RECONCILED or not attempt.linked_attempt_id:
                return attempt
            linked = self.get(attempt.linked_attempt_id)
            if (linked.tenant, linked.tool_name) != (attempt.tenant, attempt.tool_name):
                raise LedgerError(
                    f"attempt {attempt.attempt_id} links to {linked.attempt_id}, of another "
                    "tenant or tool: not followed",
                    code="malformed_link",
                )
            attempt = linked
        raise LedgerError(
            f"more than {_MAX_LINKS} linked attempts from {attempt.attempt_id}: not followed",
            code="malformed_link",
        )

    def wait_for_approval(self, attempt_id: str, timeout: float) -> Attempt:
        """Wait, holding nothing, while an approval policy holds the attempt (AWAITING_APPROVAL):
        long-polls ``GET /attempts/{id}?wait=N`` until the attempt leaves that state or
        ``timeout`` seconds pass, and returns the attempt as it stands then. INTENT_RECORDED:
        approved, claim and send as usual; FAILED: rejected or expired, never send; still
        AWAITING_APPROVAL: wait again later (by key, after a restart too).

        An approver who corrected the arguments (edit-and-approve) leaves the original
        RECONCILED with a linked attempt: the wait follows the link (``follow_links``), waits
        on the linked attempt while it is held too (a second approver), and returns it; its
        ``attempt_id``, ``idempotency_key`` and ``args`` are then the linked attempt's."""
        if timeout < 0:
            raise ValueError("timeout must not be negative")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            # Each poll stays within the server's bound and this client's own socket timeout.
            wait = int(max(0, min(left, _POLL_MAX, self._timeout - 1)))
            status, answer = self._request(
                "GET", self._path(attempt_id), query={"wait": str(wait)} if wait else None
            )
            attempt = self.follow_links(self._attempt_from(status, answer))
            attempt_id = attempt.attempt_id
            if attempt.state != State.AWAITING_APPROVAL or deadline - time.monotonic() <= 0:
                return attempt
            if wait == 0:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def record_and_wait(self, *, wait_for_approval: float = 0, **intent: Any) -> Attempt:
        """Record the intent (``record_intent``'s keywords), follow an edit-and-approve link
        (``follow_links``), and while an approval policy holds it wait up to
        ``wait_for_approval`` seconds (``wait_for_approval`` above): the attempt to claim, or
        to report as held, rejected or settled. Claims nothing."""
        attempt = self.follow_links(self.record_intent(**intent))
        if attempt.state == State.AWAITING_APPROVAL and wait_for_approval > 0:
            attempt = self.wait_for_approval(attempt.attempt_id, wait_for_approval)
        return attempt

    def find(self, idempotency_key: str) -> list[Attempt]:
        """The attempts recorded under ``idempotency_key`` that this token may see."""
        status, answer = self._request(
            "GET", "/attempts", query={"idempotency_key": idempotency_key}
        )
        if isinstance(answer, dict):
            items = answer.get("results", answer.get("attempts"))
        else:
            items = answer
        if not isinstance(items, list):
            raise LedgerError(
                "the ledger's list answer has no 'results' list",
                status=status,
                code="malformed_response",
            )
        return [self._attempt_from(status, item) for item in items]

    # -- the safe order ----------------------------------------------------------------------

    def attempt(
        self,
        *,
        tenant: str,
        task_id: str,
        tool_name: str,
        idempotency_key: str,
        args: Mapping[str, Any],
        policy_version: str | None = None,
        credential_scope: Sequence[str] | None = None,
        start: Attempt | None = None,
    ) -> AttemptCall:
        """The safe order around a block: ``with client.attempt(...) as call:``.

        Entering records the intent and claims the dispatch; send only if ``call.should_send``.
        See ``AttemptCall`` for what leaving the block records. ``start``: an attempt already
        recorded for this intent (as ``wait_for_approval`` or ``follow_links`` returned it, a
        linked attempt included), claimed instead of recording the intent again.
        """
        return AttemptCall(
            self,
            {
                "tenant": tenant,
                "task_id": task_id,
                "tool_name": tool_name,
                "idempotency_key": idempotency_key,
                "args": args,
                "policy_version": policy_version,
                "credential_scope": credential_scope,
            },
            start,
        )

    def call(
        self,
        *,
        tenant: str,
        task_id: str,
        tool_name: str,
        idempotency_key: str,
        args: Mapping[str, Any],
        send: Callable[[Attempt], SendResult],
        policy_version: str | None = None,
        credential_scope: Sequence[str] | None = None,
        wait_for_approval: float = 0,
    ) -> CallResult:
        """Perform one side effect in the safe order (protocol section 4).

        1. Record the intent (same key and args: the existing attempt comes back).
        2. If the attempt already has an outcome, return it: ``sent`` is False, nothing is sent.
        3. Claim the dispatch. If the claim is refused (someone else holds it, or it is UNKNOWN
           and waits for reconciliation), return with ``sent`` False: nothing is sent.
        4. Call ``send(attempt)``; send with ``attempt.idempotency_key``. It returns a
           ``SendResult``: its ``provider_request_id`` is recorded at once, its ``result_ref``
           (a durable receipt) confirms the attempt. Without a receipt the attempt stays
           DISPATCHED and reconciliation confirms it by lookup.
        5. If ``send`` raises ``ProviderTimeout`` or ``ProviderLostResponse`` the attempt is
           marked UNKNOWN; ``ProviderRefused`` records FAILED_RETRYABLE or FAILED. These are
           returned in ``provider_error``, not raised. Any other exception marks the attempt
           UNKNOWN (the send may have happened) and is re-raised.

        ``wait_for_approval`` (seconds): when an approval policy holds the call
        (AWAITING_APPROVAL), wait up to that long for people to decide (``wait_for_approval``
        above), then go on: approved, it is claimed and sent; rejected or expired (FAILED), or
        still held, nothing is sent and ``sent`` is False. Calling again with the same key
        resumes, after a restart too. With it, an attempt RECONCILED by edit-and-approve is
        followed to its linked attempt (``follow_links``): ``send`` then gets the linked attempt
        and must send *its* ``args`` under *its* ``idempotency_key``; ``result.attempt`` is it.

        Ledger errors (``IdempotencyConflict``, ``Refused``, ``LedgerUnavailable``...) raise.
        """
        if wait_for_approval < 0:
            raise ValueError("wait_for_approval must not be negative")
        intent: dict[str, Any] = {
            "tenant": tenant,
            "task_id": task_id,
            "tool_name": tool_name,
            "idempotency_key": idempotency_key,
            "args": args,
            "policy_version": policy_version,
            "credential_scope": credential_scope,
        }
        start: Attempt | None = None
        if wait_for_approval:
            start = self.record_and_wait(**intent, wait_for_approval=wait_for_approval)
        send_result: SendResult | None = None
        with self.attempt(**intent, start=start) as call:
            if call.should_send:
                send_result = send(call.attempt)
                if not isinstance(send_result, SendResult):
                    raise TypeError(
                        f"send must return a SendResult, not {type(send_result).__name__}"
                    )
                if send_result.provider_request_id is not None:
                    call.provider_request(send_result.provider_request_id)
                if send_result.result_ref is not None:
                    call.confirm(send_result.result_ref, send_result.provider_request_id)
        return CallResult(
            attempt=call.attempt,
            sent=call.should_send,
            send_result=send_result,
            provider_error=call.provider_error,
        )
