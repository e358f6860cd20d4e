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
import re
import socket
import time
from typing import Any
from urllib.parse import SplitResult, quote, urlencode, urlsplit

from attempts.canonical import canonical_bytes
from reconciliation.providers import base, transport
from reconciliation.providers.answers import checked_id, evidence_of, id_problem

HASH = re.compile(r"[0-9a-fA-F]{64}")
PLACEHOLDERS = ("idempotency_key", "attempt_id", "args_hash", "tenant")
# Refusals after which the same key may be sent again later.
RETRYABLE_REFUSALS = frozenset({408, 409, 425, 429})
MAX_ANSWER_BYTES = transport.MAX_ANSWER_BYTES
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
    __slots__ = ("status", "body", "latency_ms", "retry_after")

    def __init__(self, answer: transport.Answer) -> None:
        self.status = answer.status
        self.body = answer.body
        self.latency_ms = answer.latency_ms
        self.retry_after = answer.retry_after if answer.status in (429, 503) else None

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None


_Unsent = transport.NotSent


def _split(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return parts


def _request(
    method: str, url: str, *, body: bytes | None, headers: dict[str, str], timeout: float
) -> _Answer:
    """One HTTP exchange on a fresh connection, bounded as a whole by ``timeout``
    (transport.exchange). Raises _Unsent when nothing was sent, and DeadlineExceeded,
    AnswerTooLarge, OSError or http.client.HTTPException when it broke after that."""
    return _Answer(
        transport.exchange(
            method,
            url,
            body=body,
            headers={"User-Agent": USER_AGENT, **headers},
            deadline=timeout,
            max_bytes=MAX_ANSWER_BYTES,
        )
    )


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, transport.DeadlineExceeded):
        return f"timeout: {exc}"
    if isinstance(exc, transport.AnswerTooLarge):
        return str(exc)
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timeout"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class GenericHttpAdapter(base.Adapter):
    """Adapter for any provider that speaks protocol section 10."""

    @property
    def provider_key(self) -> str:
        """The provider's host and port (from the lookup URL, else the dispatch URL): tools
        on one provider share its bulkhead."""
        for url in (self.tool.lookup_url, self.tool.dispatch_url):
            try:
                parts = _split(url)
            except ValueError:
                continue
            return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        return super().provider_key

    def endpoint(self, operation: str) -> str:
        """The URL an operation calls, without its query and from its first placeholder on
        (``host:port/path``): a lookup URL that fails defers no send of the same host, and one
        tool's path that fails holds no other tool's."""
        url = self.tool.dispatch_url if operation == "send" else self.tool.lookup_url
        try:
            parts = _split(url)
        except ValueError:
            return self.provider_key
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = parts.path.split("{", 1)[0] or "/"
        return f"{parts.hostname}:{port}{path}"

    def check(self) -> list[str]:
        problems = []
        urls = [("dispatch_url", "send this tool")]
        if self.can_look_up:
            urls.append(("lookup_url", "look this tool up"))
        for name, what in urls:
            url = getattr(self.tool, name)
            if not url:
                problems.append(f"{name} is empty: recovery cannot {what}")
                continue
            try:
                _split(url)
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
        if self.tool.timeout_seconds <= 0:
            problems.append("timeout_seconds must be positive")
        return problems

    def lookup_url_for(self, call: base.Call) -> str:
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
    def key_headers(call: base.Call) -> dict[str, str]:
        """``Idempotency-Key`` (and its encoding, when encoded) for a send or a lookup."""
        key, encoded = wire_key(call.idempotency_key)
        headers = {"Idempotency-Key": key}
        if encoded:
            headers[KEY_ENCODING_HEADER] = "percent"
        return headers

    @staticmethod
    def lookup_headers(call: base.Call) -> dict[str, str]:
        """A lookup says how its ``idempotency_key`` is encoded, when it is."""
        _, encoded = wire_key(call.idempotency_key)
        return {KEY_ENCODING_HEADER: "percent"} if encoded else {}

    def send(self, call: base.Call) -> base.SendAnswer:
        if not self.tool.dispatch_url:
            return base.SendAnswer(
                base.SendStatus.REFUSED, retryable=True, detail="no dispatch_url"
            )
        headers = {
            "Content-Type": "application/json",
            **self.key_headers(call),
            "X-Ledger-Attempt-Id": call.attempt_id,
            "X-Ledger-Args-Hash": call.args_hash,
        }
        started = time.monotonic()
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
            return base.SendAnswer(
                base.SendStatus.REFUSED,
                retryable=True,
                latency_ms=_ms_since(started),
                detail=f"not sent: {exc}",
            )
        except (OSError, http.client.HTTPException, transport.AnswerTooLarge) as exc:
            # A cut call ran until it was cut: its latency is that time, not 0.
            return base.SendAnswer(
                base.SendStatus.UNCERTAIN, latency_ms=_ms_since(started), detail=_error_text(exc)
            )
        body = answer.json()
        if 200 <= answer.status < 300:
            provider_id = body.get("id") if isinstance(body, dict) else None
            if provider_id is None:
                return base.SendAnswer(
                    base.SendStatus.ACCEPTED,
                    http_status=answer.status,
                    latency_ms=answer.latency_ms,
                    detail="2xx answer without an id",
                )
            kept, problem = checked_id("provider_request_id", provider_id)
            return base.SendAnswer(
                base.SendStatus.ACCEPTED,
                provider_request_id=kept,
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                invalid=problem,
                evidence=evidence_of(answer.body) if problem else "",
            )
        if 400 <= answer.status < 500:
            return base.SendAnswer(
                base.SendStatus.REFUSED,
                retryable=answer.status in RETRYABLE_REFUSALS,
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                detail=_error_detail(body, answer.status),
                retry_after=answer.retry_after,
            )
        # 5xx (or anything stranger): a gateway may answer after the effect happened.
        return base.SendAnswer(
            base.SendStatus.UNCERTAIN,
            http_status=answer.status,
            latency_ms=answer.latency_ms,
            detail=_error_detail(body, answer.status),
            retry_after=answer.retry_after,
        )

    def lookup(self, call: base.Call) -> base.LookupAnswer:
        if not self.tool.lookup_url:
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE, detail="no lookup_url configured"
            )
        started = time.monotonic()
        try:
            answer = _request(
                "GET",
                self.lookup_url_for(call),
                body=None,
                headers={"Accept": "application/json", **self.lookup_headers(call)},
                timeout=self.timeout,
            )
        except transport.AnswerTooLarge as exc:
            return base.LookupAnswer(
                base.LookupStatus.AMBIGUOUS,
                detail="answer refused unread",
                latency_ms=_ms_since(started),
                invalid=str(exc),
                evidence="(not read)",
            )
        except (_Unsent, OSError, http.client.HTTPException) as exc:
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE,
                detail=_error_text(exc.__cause__ if isinstance(exc, _Unsent) else exc),
                latency_ms=_ms_since(started),
            )
        if answer.status == 404:
            return base.LookupAnswer(
                base.LookupStatus.NOT_FOUND, http_status=404, latency_ms=answer.latency_ms
            )
        if answer.status != 200:
            return base.LookupAnswer(
                base.LookupStatus.UNAVAILABLE,
                http_status=answer.status,
                latency_ms=answer.latency_ms,
                detail=_error_detail(answer.json(), answer.status),
                retry_after=answer.retry_after,
            )
        return _found(answer)


def _found(answer: _Answer) -> base.LookupAnswer:
    """A 200 lookup answer: FOUND with the provider's id, args hash and count when they are
    what the protocol says; AMBIGUOUS (with the evidence) when not."""
    try:
        answer.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return base.LookupAnswer(
            base.LookupStatus.AMBIGUOUS,
            http_status=200,
            latency_ms=answer.latency_ms,
            detail="the provider's answer failed validation",
            invalid=f"the answer is not UTF-8 (byte {exc.start})",
            evidence=evidence_of(answer.body),
        )
    body = answer.json()
    provider_id = body.get("id") if isinstance(body, dict) else None
    args_hash = body.get("args_hash") if isinstance(body, dict) else None
    if provider_id is None or args_hash is None:
        return base.LookupAnswer(
            base.LookupStatus.AMBIGUOUS,
            http_status=200,
            latency_ms=answer.latency_ms,
            detail="200 answer without a string id and args_hash",
        )
    count = body.get("count", 1)
    problem = id_problem("provider_request_id", provider_id)
    if not problem and not (isinstance(args_hash, str) and HASH.fullmatch(args_hash)):
        problem = "args_hash is not 64 hexadecimal digits"
    if not problem and not (type(count) is int and 1 <= count <= 10**6):
        problem = "count is not a positive integer"
    if problem:
        return base.LookupAnswer(
            base.LookupStatus.AMBIGUOUS,
            http_status=200,
            latency_ms=answer.latency_ms,
            detail="the provider's answer failed validation",
            invalid=problem,
            evidence=evidence_of(answer.body),
        )
    return base.LookupAnswer(
        base.LookupStatus.FOUND,
        provider_request_id=provider_id,
        args_hash=args_hash.lower(),
        count=count,
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
