"""One HTTP exchange with a provider, bounded as a whole: connect, send, headers and body share
one deadline, and the answer has a size limit checked while it streams.

A socket timeout bounds each read, not the request: a provider that sends one byte a second
never trips it. So a watchdog timer shuts the socket down when the deadline passes, which ends
whatever read or write is blocked on it, in any library above (http.client here, the stripe
library through its transport). The answer is refused as soon as its ``Content-Length`` or the
bytes read so far pass the limit, before the rest is read.
"""

from __future__ import annotations

import email.utils
import http.client
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# Most bytes read from one provider answer.
MAX_ANSWER_BYTES = 1024 * 1024
_CHUNK = 64 * 1024


class NotSent(Exception):
    """The connection could not be opened: no byte of the request left this machine."""


class DeadlineExceeded(TimeoutError):
    """The exchange did not finish within its deadline (the request may have been sent)."""


class AnswerTooLarge(Exception):
    """The answer is larger than the limit; it was not read to the end."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    latency_ms: int
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def retry_after(self) -> float | None:
        return retry_after_seconds(self.headers.get("retry-after"))


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` (delay-seconds or an HTTP date) as seconds from now; None when absent or
    unreadable. Negative values count as zero."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value), 86400))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, min(86400.0, when.timestamp() - (now if now is not None else time.time())))


class _Watchdog:
    """Shuts a connection's socket down when the deadline passes."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.connection = connection
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def exchange(
    method: str,
    url: str,
    *,
    body: bytes | None,
    headers: dict[str, str],
    deadline: float,
    max_bytes: int = MAX_ANSWER_BYTES,
    after_response: Callable[[], None] | None = None,
) -> Answer:
    """One HTTP exchange on a fresh connection, finished within ``deadline`` seconds.

    Raises NotSent when the connection could not be opened (nothing was sent), DeadlineExceeded
    past the deadline, AnswerTooLarge for an answer over ``max_bytes``, and OSError /
    http.client.HTTPException when the exchange broke after the request may have left.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotSent(f"not an http(s) URL: {url!r}")
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    started = time.monotonic()
    connection = connection_class(parts.hostname, parts.port, timeout=deadline)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watchdog = _Watchdog(connection, deadline)
    try:
        with watchdog:
            try:
                connection.connect()
            except OSError as exc:
                if watchdog.fired:
                    raise NotSent(f"connect did not finish within {deadline:g}s") from exc
                raise NotSent(f"{type(exc).__name__}: {exc}") from exc
            try:
                connection.request(method, target, body=body, headers=headers)
                response = connection.getresponse()
                if after_response is not None:
                    after_response()
                answer_headers = {k.lower(): v for k, v in response.getheaders()}
                data = _read_limited(response, max_bytes)
            except (OSError, http.client.HTTPException) as exc:
                if watchdog.fired:
                    raise DeadlineExceeded(
                        f"no complete answer within the {deadline:g}s deadline"
                    ) from exc
                raise
    finally:
        connection.close()
    if watchdog.fired:
        raise DeadlineExceeded(f"no complete answer within the {deadline:g}s deadline")
    return Answer(response.status, data, int((time.monotonic() - started) * 1000), answer_headers)


def _read_limited(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise AnswerTooLarge(f"answer of {int(length)} bytes is over the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = response.read1(_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise AnswerTooLarge(f"answer is over the {max_bytes}-byte limit")
        chunks.append(chunk)
    if response.length:  # the provider closed before the Content-Length it announced
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)
