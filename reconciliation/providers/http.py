"""The generic HTTP provider (protocol section 10), configured per tool without code.

- send: ``POST <dispatch_url>`` with the normalized args as canonical JSON and the headers
  ``Idempotency-Key``, ``X-Ledger-Attempt-Id`` and ``X-Ledger-Args-Hash``; a 2xx JSON answer
  carries ``{"id": ...}``.
- look up: ``GET <lookup_url>?idempotency_key=<key>``; 200 with ``{"id", "args_hash"}`` is found,
  404 is not found, anything else (or silence past the timeout) is unavailable.

Keys travel faithfully. A key of printable ASCII (inner spaces included) without ``%`` goes into
``Idempotency-Key`` as it is. Any other key (non-ASCII letters, ``%``, control characters of keys
recorded before intake refused them) goes as its UTF-8 bytes percent-encoded
(RFC 3986), with ``Idempotency-Key-Encoding: percent`` beside it, on the send and on the lookup
alike (the lookup's ``idempotency_key`` carries the same wire form). A provider that decodes it
gets the exact key; one that does not still sees one stable ASCII key per logical effect, the same
on send and lookup, never equal to another key's. Control characters never reach here: intake
refuses them (``attempts.ledger.text_problem``).

A lookup URL may instead name the correlation field itself with placeholders, for providers that
look effects up by another field: ``https://p.example/charges?metadata[ledger]={attempt_id}``
(placeholders: ``{idempotency_key}``, ``{attempt_id}``, ``{args_hash}``, ``{tenant}``).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any
from urllib.parse import SplitResult, quote, urlencode, urlsplit

from attempts.canonical import canonical_bytes
from reconciliation.providers.base import (
    Adapter,
    Call,
    LookupAnswer,
    LookupStatus,
    SendAnswer,
    SendStatus,
)

PLACEHOLDERS = ("idempotency_key", "attempt_id", "args_hash", "tenant")
# Refusals after which the same key may be sent again later.
RETRYABLE_REFUSALS = frozenset({408, 409, 425, 429})
MAX_ANSWER_BYTES = 1024 * 1024
USER_AGENT = "ledgerweb-reconciler/1"
KEY_ENCODING_HEADER = "Idempotency-Key-Encoding"
# Characters a key may carry as they are: printable ASCII and inner spaces, except "%" (which
# marks the encoding).
_PLAIN_KEY_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) - {"%"}


def wire_key(key: str) -> tuple[str, bool]:
    """The key as it travels in a header or query (see the module docstring), and whether it
    is percent-encoded. Injective: a plain key has no ``%``, an encoded one always has."""
    if key == key.strip(" ") and all(char in _PLAIN_KEY_CHARS for char in key):
        return key, False
    return quote(key, safe="".join(sorted(_PLAIN_KEY_CHARS - {" "}))), True


class _Answer:
    __slots__ = ("status", "body", "latency_ms")

    def __init__(self, status: int, body: bytes, latency_ms: int) -> None:
        self.status = status
        self.body = body
        self.latency_ms = latency_ms

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return None


class _Unsent(Exception):
    """The connection could not be opened: no byte of the request left this machine."""


def _split(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return parts


def _request(
    method: str, url: str, *, body: bytes | None, headers: dict[str, str], timeout: float
) -> _Answer:
    """One HTTP exchange on a fresh connection. Raises _Unsent when nothing was sent, and
    OSError / http.client.HTTPException when the exchange broke after that."""
    try:
        parts = _split(url)
    except ValueError as exc:
        raise _Unsent(str(exc)) from exc
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    started = time.monotonic()
    try:
        try:
            connection.connect()
        except OSError as exc:
            raise _Unsent(f"{type(exc).__name__}: {exc}") from exc
        connection.request(method, path, body=body, headers={"User-Agent": USER_AGENT, **headers})
        response = connection.getresponse()
        data = response.read(MAX_ANSWER_BYTES)
        return _Answer(response.status, data, int((time.monotonic() - started) * 1000))
    finally:
        connection.close()


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timeout"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class GenericHttpAdapter(Adapter):
    """Adapter for any provider that speaks protocol section 10."""

    def check(self) -> list[str]:
        problems = []
        if not self.tool.dispatch_url:
            problems.append("dispatch_url is empty: recovery cannot send this tool")
        else:
            try:
                _split(self.tool.dispatch_url)
            except ValueError as exc:
                problems.append(f"dispatch_url: {exc}")
        if self.can_look_up:
            if not self.tool.lookup_url:
                problems.append("lookup_url is empty: recovery cannot look this tool up")
            else:
                try:
                    _split(self.tool.lookup_url)
                except ValueError as exc:
                    problems.append(f"lookup_url: {exc}")
        if self.tool.timeout_seconds <= 0:
            problems.append("timeout_seconds must be positive")
        return problems

    def lookup_url_for(self, call: Call) -> str:
        url = self.tool.lookup_url
        key, _ = wire_key(call.idempotency_key)
        if any("{" + name + "}" in url for name in PLACEHOLDERS):
            for name in PLACEHOLDERS:
                value = {
                    "idempotency_key": key,
                    "attempt_id": call.attempt_id,
                    "args_hash": call.args_hash,
                    "tenant": call.tenant,
                }[name]
                url = url.replace("{" + name + "}", quote(value, safe=""))
            return url
        separator = "&" if urlsplit(url).query else "?"
        return f"{url}{separator}{urlencode({'idempotency_key': key})}"

    @staticmethod
    def key_headers(call: Call) -> dict[str, str]:
        """``Idempotency-Key`` (and its encoding, when encoded) for a send or a lookup."""
        key, encoded = wire_key(call.idempotency_key)
        headers = {"Idempotency-Key": key}
        if encoded:
            headers[KEY_ENCODING_HEADER] = "percent"
        return headers

    @staticmethod
    def lookup_headers(call: Call) -> dict[str, str]:
        """A lookup says how its ``idempotency_key`` is encoded, when it is."""
        _, encoded = wire_key(call.idempotency_key)
        return {KEY_ENCODING_HEADER: "percent"} if encoded else {}

    def send(self, call: Call) -> SendAnswer:
        if not self.tool.dispatch_url:
            return SendAnswer(SendStatus.REFUSED, retryable=True, detail="no dispatch_url")
        headers = {
            "Content-Type": "application/json",
            **self.key_headers(call),
            "X-Ledger-Attempt-Id": call.attempt_id,
            "X-Ledger-Args-Hash": call.args_hash,
        }
        try:
            answer = _request(
                "POST",
                self.tool.dispatch_url,
                body=canonical_bytes(call.args),
                headers=headers,
                timeout=self.timeout,
            )
        except _Unsent as exc:
            # Nothing left this machine, so nothing can have happened: safe to send again.
            return SendAnswer(SendStatus.REFUSED, retryable=True, detail=f"not sent: {exc}")
        except (OSError, http.client.HTTPException) as exc:
            return SendAnswer(SendStatus.UNCERTAIN, detail=_error_text(exc))
        body = answer.json()
        if 200 <= answer.status < 300:
            provider_id = body.get("id") if isinstance(body, dict) else None
            return SendAnswer(
                SendStatus.ACCEPTED,
                provider_request_id=provider_id if isinstance(provider_id, str) else "",
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                detail="" if isinstance(provider_id, str) else "2xx answer without an id",
            )
        if 400 <= answer.status < 500:
            return SendAnswer(
                SendStatus.REFUSED,
                retryable=answer.status in RETRYABLE_REFUSALS,
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                detail=_error_detail(body, answer.status),
            )
        # 5xx (or anything stranger): a gateway may answer after the effect happened.
        return SendAnswer(
            SendStatus.UNCERTAIN,
            http_status=answer.status,
            latency_ms=answer.latency_ms,
            detail=_error_detail(body, answer.status),
        )

    def lookup(self, call: Call) -> LookupAnswer:
        if not self.tool.lookup_url:
            return LookupAnswer(LookupStatus.UNAVAILABLE, detail="no lookup_url configured")
        started = time.monotonic()
        try:
            answer = _request(
                "GET",
                self.lookup_url_for(call),
                body=None,
                headers={"Accept": "application/json", **self.lookup_headers(call)},
                timeout=self.timeout,
            )
        except (_Unsent, OSError, http.client.HTTPException) as exc:
            return LookupAnswer(
                LookupStatus.UNAVAILABLE,
                detail=_error_text(exc.__cause__ if isinstance(exc, _Unsent) else exc),
                latency_ms=int((time.monotonic() - started) * 1000),
            )
        if answer.status == 404:
            return LookupAnswer(
                LookupStatus.NOT_FOUND, http_status=404, latency_ms=answer.latency_ms
            )
        if answer.status != 200:
            return LookupAnswer(
                LookupStatus.UNAVAILABLE,
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                detail=_error_detail(answer.json(), answer.status),
            )
        body = answer.json()
        provider_id = body.get("id") if isinstance(body, dict) else None
        args_hash = body.get("args_hash") if isinstance(body, dict) else None
        if not isinstance(provider_id, str) or not isinstance(args_hash, str) or not provider_id:
            return LookupAnswer(
                LookupStatus.AMBIGUOUS,
                http_status=200,
                latency_ms=answer.latency_ms,
                detail="200 answer without a string id and args_hash",
            )
        count = body.get("count", 1)
        return LookupAnswer(
            LookupStatus.FOUND,
            provider_request_id=provider_id,
            args_hash=args_hash.lower(),
            count=count if isinstance(count, int) and count >= 1 else 1,
            result_ref=f"lookup:{provider_id}",
            http_status=200,
            latency_ms=answer.latency_ms,
        )


def _error_detail(body: Any, status: int) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return f"{status} {error.get('code', '')}: {error.get('message', '')}".strip(": ")
        if isinstance(error, str):
            return f"{status} {error}"
    return f"HTTP {status}"
