"""The agent-facing HTTP API (protocol section 9): JSON over HTTP under ``/api/v1/``.

Agents authenticate with ``Authorization: Bearer <token>`` (an ``AgentToken``, allowed a set of
tenants). Every view is thin: parse and check the request, call one function of
``attempts.ledger`` with the token's tenants as the scope, render the attempt. Every refusal is
``{"error": {"code", "message"}}`` with a 4xx status and a stable code; bad input never reaches
the database, so a refused request stores nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.html import escape
from django.views.decorators.csrf import csrf_exempt

from attempts import dbadapter, ledger, locking, queues
from attempts import log as tlog
from attempts.locking import LedgerBusy
from attempts.models import AgentIdentity, AgentToken, Attempt, State
from attempts.rows import live_token_rows
from attempts.states import Actor, TransitionError
from ledgerweb import request_context
from ledgerweb.paths import shipped

log = logging.getLogger("ledgerweb.api")

API_PREFIX = "/api/"
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 200
# The longest ``?wait=N`` a request may ask for; the wait itself is at most
# LEDGERWEB_APPROVAL_WAIT_MAX (below gunicorn's 30 s worker timeout).
WAIT_LIMIT = 25
ATTEMPT_CURSOR = re.compile(r"[A-Za-z0-9_-]{0,32}")

INTENT_FIELDS = {
    "tenant",
    "task_id",
    "tool_name",
    "idempotency_key",
    "args",
    "policy_version",
    "credential_scope",
}


class ApiError(Exception):
    """A refusal raised inside a view and rendered as the JSON error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JsonResponse:
    response = JsonResponse(
        {"error": {"code": code, "message": message}, **(extra or {})}, status=status
    )
    for name, value in (headers or {}).items():
        response[name] = value
    response["Cache-Control"] = "no-store"
    return response


# ---------------------------------------------------------------------------------------------
# Rendering


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def linked_attempt_id(attempt: Attempt) -> str | None:
    """The newest attempt whose parent is ``attempt``, for a RECONCILED attempt (its work goes
    on there: a linked retry, or edit-and-approve); None otherwise. Only a settled-by-linking
    attempt is looked up (the partial index on parent), so other attempts cost no query; a list
    fills ``_linked_attempt_id`` for its page in one query (``_fill_linked``)."""
    if attempt.state != State.RECONCILED:
        return None
    if hasattr(attempt, "_linked_attempt_id"):
        return attempt._linked_attempt_id
    return (
        Attempt.objects.filter(parent_id=attempt.pk)
        .order_by("-id")
        .values_list("attempt_id", flat=True)
        .first()
    )


def _fill_linked(attempts: list[Attempt]) -> None:
    reconciled = {a.pk: a for a in attempts if a.state == State.RECONCILED}
    newest: dict[int, str] = {}
    rows = Attempt.objects.filter(parent_id__in=list(reconciled)).order_by("id")
    for parent_id, child_id in rows.values_list("parent_id", "attempt_id"):
        newest[parent_id] = child_id
    for pk, attempt in reconciled.items():
        attempt._linked_attempt_id = newest.get(pk)


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    """The attempt as the API shows it (section 9's fields, plus args and version)."""
    return {
        "attempt_id": attempt.attempt_id,
        "tenant": attempt.tenant_id,
        "task_id": attempt.task_id,
        "tool_name": attempt.tool_name,
        "idempotency_key": attempt.idempotency_key,
        "args": attempt.args,
        "args_hash": attempt.args_hash,
        "state": attempt.state,
        "version": attempt.version,
        "provider_request_id": attempt.provider_request_id or None,
        "result_ref": attempt.result_ref or None,
        "policy_version": attempt.policy_version,
        "credential_scope": list(attempt.credential_scope),
        "parent_attempt_id": attempt.parent.attempt_id if attempt.parent_id else None,
        "linked_attempt_id": linked_attempt_id(attempt),
        "owner": attempt.owner.get_username() if attempt.owner_id else None,
        "review_reason": attempt.review_reason or None,
        "approval_policy": attempt.approval_policy_id,
        "send_count": attempt.send_count,
        "traceparent": attempt.traceparent or None,
        "trace_id": attempt.trace_id or None,
        **_times(attempt),
    }


def _times(attempt: Attempt) -> dict[str, str | None]:
    created = _iso(attempt.created_at)
    # A new attempt was created and updated at the one moment (one object): written once.
    same = attempt.updated_at is attempt.created_at
    return {"created_at": created, "updated_at": created if same else _iso(attempt.updated_at)}


def archived_attempt_json(attempt: Attempt) -> dict[str, Any]:
    """The stand-in of an archived attempt (``ledger.record_intent``'s answer to its key) in
    ``attempt_json``'s shape: what the ledger kept of it (ids, tenant, tool, key, args hash,
    state, provider request id, result reference, when it was recorded and archived); what
    only its archive file holds is null."""
    known = {
        "attempt_id": attempt.attempt_id,
        "tenant": attempt.tenant_id,
        "tool_name": attempt.tool_name,
        "idempotency_key": attempt.idempotency_key,
        "args_hash": attempt.args_hash,
        "state": attempt.state,
        "provider_request_id": attempt.provider_request_id or None,
        "result_ref": attempt.result_ref or None,
        "created_at": _iso(attempt.created_at),
        "updated_at": _iso(attempt.updated_at),
    }
    return {**dict.fromkeys(ARCHIVED_UNKNOWN), **known}


# attempt_json's fields that only an archive file holds for an archived attempt.
ARCHIVED_UNKNOWN = (
    "task_id",
    "args",
    "version",
    "policy_version",
    "credential_scope",
    "parent_attempt_id",
    "linked_attempt_id",
    "owner",
    "review_reason",
    "approval_policy",
    "send_count",
    "traceparent",
    "trace_id",
)


# JsonResponse's encoding (DjangoJSONEncoder with json.dumps's defaults), by an encoder built
# once. An attempt's JSON is read from the database or parsed from canonical bytes, never a cycle.
_encode_response = dbadapter.built_json_encoder(DjangoJSONEncoder().default)


def json_response(data: dict[str, Any], status: int = 200) -> HttpResponse:
    """``JsonResponse(data, status=status)``'s bytes and headers, encoded by the encoder built
    once (every answer with an attempt comes through here)."""
    if _encode_response is None:  # pragma: no cover - CPython always has the C encoder
        return JsonResponse(data, status=status)
    # As bytes (ASCII: the encoder escapes the rest), so the response never looks up the
    # charset to encode a text body: its Content-Type names none, so that is a settings read
    # and a search of the header for each answer.
    body = _encode_response(data).encode("ascii")
    return HttpResponse(body, content_type="application/json", status=status)


def _attempt_response(attempt: Attempt, status: int = 200, **extra: Any) -> HttpResponse:
    response = json_response({"attempt": attempt_json(attempt), **extra}, status=status)
    response["Cache-Control"] = "no-store"
    return response


# ---------------------------------------------------------------------------------------------
# Request handling


def authenticate(raw: str) -> AgentIdentity | None:
    """The live (not revoked) agent token whose secret is ``raw``, with its tenants: one query
    (``rows.live_token_rows``) for the token, its tenants and whether its use was recorded
    lately, since every API call starts here."""
    if not raw or len(raw) > 200:
        return None
    token_hash = AgentToken.hash_token(raw)
    cutoff = timezone.now() - dt.timedelta(seconds=AgentToken.LAST_USED_RESOLUTION)
    found = live_token_rows(token_hash, used_after=cutoff)
    if not found:
        return None
    token_id, name, _, recent, issuer = found[0]
    if not recent:
        AgentToken(id=token_id, name=name, token_hash=token_hash).touch()
    # A live token without tenants authenticates, and is refused by every tenant check.
    return AgentIdentity(
        id=token_id,
        name=name,
        tenant_slugs=frozenset(row[2] for row in found if row[2] is not None),
        issuer=issuer or "",
    )


def _bearer_token(request: HttpRequest) -> AgentIdentity:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise ApiError(
            401,
            "unauthorized",
            "send the agent token as 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": 'Bearer realm="ledgerweb"'},
        )
    token = authenticate(raw.strip())
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            "the token is unknown or revoked",
            headers={"WWW-Authenticate": 'Bearer realm="ledgerweb", error="invalid_token"'},
        )
    return token


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)  # a key given twice leaves fewer entries than pairs
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# A request body's decoder, built once: json.loads with hooks builds a new decoder and scanner
# for every call. Its scanner keeps no state between calls, so threads may share it, as they
# share json.loads' own default decoder.
_body_decoder = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys, parse_constant=_refuse_constant
)


def _decode_body(text: str) -> Any:
    """``json.loads(text, object_pairs_hook=..., parse_constant=...)``, by the decoder built once."""
    if text.startswith("\ufeff"):  # as json.loads refuses it, in its words
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _body_decoder.decode(text)


def _json_body(request: HttpRequest, allowed: set[str]) -> dict[str, Any]:
    """The request body as a JSON object with only ``allowed`` keys, or an ApiError."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "malformed_request", "Content-Length is not a number") from None
    if limit is not None and declared > limit:
        raise ApiError(413, "too_large", f"the body is {declared} bytes; the limit is {limit}")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "too_large", f"the body is larger than {limit} bytes") from None
    if limit is not None and len(raw) > limit:
        raise ApiError(413, "too_large", f"the body is larger than {limit} bytes")
    if not raw.strip():
        raise ApiError(400, "malformed_json", "the body is empty; send a JSON object")
    try:
        body = _decode_body(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(422, "invalid_field", "the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            422,
            "invalid_field",
            f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}",
        )
    return body


def _require(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in body:
        raise ApiError(422, "invalid_field", f"{name} is required")
    value = body[name]
    # bool is an int in Python; a JSON true is never a valid string or number here.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ApiError(422, "invalid_field", f"{name} must be {what}")
    return value


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    if body.get(name) is None:
        return None
    return _require(body, name, kind, what)


def api_view(*methods: str) -> Callable:
    """Wrap an API view: exempt from session login and CSRF (bearer tokens instead), JSON 405
    for other methods, token authentication, and the ledger's refusals as JSON errors."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            if request.method not in methods:
                return error_response(
                    405,
                    "method_not_allowed",
                    f"{request.method} is not allowed here; use {', '.join(methods)}",
                    headers={"Allow": ", ".join(methods)},
                )
            try:
                token = _bearer_token(request)
                return view(request, token, *args, **kwargs)
            except ApiError as exc:
                return error_response(
                    exc.status, exc.code, exc.message, headers=exc.headers, extra=exc.extra
                )
            except ledger.LedgerError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except TransitionError as exc:
                return error_response(409, exc.code, str(exc))
            except LedgerBusy as exc:
                # A lock not granted in time: nothing was written; safe to try again.
                return error_response(503, exc.code, str(exc), headers={"Retry-After": "1"})

        return csrf_exempt(login_not_required(wrapper))

    return decorate


def _scoped_attempt(token: AgentIdentity, attempt_id: str) -> Attempt:
    """The attempt if it belongs to one of the token's tenants; 404 for everything else."""
    return ledger.get_attempt(attempt_id, tenants=set(token.tenant_slugs))


def _actor(token: AgentIdentity) -> Actor:
    return Actor.agent(token.name, issuer=token.issuer)


def _log(event: str, attempt: Attempt, token: AgentIdentity, **fields: Any) -> None:
    """One structured log line per change: key=value text, and the same fields as ``extra``
    (top-level keys with LEDGERWEB_LOG_FORMAT=json). The request's later lines name the
    attempt too (ledgerweb/request_context.py)."""
    request_context.note_attempt(attempt.attempt_id)
    if attempt.repeated_call or not log.isEnabledFor(logging.INFO):
        return  # a repeated call changed nothing: nothing to log
    values = {
        "attempt_id": attempt.attempt_id,
        "tenant": attempt.tenant_id,
        "tool": attempt.tool_name,
        "state": attempt.state,
        "agent": token.name,
        **fields,
    }
    log.info(
        "%s %s",
        event,
        " ".join(f"{k}={v}" for k, v in values.items()),
        extra={"event": event, **values},
    )


# ---------------------------------------------------------------------------------------------
# Views


@api_view("GET", "POST")
def attempts_collection(request: HttpRequest, token: AgentIdentity) -> JsonResponse:
    if request.method == "POST":
        return _record_intent(request, token)
    return _list_attempts(request, token)


def _record_intent(request: HttpRequest, token: AgentIdentity) -> JsonResponse:
    body = _json_body(request, INTENT_FIELDS)
    tenant = _require(body, "tenant", str, "a string")
    task_id = _require(body, "task_id", str, "a string")
    tool_name = _require(body, "tool_name", str, "a string")
    key = _require(body, "idempotency_key", str, "a string")
    args = _require(body, "args", dict, "a JSON object")
    policy_version = _optional(body, "policy_version", str, "a string")
    scope = _optional(body, "credential_scope", list, "a list of strings")
    if tenant.strip() not in token.tenant_slugs:
        raise ApiError(
            403, "tenant_not_granted", f"this token is not allowed tenant {tenant.strip()!r}"
        )
    traceparent = request.META.get("HTTP_TRACEPARENT")
    if traceparent is not None and not traceparent.strip():
        # Sent but empty is malformed like any other value the pattern refuses; no header at
        # all is the only way to say "no trace".
        raise ApiError(
            422,
            "invalid_traceparent",
            "traceparent is empty: send W3C Trace Context "
            "(version-trace_id-parent_id-flags) or leave the header out",
        )
    try:
        attempt, created = ledger.record_intent(
            tenant=tenant,
            task_id=task_id,
            tool_name=tool_name,
            idempotency_key=key,
            args=args,
            actor=_actor(token),
            policy_version=policy_version,
            credential_scope=scope,
            # W3C Trace Context from the agent's tracer: malformed is refused (422), not
            # dropped, so a trace never silently loses its attempt.
            traceparent=traceparent or "",
        )
    except ledger.IdempotencyConflict as exc:
        extra = {}
        if exc.existing.tenant_id in token.tenant_slugs:
            extra["attempt_id"] = exc.existing.attempt_id
        raise ApiError(409, exc.code, exc.message, extra=extra) from None
    except ledger.InvalidIntent as exc:
        if exc.code == "args_too_large":
            raise ApiError(413, "too_large", exc.message) from None
        raise
    if attempt.archived is not None:
        # The key's attempt was archived: its outcome, marked, and nothing to claim or send.
        response = JsonResponse(
            {
                "attempt": archived_attempt_json(attempt),
                "created": False,
                "archived": {
                    "archive": attempt.archived.archive.name,
                    "archived_at": _iso(attempt.archived.archived_at),
                },
            }
        )
        response["Cache-Control"] = "no-store"
        return response
    if created:
        _log("attempt.intent_recorded", attempt, token, key=attempt.idempotency_key)
    # 202: recorded, but held by an approval policy until enough people approve (section 11).
    status = (202 if attempt.state == State.AWAITING_APPROVAL else 201) if created else 200
    response = _attempt_response(attempt, status, created=created)
    response["Location"] = f"{API_PREFIX}v1/attempts/{attempt.attempt_id}"
    return response


def _list_attempts(request: HttpRequest, token: AgentIdentity) -> JsonResponse:
    params = request.GET
    unknown = sorted(
        set(params) - {"idempotency_key", "task_id", "state", "trace_id", "limit", "after"}
    )
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown query parameter(s): {', '.join(unknown)}")
    for name, limit in (("idempotency_key", 255), ("task_id", 200)):
        value = params.get(name, "")
        problem = ledger.text_problem(value)
        if problem or len(value) > limit:
            raise ApiError(
                422, "invalid_field", f"{name} {problem or f'is longer than {limit} characters'}"
            )
    if not ATTEMPT_CURSOR.fullmatch(params.get("after", "")):
        raise ApiError(422, "invalid_field", "after must be an attempt id (a next_after cursor)")
    if params.keys() & {"idempotency_key", "task_id", "trace_id"}:
        # Led by the identifier's index, the tenants checked on its few rows.
        scope = queues.search_scope(list(token.tenant_slugs), tuple(State.values))
        qs = Attempt.objects.filter(scope)
    else:
        qs = Attempt.objects.for_tenants(token.tenant_slugs)
    qs = qs.select_related("parent", "owner")
    if "idempotency_key" in params:
        qs = qs.filter(idempotency_key=params["idempotency_key"])
    if "task_id" in params:
        qs = qs.filter(task_id=params["task_id"])
    if "trace_id" in params:
        if not re.fullmatch(r"[0-9a-f]{32}", params["trace_id"]):
            raise ApiError(422, "invalid_field", "trace_id must be 32 lowercase hex digits")
        # With its index's own condition, which SQLite must see in the query to use it.
        qs = qs.filter(trace_id=params["trace_id"]).exclude(trace_id="")
    if "state" in params:
        if params["state"] not in State.values:
            raise ApiError(422, "invalid_field", f"state must be one of {', '.join(State.values)}")
        qs = qs.filter(state=params["state"])
    raw_limit = params.get("limit", str(LIST_LIMIT_DEFAULT))
    if not re.fullmatch(r"[0-9]{1,4}", raw_limit):
        raise ApiError(422, "invalid_field", "limit must be a whole number")
    limit = int(raw_limit)
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise ApiError(422, "invalid_field", f"limit must be between 1 and {LIST_LIMIT_MAX}")
    if "after" in params:
        # Cursor pagination by public id (ids sort by creation).
        qs = qs.filter(attempt_id__gt=params["after"])
    rows = list(qs.order_by("attempt_id")[: limit + 1])
    page = rows[:limit]
    _fill_linked(page)
    body = {
        "attempts": [attempt_json(a) for a in page],
        "next_after": page[-1].attempt_id if len(rows) > limit else None,
    }
    response = JsonResponse(body)
    response["Cache-Control"] = "no-store"
    return response


@api_view("GET")
def attempt_detail(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    wait = _wait_seconds(request)
    attempt = _scoped_attempt(token, attempt_id)
    if wait and attempt.state == State.AWAITING_APPROVAL:
        attempt = _wait_while_held(attempt, wait)
    return _attempt_response(attempt)


def _wait_seconds(request: HttpRequest) -> float:
    unknown = sorted(set(request.GET) - {"wait"})
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown query parameter(s): {', '.join(unknown)}")
    raw = request.GET.get("wait", "0")
    if not re.fullmatch(r"[0-9]{1,3}", raw) or int(raw) > WAIT_LIMIT:
        raise ApiError(
            422, "invalid_field", f"wait must be a whole number of seconds, 0 to {WAIT_LIMIT}"
        )
    # Never longer than this deployment allows (LEDGERWEB_APPROVAL_WAIT_MAX, at most 25).
    return float(min(int(raw), settings.LEDGER["APPROVAL_WAIT_MAX"]))


def _wait_while_held(attempt: Attempt, wait: float) -> Attempt:
    """Long-poll: read the attempt's state again in short, growing pauses until it leaves
    AWAITING_APPROVAL or ``wait`` seconds pass. Outside any transaction (the API runs in
    autocommit), so nothing is held while waiting but this request's worker thread."""
    deadline = time.monotonic() + wait
    pause = 0.1
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)
        state = Attempt.objects.filter(pk=attempt.pk).values_list("state", flat=True).first()
        if state != State.AWAITING_APPROVAL:
            return Attempt.objects.select_related("parent", "owner").get(pk=attempt.pk)
    return attempt


@api_view("GET")
def attempt_receipt(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    """The attempt's receipt: its sealed state, the signed (and cosigned) checkpoint and the
    inclusion proof, checkable with the log's verifier key alone (attempts/log.py)."""
    attempt = _scoped_attempt(token, attempt_id)
    try:
        body = tlog.receipt(attempt)
    except tlog.NotSealed as exc:
        wait = settings.LEDGER["SEAL_EVERY"]
        raise ApiError(
            409,
            "not_sealed",
            f"{exc}; the sealer runs every {wait}s, so ask again shortly",
            headers={"Retry-After": str(wait)},
        ) from None
    response = JsonResponse({"receipt": body})
    response["Cache-Control"] = "no-store"
    return response


@api_view("POST")
def attempt_dispatch(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    _json_body_optional(request)
    attempt, claimed = ledger.claim_dispatch(
        attempt_id, actor=_actor(token), tenants=set(token.tenant_slugs)
    )
    if not claimed and attempt.state == State.AWAITING_APPROVAL:
        raise ApiError(
            409,
            "awaiting_approval",
            "an approval policy holds this attempt: do not send; wait until it is "
            "INTENT_RECORDED (GET /api/v1/attempts/{id}?wait=N), then dispatch",
            extra={"attempt": attempt_json(attempt)},
        )
    if not claimed:
        raise ApiError(
            409,
            "not_dispatchable",
            f"attempt is {attempt.state}: only INTENT_RECORDED or FAILED_RETRYABLE may be "
            "dispatched; do not send (reconciliation resends UNKNOWN work after a lookup)",
            extra={"attempt": attempt_json(attempt)},
        )
    _log("attempt.dispatch_claimed", attempt, token)
    return _attempt_response(attempt, dispatch=True)


def _json_body_optional(request: HttpRequest) -> None:
    """Action calls without fields accept an empty body or an empty JSON object."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "too_large", "the request body is too large") from None
    if raw.strip():
        _json_body(request, set())


@api_view("POST")
def attempt_provider_request(
    request: HttpRequest, token: AgentIdentity, attempt_id: str
) -> JsonResponse:
    body = _json_body(request, {"provider_request_id"})
    provider_request_id = _require(body, "provider_request_id", str, "a string")
    attempt = ledger.attach_provider_request(
        attempt_id,
        provider_request_id,
        actor=_actor(token),
        tenants=set(token.tenant_slugs),
    )
    _log("attempt.provider_request", attempt, token, provider_request_id=provider_request_id)
    return _attempt_response(attempt)


@api_view("POST")
def attempt_confirm(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    body = _json_body(request, {"result_ref", "provider_request_id"})
    result_ref = _require(body, "result_ref", str, "a string")
    provider_request_id = _optional(body, "provider_request_id", str, "a string")
    attempt = ledger.confirm(
        attempt_id,
        result_ref=result_ref,
        provider_request_id=provider_request_id,
        actor=_actor(token),
        tenants=set(token.tenant_slugs),
    )
    _log("attempt.confirmed", attempt, token, result_ref=result_ref)
    return _attempt_response(attempt)


@api_view("POST")
def attempt_fail(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    body = _json_body(request, {"reason", "retryable"})
    reason = _require(body, "reason", str, "a string")
    retryable = _require(body, "retryable", bool, "true or false")
    attempt = ledger.fail(
        attempt_id,
        reason=reason,
        retryable=retryable,
        actor=_actor(token),
        tenants=set(token.tenant_slugs),
    )
    _log("attempt.failed", attempt, token, retryable=retryable)
    return _attempt_response(attempt)


@api_view("POST")
def attempt_unknown(request: HttpRequest, token: AgentIdentity, attempt_id: str) -> JsonResponse:
    body = _json_body(request, {"reason"})
    reason = _require(body, "reason", str, "a string")
    attempt = ledger.mark_unknown(
        attempt_id,
        reason=reason,
        actor=_actor(token),
        tenants=set(token.tenant_slugs),
    )
    _log("attempt.unknown", attempt, token, reason=reason)
    return _attempt_response(attempt)


# ---------------------------------------------------------------------------------------------
# Django's own errors under /api/ are JSON too


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def not_found(request: HttpRequest, exception: Exception | None = None):
    if wants_json(request):
        return error_response(404, "not_found", f"no API endpoint at {request.path}")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None):
    if wants_json(request):
        if isinstance(exception, RequestDataTooBig):
            return error_response(413, "too_large", "the request body is too large")
        return error_response(400, "bad_request", "the request could not be understood")
    from django.views.defaults import bad_request as default_bad_request

    return default_bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception | None = None):
    if wants_json(request):
        return error_response(403, "forbidden", "this request is not allowed")
    from django.views.defaults import permission_denied as default_permission_denied

    return default_permission_denied(request, exception)


# Seconds an agent (or a person) is asked to wait when the database is away.
DATABASE_RETRY_AFTER = "2"

_UNAVAILABLE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Ledger unavailable</title></head>
<body><main><h1>The ledger is unavailable</h1>
<p>The ledger's database cannot be reached right now. Nothing you did was lost: reload this page
in a few seconds.</p></main></body></html>
"""


def database_unavailable(request: HttpRequest) -> HttpResponse:
    """503 ``ledger_unavailable`` with ``Retry-After``: the database connection was lost or
    refused, or reaches a server that no longer takes writes (a failover). That connection is
    closed, so the next request opens a new one (to the new primary of a multi-host URL)."""
    locking.forget_connections()
    headers = {"Retry-After": DATABASE_RETRY_AFTER, "Cache-Control": "no-store"}
    if wants_json(request):
        return error_response(
            503,
            "ledger_unavailable",
            "the ledger's database is unavailable; the call may not have been recorded: repeat "
            "it with the same idempotency key",
            headers=headers,
        )
    return HttpResponse(_UNAVAILABLE_PAGE, status=503, headers=headers)


def statement_timed_out(request: HttpRequest) -> HttpResponse:
    """503 ``statement_timeout`` with ``Retry-After``: a statement outside the ledger's write
    transactions (a page's or an export's query) ran out of time."""
    message = locking.statement_timeout_message()
    headers = {"Retry-After": DATABASE_RETRY_AFTER, "Cache-Control": "no-store"}
    if wants_json(request):
        return error_response(503, "statement_timeout", message, headers=headers)
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Too slow</title>'
        f"</head>\n<body><main><h1>That took too long</h1>\n<p>{escape(message)}.</p></main>"
        "</body></html>\n"
    )
    return HttpResponse(page, status=503, headers=headers)


def server_error(request: HttpRequest):
    # Django calls this handler inside the except block of the request's failure.
    failure = sys.exc_info()[1]
    if failure is not None and locking.is_statement_timeout(failure):
        return statement_timed_out(request)
    if failure is not None and locking.is_database_away(failure):
        return database_unavailable(request)
    if wants_json(request):
        return error_response(
            500, "server_error", "the server failed to answer; nothing is known about this call"
        )
    from django.views.defaults import server_error as default_server_error

    return default_server_error(request)


OPENAPI_PATH = shipped("docs") / "openapi.json"


@functools.cache
def _openapi_bytes() -> bytes:
    return OPENAPI_PATH.read_bytes()


@csrf_exempt
@login_not_required
def openapi_document(request: HttpRequest) -> HttpResponse:
    """The published OpenAPI 3.1 description of this API (docs/openapi.json). No token needed."""
    if request.method not in ("GET", "HEAD"):
        return error_response(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed here; use GET",
            headers={"Allow": "GET, HEAD"},
        )
    return HttpResponse(_openapi_bytes(), content_type="application/json")
