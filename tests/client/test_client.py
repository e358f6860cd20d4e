"""The agent client (`ledgerweb_client`) against a fake ledger speaking the section 9 contract.

The fake below is a small in-memory HTTP server on 127.0.0.1 (http.server in a thread) that
implements the agent API faithfully enough to exercise the client: status codes, error codes,
compare-and-set claims, repeated moves answered as success. It is not the product: the real
server is tested against this client in the API tests. No Django here, on purpose: the client
must work in agent processes that do not have Django.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from ledgerweb_client import (
    Attempt,
    IdempotencyConflict,
    InvalidRequest,
    LedgerClient,
    LedgerError,
    LedgerUnavailable,
    NotDispatchable,
    NotFound,
    ProviderLostResponse,
    ProviderRefused,
    ProviderTimeout,
    Refused,
    SendResult,
    State,
    StateConflict,
    Unauthorized,
)

TOKEN = "agent-token"
MAX_BODY = 4096

# -- the fake ledger --------------------------------------------------------------------------


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


class FakeLedger:
    """In-memory agent API. Every request is handled under one lock, so claims are atomic."""

    grants: ClassVar[dict[str, dict[str, set[str]]]] = {
        TOKEN: {"tenants": {"acme", "globex"}, "scopes": {"email:send", "crm:write"}}
    }
    tools: ClassVar[set[str]] = {"email.send", "ticket.create"}
    dispatchable: ClassVar[set[str]] = {"INTENT_RECORDED", "FAILED_RETRYABLE"}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.connections = 0
        self.url = ""
        self.wrap_all = (
            False  # answer every attempt under "attempt", even where the contract doesn't
        )
        # One-shot behaviours, consumed by the next request whose path contains the given text.
        self.forced: list[tuple[str, int, bytes, str]] = []
        self.drops: list[tuple[str, str]] = []  # (path part, "before_response" | "after_response")
        self.delays: list[tuple[str, float]] = []

    # test controls

    def force(
        self, status: int, body: Any, *, path: str = "", content_type: str = "application/json"
    ) -> None:
        """Answer the next request whose path contains ``path`` with this instead of running it."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.forced.append((path, status, raw, content_type))

    def drop(self, when: str, *, path: str = "") -> None:
        """Close the connection on the next matching request, before or after answering it."""
        self.drops.append((path, when))

    def delay(self, seconds: float, *, path: str = "") -> None:
        self.delays.append((path, seconds))

    def state_of(self, attempt_id: str) -> str:
        return self.attempts[attempt_id]["state"]

    def moves(self, attempt_id: str) -> list[tuple[str | None, str]]:
        return [(e["from"], e["to"]) for e in self.events if e["attempt_id"] == attempt_id]

    @staticmethod
    def _take(items: list[Any], path: str) -> Any:
        """Pop the first one-shot behaviour whose path part occurs in ``path``."""
        for index, item in enumerate(items):
            if item[0] in path:
                return items.pop(index)
        return None

    # the contract

    def _move(self, attempt: dict[str, Any], to: str, reason: str = "") -> None:
        self.events.append(
            {
                "attempt_id": attempt["attempt_id"],
                "from": attempt["state"],
                "to": to,
                "reason": reason,
            }
        )
        attempt["state"] = to
        attempt["updated_at"] = f"2026-08-11T10:00:{len(self.events):02d}Z"

    def _visible(self, token: str, attempt_id: str) -> dict[str, Any] | None:
        attempt = self.attempts.get(attempt_id)
        if attempt is None or attempt["tenant"] not in self.grants[token]["tenants"]:
            return None
        return attempt

    def _one(self, status: int, attempt: dict[str, Any], **extra: Any) -> tuple[int, Any]:
        return status, {"attempt": dict(attempt), **extra}

    def handle(self, method: str, target: str, auth: str | None, raw: bytes) -> tuple[int, Any]:
        token = (auth or "").removeprefix("Bearer ")
        if not auth or not auth.startswith("Bearer ") or token not in self.grants:
            return _error(401, "unauthenticated", "missing or unknown bearer token")
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts[:3] != ["api", "v1", "attempts"]:
            return _error(404, "not_found", "no such endpoint")
        rest = parts[3:]
        if method == "GET" and not rest:
            key = parse_qs(url.query).get("idempotency_key", [""])[0]
            results = [
                dict(a)
                for a in self.attempts.values()
                if a["idempotency_key"] == key and self._visible(token, a["attempt_id"])
            ]
            return 200, {"results": results}
        if method == "GET" and len(rest) == 1:
            attempt = self._visible(token, rest[0])
            if attempt is None:
                return _error(404, "not_found", "no such attempt")
            return (200, {"attempt": dict(attempt)}) if self.wrap_all else (200, dict(attempt))
        if method != "POST":
            return _error(405, "method_not_allowed", "method not allowed")
        if len(raw) > MAX_BODY:
            return _error(413, "too_large", "request body too large")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "malformed_json", "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "malformed_json", "body is not a JSON object")
        if not rest:
            return self._record(token, body)
        if len(rest) != 2:
            return _error(404, "not_found", "no such endpoint")
        attempt = self._visible(token, rest[0])
        if attempt is None:
            return _error(404, "not_found", "no such attempt")
        action = rest[1]
        state = attempt["state"]
        if action == "dispatch":
            if state not in self.dispatchable:
                return _error(409, "not_dispatchable", f"attempt is {state}")
            self._move(attempt, "DISPATCHED", "claimed by agent")
            return self._one(200, attempt, dispatch=True)
        if action == "provider-request":
            request_id = body.get("provider_request_id")
            if not isinstance(request_id, str) or not request_id:
                return _error(422, "invalid_field", "provider_request_id is required")
            if attempt["provider_request_id"] not in (None, request_id):
                return _error(409, "provider_request_conflict", "another id is recorded")
            attempt["provider_request_id"] = request_id
            return self._one(200, attempt)
        if action == "confirm":
            result_ref = body.get("result_ref")
            request_id = body.get("provider_request_id")
            if not isinstance(result_ref, str) or not result_ref:
                return _error(422, "invalid_field", "result_ref is required")
            if state == "OUTCOME_CONFIRMED" and attempt["result_ref"] == result_ref:
                return self._one(200, attempt)
            if state not in ("DISPATCHED", "UNKNOWN"):
                return _error(409, "invalid_transition", f"cannot confirm from {state}")
            if request_id is not None and attempt["provider_request_id"] not in (None, request_id):
                return _error(409, "provider_request_conflict", "another id is recorded")
            attempt["result_ref"] = result_ref
            attempt["provider_request_id"] = request_id or attempt["provider_request_id"]
            self._move(attempt, "OUTCOME_CONFIRMED", "receipt")
            return self._one(200, attempt)
        if action == "fail":
            reason, retryable = body.get("reason"), body.get("retryable")
            if not isinstance(reason, str) or not isinstance(retryable, bool):
                return _error(422, "invalid_field", "reason and retryable are required")
            target_state = "FAILED_RETRYABLE" if retryable else "FAILED"
            if state == target_state:
                return self._one(200, attempt)
            if state != "DISPATCHED":
                return _error(409, "invalid_transition", f"cannot fail from {state}")
            self._move(attempt, target_state, reason)
            return self._one(200, attempt)
        if action == "unknown":
            reason = body.get("reason")
            if not isinstance(reason, str):
                return _error(422, "invalid_field", "reason is required")
            if state == "UNKNOWN":
                return self._one(200, attempt)
            if state != "DISPATCHED":
                return _error(409, "invalid_transition", f"cannot mark {state} unknown")
            self._move(attempt, "UNKNOWN", reason)
            return self._one(200, attempt)
        return _error(404, "not_found", "no such action")

    def _record(self, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        for name in ("tenant", "task_id", "tool_name", "idempotency_key"):
            if not isinstance(body.get(name), str) or not body[name]:
                return _error(422, "invalid_field", f"{name} is required")
        if not isinstance(body.get("args"), dict):
            return _error(422, "invalid_field", "args must be a JSON object")
        if body["tool_name"] not in self.tools:
            return _error(403, "unknown_tool", f"unknown tool {body['tool_name']}")
        grant = self.grants[token]
        if body["tenant"] not in grant["tenants"]:
            return _error(403, "tenant_not_granted", "tenant not granted to this token")
        scope = body.get("credential_scope")
        if scope is not None and not set(scope) <= grant["scopes"]:
            return _error(403, "scope_not_granted", "scope not granted to this token")
        canonical = json.dumps(body["args"], sort_keys=True, separators=(",", ":"))
        args_hash = hashlib.sha256(canonical.encode()).hexdigest()
        existing_id = self.by_key.get(body["idempotency_key"])
        if existing_id is not None:
            existing = self.attempts[existing_id]
            same = (existing["args_hash"], existing["tenant"], existing["tool_name"]) == (
                args_hash,
                body["tenant"],
                body["tool_name"],
            )
            if not same:
                return _error(409, "idempotency_conflict", "key recorded with other arguments")
            return (200, {"attempt": dict(existing)}) if self.wrap_all else (200, dict(existing))
        attempt_id = f"att_{len(self.attempts) + 1}"
        attempt = {
            "attempt_id": attempt_id,
            "tenant": body["tenant"],
            "task_id": body["task_id"],
            "tool_name": body["tool_name"],
            "idempotency_key": body["idempotency_key"],
            "args_hash": args_hash,
            "state": None,
            "provider_request_id": None,
            "result_ref": None,
            "policy_version": body.get("policy_version"),
            "credential_scope": scope,
            "parent_attempt_id": None,
            "owner": None,
            "created_at": "2026-08-11T10:00:00Z",
            "updated_at": "2026-08-11T10:00:00Z",
            "args": body["args"],
        }
        self.attempts[attempt_id] = attempt
        self.by_key[body["idempotency_key"]] = attempt_id
        self._move(attempt, "INTENT_RECORDED", "intent recorded")
        return (201, {"attempt": dict(attempt)}) if self.wrap_all else (201, dict(attempt))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server behind gunicorn
    timeout = 10
    disable_nagle_algorithm = True  # headers and body leave without waiting for a delayed ACK
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.ledger.lock:
            self.server.ledger.connections += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        ledger = self.server.ledger
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with ledger.lock:
            ledger.requests.append((method, self.path))
            delay = FakeLedger._take(ledger.delays, self.path)
            drop = FakeLedger._take(ledger.drops, self.path)
            forced = FakeLedger._take(ledger.forced, self.path)
            if forced is None:
                status, payload = ledger.handle(
                    method, self.path, self.headers.get("Authorization"), raw
                )
                body, content_type = json.dumps(payload).encode(), "application/json"
            else:
                _, status, body, content_type = forced
        if delay:
            time.sleep(delay[1])
        if drop and drop[1] == "before_response":
            # The request was processed (committed) but the answer never leaves.
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if drop:
            # Close after answering, without announcing it: the client still believes the
            # connection is alive, like an idle keep-alive connection a server timed out.
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ledger: FakeLedger

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out leave broken pipes behind; that is expected here


@pytest.fixture
def ledger() -> Iterator[FakeLedger]:
    fake = FakeLedger()
    server = _Server(("127.0.0.1", 0), _Handler)
    server.ledger = fake
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def client(ledger: FakeLedger) -> Iterator[LedgerClient]:
    with LedgerClient(ledger.url, TOKEN, timeout=5.0) as c:
        yield c


def intent(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tenant": "acme",
        "task_id": "task-1",
        "tool_name": "email.send",
        "idempotency_key": "invoice:acme:2026-08-11:send",
        "args": {"to": "billing@acme.test", "template": "invoice", "amount": 120},
    }
    base.update(overrides)
    return base


class Provider:
    """A stand-in for the outside world: counts sends and checks the claim came first."""

    def __init__(self, ledger: FakeLedger, answer: Any = None) -> None:
        self.ledger = ledger
        self.answer = answer
        self.sent: list[Attempt] = []

    def __call__(self, attempt: Attempt) -> SendResult:
        # Step 3 of the safe order: the claim is committed before any byte leaves.
        assert self.ledger.state_of(attempt.attempt_id) == "DISPATCHED"
        self.sent.append(attempt)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


# -- recording intents and the status-to-exception map ----------------------------------------


def test_record_intent_creates_then_returns_the_same_attempt(client: LedgerClient) -> None:
    first = client.record_intent(**intent(policy_version="7", credential_scope=["email:send"]))
    again = client.record_intent(**intent(policy_version="7", credential_scope=["email:send"]))

    assert first.state == State.INTENT_RECORDED
    assert first.attempt_id == again.attempt_id
    assert first.credential_scope == ("email:send",)
    assert first.policy_version == "7"
    assert first.args == intent()["args"]
    assert len(first.args_hash) == 64
    assert [a.attempt_id for a in client.find(first.idempotency_key)] == [first.attempt_id]
    assert client.find("no-such-key") == []
    assert client.get(first.attempt_id) == first


def test_reusing_a_key_with_other_args_is_a_conflict_and_overwrites_nothing(
    client: LedgerClient,
) -> None:
    original = client.record_intent(**intent())

    with pytest.raises(IdempotencyConflict) as caught:
        client.record_intent(**intent(args={"to": "someone-else@acme.test"}))

    assert (caught.value.status, caught.value.code) == (409, "idempotency_conflict")
    assert client.get(original.attempt_id).args_hash == original.args_hash


@pytest.mark.parametrize(
    ("overrides", "error", "status", "code"),
    [
        ({"tool_name": "rocket.launch"}, Refused, 403, "unknown_tool"),
        ({"task_id": ""}, InvalidRequest, 422, "invalid_field"),
        ({"args": {"blob": "x" * (MAX_BODY + 1)}}, InvalidRequest, 413, "too_large"),
        ({"tenant": "initech"}, Refused, 403, "tenant_not_granted"),
        ({"credential_scope": ["payments:charge"]}, Refused, 403, "scope_not_granted"),
    ],
)
def test_refusals_map_to_exceptions(
    client: LedgerClient,
    overrides: dict[str, Any],
    error: type[LedgerError],
    status: int,
    code: str,
) -> None:
    with pytest.raises(error) as caught:
        client.record_intent(**intent(**overrides))

    assert type(caught.value) is error
    assert (caught.value.status, caught.value.code) == (status, code)
    assert caught.value.message


def test_unknown_token_is_unauthorized(ledger: FakeLedger) -> None:
    with LedgerClient(ledger.url, "stolen") as client, pytest.raises(Unauthorized) as caught:
        client.get("att_1")

    assert isinstance(caught.value, Refused)
    assert caught.value.status == 401


def test_missing_attempt_is_not_found(client: LedgerClient) -> None:
    with pytest.raises(NotFound) as caught:
        client.get("att_404")
    assert caught.value.code == "not_found"


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (400, "malformed_json", InvalidRequest),
        (413, "too_large", InvalidRequest),
        (422, "invalid_field", InvalidRequest),
        (401, "unauthenticated", Unauthorized),
        (403, "tenant_not_granted", Refused),
        (404, "not_found", NotFound),
        (409, "idempotency_conflict", IdempotencyConflict),
        (409, "not_dispatchable", NotDispatchable),
        (409, "invalid_transition", StateConflict),
        (408, "timeout", LedgerUnavailable),
        (429, "throttled", LedgerUnavailable),
        (500, "server_error", LedgerUnavailable),
        (503, "unavailable", LedgerUnavailable),
        (418, "teapot", LedgerError),
    ],
)
def test_every_error_status_maps_to_one_exception(
    client: LedgerClient, ledger: FakeLedger, status: int, code: str, error: type[LedgerError]
) -> None:
    ledger.force(status, {"error": {"code": code, "message": f"said {code}"}})

    with pytest.raises(error) as caught:
        client.get("att_1")

    assert type(caught.value) is error
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        status,
        code,
        f"said {code}",
    )
    assert code in str(caught.value)


def test_arguments_that_are_not_json_are_refused_before_anything_is_sent(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    with pytest.raises(InvalidRequest):
        client.record_intent(**intent(args={"when": object()}))
    with pytest.raises(InvalidRequest):
        client.record_intent(**intent(args={"amount": float("nan")}))

    assert ledger.requests == []


# -- the single moves -------------------------------------------------------------------------


def test_dispatch_is_true_only_for_the_claimant(client: LedgerClient, ledger: FakeLedger) -> None:
    attempt = client.record_intent(**intent())

    assert client.dispatch(attempt.attempt_id) is True
    assert client.dispatch(attempt.attempt_id) is False
    assert ledger.moves(attempt.attempt_id) == [
        (None, "INTENT_RECORDED"),
        ("INTENT_RECORDED", "DISPATCHED"),
    ]


def test_dispatch_refuses_unknown_and_allows_failed_retryable(client: LedgerClient) -> None:
    unknown = client.record_intent(**intent(idempotency_key="k-unknown"))
    client.dispatch(unknown.attempt_id)
    client.mark_unknown(unknown.attempt_id, "timeout")
    retryable = client.record_intent(**intent(idempotency_key="k-retry"))
    client.dispatch(retryable.attempt_id)
    client.fail(retryable.attempt_id, "rate limited", retryable=True)

    assert client.dispatch(unknown.attempt_id) is False  # only reconciliation resends UNKNOWN
    assert client.dispatch(retryable.attempt_id) is True
    with pytest.raises(NotFound):
        client.dispatch("att_404")


def test_provider_request_confirm_fail_and_unknown(client: LedgerClient) -> None:
    attempt = client.record_intent(**intent())
    with pytest.raises(StateConflict):
        client.confirm(attempt.attempt_id, "rcpt-1")  # nothing was dispatched
    client.dispatch(attempt.attempt_id)

    with_id = client.attach_provider_request(attempt.attempt_id, "req-1")
    assert client.attach_provider_request(attempt.attempt_id, "req-1") == with_id
    with pytest.raises(StateConflict) as caught:
        client.attach_provider_request(attempt.attempt_id, "req-2")
    assert caught.value.code == "provider_request_conflict"

    confirmed = client.confirm(attempt.attempt_id, "rcpt-1", provider_request_id="req-1")
    assert (confirmed.state, confirmed.result_ref, confirmed.is_terminal) == (
        State.OUTCOME_CONFIRMED,
        "rcpt-1",
        True,
    )
    assert client.confirm(attempt.attempt_id, "rcpt-1").state == State.OUTCOME_CONFIRMED
    with pytest.raises(StateConflict):
        client.fail(attempt.attempt_id, "too late", retryable=False)

    other = client.record_intent(**intent(idempotency_key="k-2"))
    client.dispatch(other.attempt_id)
    assert client.mark_unknown(other.attempt_id, "timeout").state == State.UNKNOWN
    assert client.mark_unknown(other.attempt_id, "timeout").state == State.UNKNOWN


def test_attempts_are_accepted_at_top_level_or_under_attempt(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    top_level = client.record_intent(**intent())
    ledger.wrap_all = True
    wrapped = client.record_intent(**intent())

    assert wrapped == top_level
    assert client.get(top_level.attempt_id) == top_level


def test_attempt_is_a_frozen_snapshot(client: LedgerClient) -> None:
    attempt = client.record_intent(**intent())

    with pytest.raises(FrozenInstanceError):
        attempt.state = "FAILED"  # type: ignore[misc]
    assert attempt.raw["attempt_id"] == attempt.attempt_id
    assert not attempt.is_terminal and attempt.is_dispatchable


# -- the safe order as one call ---------------------------------------------------------------


def test_call_with_a_receipt_confirms(client: LedgerClient, ledger: FakeLedger) -> None:
    provider = Provider(ledger, SendResult(provider_request_id="req-1", result_ref="rcpt-1"))

    result = client.call(**intent(), send=provider)

    assert result.sent and result.confirmed
    assert (result.attempt.provider_request_id, result.result_ref) == ("req-1", "rcpt-1")
    assert ledger.state_of(result.attempt.attempt_id) == "OUTCOME_CONFIRMED"
    assert ledger.moves(result.attempt.attempt_id) == [
        (None, "INTENT_RECORDED"),
        ("INTENT_RECORDED", "DISPATCHED"),
        ("DISPATCHED", "OUTCOME_CONFIRMED"),
    ]
    assert len(provider.sent) == 1
    assert provider.sent[0].idempotency_key == intent()["idempotency_key"]


def test_call_without_a_receipt_stays_dispatched_with_the_request_id(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    result = client.call(**intent(), send=Provider(ledger, SendResult(provider_request_id="req-1")))

    assert result.sent and not result.confirmed
    assert result.state == State.DISPATCHED
    assert result.attempt.provider_request_id == "req-1"


@pytest.mark.parametrize(
    "report",
    [
        ProviderTimeout("no answer in 30s"),
        ProviderLostResponse("connection reset", provider_request_id="req-9"),
    ],
)
def test_call_with_an_unknown_outcome_is_unknown_never_success_or_failure(
    client: LedgerClient, ledger: FakeLedger, report: Exception
) -> None:
    result = client.call(**intent(), send=Provider(ledger, report))

    assert result.sent and result.state == State.UNKNOWN
    assert result.provider_error is report
    assert result.attempt.provider_request_id == getattr(report, "provider_request_id", None)
    assert str(report) in ledger.events[-1]["reason"]


def test_a_raw_socket_timeout_in_send_is_unknown_and_raised(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    with pytest.raises(TimeoutError):
        client.call(**intent(), send=Provider(ledger, TimeoutError("timed out")))

    (attempt,) = client.find(intent()["idempotency_key"])
    assert attempt.state == State.UNKNOWN
    assert ledger.events[-1]["reason"].startswith("timeout after dispatch")


def test_call_refused_for_good_fails_and_is_not_sent_again(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    provider = Provider(ledger, ProviderRefused("mailbox does not exist", retryable=False))

    first = client.call(**intent(), send=provider)
    second = client.call(**intent(), send=provider)

    assert first.sent and first.state == State.FAILED
    assert ledger.events[-1]["reason"] == "mailbox does not exist"
    assert not second.sent and second.state == State.FAILED
    assert len(provider.sent) == 1


def test_call_refused_retryably_may_be_sent_again_with_the_same_key(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    first = client.call(**intent(), send=Provider(ledger, ProviderRefused("busy", retryable=True)))
    provider = Provider(ledger, SendResult("req-2", "rcpt-2"))
    second = client.call(**intent(), send=provider)

    assert first.state == State.FAILED_RETRYABLE
    assert second.sent and second.confirmed
    assert second.attempt.attempt_id == first.attempt.attempt_id
    assert ledger.moves(first.attempt.attempt_id)[1:] == [
        ("INTENT_RECORDED", "DISPATCHED"),
        ("DISPATCHED", "FAILED_RETRYABLE"),
        ("FAILED_RETRYABLE", "DISPATCHED"),
        ("DISPATCHED", "OUTCOME_CONFIRMED"),
    ]


def test_an_unexpected_exception_after_the_claim_is_unknown_and_reraised(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    with pytest.raises(KeyError, match="smtp_host"):
        client.call(**intent(), send=Provider(ledger, KeyError("smtp_host")))

    (attempt,) = client.find(intent()["idempotency_key"])
    assert attempt.state == State.UNKNOWN
    assert "KeyError" in ledger.events[-1]["reason"]
    assert "smtp_host" in ledger.events[-1]["reason"]


def test_a_send_that_returns_nonsense_is_unknown_and_raised(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    with pytest.raises(TypeError, match="SendResult"):
        client.call(**intent(), send=Provider(ledger, {"id": "req-1"}))

    assert client.find(intent()["idempotency_key"])[0].state == State.UNKNOWN


def test_an_existing_confirmed_attempt_is_returned_not_sent_again(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    provider = Provider(ledger, SendResult("req-1", "rcpt-1"))
    client.call(**intent(), send=provider)
    dispatches = [r for r in ledger.requests if r[1].endswith("/dispatch")]

    again = client.call(**intent(), send=provider)

    assert not again.sent and again.confirmed and again.result_ref == "rcpt-1"
    assert len(provider.sent) == 1
    # A settled attempt is not even offered to the dispatch endpoint.
    assert [r for r in ledger.requests if r[1].endswith("/dispatch")] == dispatches


@pytest.mark.parametrize("state", ["DISPATCHED", "UNKNOWN"])
def test_an_attempt_held_elsewhere_is_not_sent(
    client: LedgerClient, ledger: FakeLedger, state: str
) -> None:
    attempt = client.record_intent(**intent())
    client.dispatch(attempt.attempt_id)  # another worker claimed it...
    if state == "UNKNOWN":
        client.mark_unknown(attempt.attempt_id, "timeout")  # ...and lost the answer
    provider = Provider(ledger, SendResult("req-1", "rcpt-1"))

    result = client.call(**intent(), send=provider)

    assert not result.sent and result.state == state
    assert provider.sent == []


def test_a_conflicting_key_raises_before_any_send(client: LedgerClient, ledger: FakeLedger) -> None:
    client.record_intent(**intent())
    provider = Provider(ledger, SendResult("req-1", "rcpt-1"))

    with pytest.raises(IdempotencyConflict):
        client.call(**intent(args={"to": "other@acme.test"}), send=provider)
    assert provider.sent == []


def test_when_the_ledger_cannot_record_unknown_the_caller_is_told(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    ledger.force(503, {"error": {"code": "unavailable", "message": "db down"}}, path="/unknown")

    with pytest.raises(LedgerUnavailable) as caught:
        client.call(**intent(), send=Provider(ledger, ProviderTimeout("slow")))

    assert isinstance(caught.value.__cause__, ProviderTimeout)
    (attempt,) = client.find(intent()["idempotency_key"])
    assert attempt.state == State.DISPATCHED  # left for reconciliation, never called a success


def test_when_the_ledger_cannot_record_unknown_the_original_error_keeps_a_note(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    ledger.force(503, {"error": {"code": "unavailable", "message": "db down"}}, path="/unknown")

    with pytest.raises(RuntimeError, match="boom") as caught:
        client.call(**intent(), send=Provider(ledger, RuntimeError("boom")))

    assert any("stays DISPATCHED" in note for note in caught.value.__notes__)


def test_only_one_of_many_concurrent_calls_sends(ledger: FakeLedger) -> None:
    provider = Provider(ledger, SendResult("req-1", "rcpt-1"))
    results = []
    shared = LedgerClient(ledger.url, TOKEN)

    def worker(own_client: bool) -> None:
        if own_client:
            with LedgerClient(ledger.url, TOKEN) as client:
                results.append(client.call(**intent(), send=provider))
        else:
            results.append(shared.call(**intent(), send=provider))

    threads = [threading.Thread(target=worker, args=(i % 2 == 0,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.close()

    assert len(provider.sent) == 1
    assert sum(result.sent for result in results) == 1
    assert len(results) == 8


# -- the safe order as a with-block -----------------------------------------------------------


def test_with_block_claims_records_the_request_id_and_confirms(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    with client.attempt(**intent()) as call:
        assert call.should_send
        assert ledger.state_of(call.attempt.attempt_id) == "DISPATCHED"
        call.provider_request("req-1")
        assert ledger.attempts[call.attempt.attempt_id]["provider_request_id"] == "req-1"
        call.confirm("rcpt-1")

    assert call.attempt.state == State.OUTCOME_CONFIRMED
    assert call.outcome_recorded


def test_with_block_left_without_confirm_stays_dispatched(client: LedgerClient) -> None:
    with client.attempt(**intent()) as call:
        assert call.should_send

    assert client.get(call.attempt.attempt_id).state == State.DISPATCHED


def test_with_block_swallows_provider_reports_after_recording_them(
    client: LedgerClient,
) -> None:
    with client.attempt(**intent()) as call:
        raise ProviderLostResponse("reset by peer")

    assert call.attempt.state == State.UNKNOWN
    assert isinstance(call.provider_error, ProviderLostResponse)

    with client.attempt(**intent(idempotency_key="k-2")) as call:
        raise ProviderRefused("invalid address", retryable=False)
    assert call.attempt.state == State.FAILED


def test_with_block_records_the_outcome_even_when_the_reported_id_conflicts(
    client: LedgerClient,
) -> None:
    with pytest.raises(StateConflict) as caught, client.attempt(**intent()) as call:
        call.provider_request("req-1")
        raise ProviderLostResponse("reset", provider_request_id="req-2")

    assert caught.value.code == "provider_request_conflict"
    assert isinstance(caught.value.__cause__, ProviderLostResponse)
    attempt = client.get(call.attempt.attempt_id)
    assert (attempt.state, attempt.provider_request_id) == (State.UNKNOWN, "req-1")


def test_with_block_does_not_touch_a_recorded_outcome(client: LedgerClient) -> None:
    with pytest.raises(ValueError), client.attempt(**intent()) as call:
        call.confirm("rcpt-1")
        raise ValueError("bug in the agent after the confirm")

    assert client.get(call.attempt.attempt_id).state == State.OUTCOME_CONFIRMED


def test_with_block_without_the_claim_forbids_sending(client: LedgerClient) -> None:
    with client.attempt(**intent()) as first:
        assert first.should_send

    with client.attempt(**intent()) as second:
        assert not second.should_send
        assert second.attempt.state == State.DISPATCHED
        with pytest.raises(RuntimeError, match="did not claim"):
            second.provider_request("req-1")
        with pytest.raises(RuntimeError, match="did not claim"):
            second.confirm("rcpt-1")

    # An exception in a block that claimed nothing passes through and records nothing.
    with pytest.raises(ProviderTimeout), client.attempt(**intent()):
        raise ProviderTimeout("should never have sent")
    assert client.get(first.attempt.attempt_id).state == State.DISPATCHED


# -- answers that are not the contract --------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [
        (200, b"<html>Welcome to nginx</html>", "text/html"),
        (200, b"\xff\xfe not utf-8", "application/json"),
        (200, b"", "application/json"),
        (200, b"[1, 2, 3]", "application/json"),
        (200, b'{"attempt": {"tenant": "acme"}}', "application/json"),
        (201, b'{"attempt_id": "att_1"}', "application/json"),
    ],
)
def test_malformed_success_answers_raise_ledger_error(
    client: LedgerClient, ledger: FakeLedger, status: int, body: bytes, content_type: str
) -> None:
    ledger.force(status, body, content_type=content_type)

    with pytest.raises(LedgerError) as caught:
        client.get("att_1")

    assert type(caught.value) is LedgerError
    assert caught.value.code == "malformed_response"
    assert not isinstance(caught.value, ValueError)


def test_malformed_error_answers_still_map_by_status(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    ledger.force(404, b"<h1>Not Found</h1>", content_type="text/html")
    ledger.force(502, b"Bad Gateway", content_type="text/plain")
    ledger.force(409, b'{"error": "busy"}')

    with pytest.raises(NotFound) as not_found:
        client.get("att_1")
    with pytest.raises(LedgerUnavailable) as bad_gateway:
        client.get("att_1")
    with pytest.raises(StateConflict) as conflict:
        client.get("att_1")

    assert not_found.value.code is None and "404" in not_found.value.message
    assert bad_gateway.value.status == 502
    assert conflict.value.message == "busy"


def test_a_dispatch_answer_without_the_flag_is_malformed_not_a_claim(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    attempt = client.record_intent(**intent())
    ledger.force(200, {"attempt": {"attempt_id": attempt.attempt_id, "state": "DISPATCHED"}})

    with pytest.raises(LedgerError) as caught:
        client.dispatch(attempt.attempt_id)
    assert caught.value.code == "malformed_response"


# -- the connection ---------------------------------------------------------------------------


def test_calls_share_one_keep_alive_connection(client: LedgerClient, ledger: FakeLedger) -> None:
    attempt = client.record_intent(**intent())
    client.dispatch(attempt.attempt_id)
    client.confirm(attempt.attempt_id, "rcpt-1")
    client.get(attempt.attempt_id)

    assert ledger.connections == 1


def test_connection_refused_is_ledger_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LedgerClient(f"http://127.0.0.1:{port}", TOKEN, timeout=2)
    with client, pytest.raises(LedgerUnavailable) as caught:
        client.get("att_1")
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert caught.value.status is None


def test_a_slow_ledger_is_unavailable_and_not_retried(ledger: FakeLedger) -> None:
    ledger.delay(1.0)
    client = LedgerClient(ledger.url, TOKEN, timeout=0.2)
    with client, pytest.raises(LedgerUnavailable, match="did not answer"):
        client.record_intent(**intent())

    assert len(ledger.requests) == 1


def test_a_dropped_idle_connection_is_reopened_once(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    attempt = client.record_intent(**intent())
    ledger.drop("after_response")
    client.get(attempt.attempt_id)  # the server closes this connection behind the client's back

    assert client.dispatch(attempt.attempt_id) is True
    assert ledger.connections == 2


def test_a_lost_answer_to_a_committed_confirm_is_safely_resent(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    attempt = client.record_intent(**intent())
    client.dispatch(attempt.attempt_id)
    ledger.drop("before_response", path="/confirm")

    confirmed = client.confirm(attempt.attempt_id, "rcpt-1")

    assert confirmed.state == State.OUTCOME_CONFIRMED
    assert len([r for r in ledger.requests if r[1].endswith("/confirm")]) == 2
    assert ledger.moves(attempt.attempt_id).count(("DISPATCHED", "OUTCOME_CONFIRMED")) == 1


def test_a_lost_answer_to_a_committed_claim_never_yields_a_second_claim(
    client: LedgerClient, ledger: FakeLedger
) -> None:
    attempt = client.record_intent(**intent())
    ledger.drop("before_response", path="/dispatch")

    # The claim was committed but its answer lost; the resend is told not_dispatchable, so the
    # caller does not send and reconciliation settles the DISPATCHED attempt.
    assert client.dispatch(attempt.attempt_id) is False
    assert ledger.state_of(attempt.attempt_id) == "DISPATCHED"


def test_a_fresh_connection_that_drops_is_not_retried(ledger: FakeLedger) -> None:
    ledger.drop("before_response")
    with LedgerClient(ledger.url, TOKEN) as client:
        with pytest.raises(LedgerUnavailable):
            client.record_intent(**intent())
        # The client stays usable after an error: the next call reconnects.
        assert client.record_intent(**intent()).state == State.INTENT_RECORDED

    assert len(ledger.requests) == 2


@pytest.mark.parametrize(
    "base",
    ["{url}", "{url}/", "{url}/api/v1", "{url}/api/v1/"],
    ids=["bare", "slash", "api", "api/"],
)
def test_base_url_may_name_the_api_root(ledger: FakeLedger, base: str) -> None:
    with LedgerClient(base.format(url=ledger.url), TOKEN) as client:
        assert client.record_intent(**intent()).state == State.INTENT_RECORDED
    assert ledger.requests[-1] == ("POST", "/api/v1/attempts")


@pytest.mark.parametrize("url", ["ftp://ledger.test", "ledger.test", "http://ledger.test/?x=1"])
def test_bad_base_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        LedgerClient(url, TOKEN)


def test_the_attempt_carries_every_field_of_the_apis_attempt() -> None:
    """Whatever the API says of an attempt, the Python client's Attempt has a field for (the
    TypeScript one too): review_reason tells a rejected held call from an expired one."""
    import dataclasses
    import json as _json

    from ledgerweb_client import Attempt as ClientAttempt
    from tests.conftest import REPO as _REPO

    schema = _json.loads((_REPO / "docs" / "openapi.json").read_text())["components"]["schemas"]
    api_fields = set(schema["Attempt"]["properties"])
    client_fields = {f.name for f in dataclasses.fields(ClientAttempt)} - {"raw"}
    assert api_fields - client_fields == set()
    made = ClientAttempt.from_dict(
        {
            "attempt_id": "att_1",
            "state": "MANUAL_REVIEW",
            "version": 4,
            "review_reason": "approval_rejected",
            "approval_policy": "large-card-charges",
            "send_count": 0,
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        }
    )
    assert (made.version, made.review_reason, made.approval_policy, made.send_count) == (
        4,
        "approval_rejected",
        "large-card-charges",
        0,
    )
    assert made.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and made.traceparent.startswith(
        "00-"
    )
