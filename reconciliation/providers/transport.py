"""One HTTP exchange with a provider, bounded as a whole: connect, send, headers and body share
one deadline, and the answer has a size limit checked while it streams.

A socket timeout bounds each read, not the request: a provider that sends one byte a second
never trips it. So the deadline is enforced twice, below any library above (http.client here,
the stripe provider through ``exchange``):

- a watchdog shuts *the socket itself* down when the deadline passes (one thread keeps the
  deadlines of every exchange in flight), which ends whatever read or write is blocked on it.
  It holds the socket from the moment it is connected, not the connection object: http.client
  lets go of its socket (``connection.sock = None``) as soon as an answer says it will close the
  connection (``Connection: close``, HTTP/1.0, a body delimited by the close), and reads the
  body through the response's own file;
- every read of the body checks the clock, so an answer that keeps coming in pieces (chunked, a
  trickle) ends at the deadline even if the watchdog's shutdown lost a race.

Every framing is covered: ``Content-Length``, chunked, close-delimited, HTTP/1.0 and TLS (the
shutdown of a TLS socket shuts its underlying socket). The answer is refused as soon as its
``Content-Length`` or the bytes read so far pass the limit, before the rest is read.
"""

from __future__ import annotations

import email.utils
import heapq
import http.client
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

log = logging.getLogger("ledgerweb.reconciler")

# Most bytes read from one provider answer.
MAX_ANSWER_BYTES = 1024 * 1024
_CHUNK = 64 * 1024


class NotSent(Exception):
    """The connection could not be opened: no byte of the request left this machine."""


class DeadlineExceeded(TimeoutError):
    """The exchange did not finish within its deadline (the request may have been sent).
    ``latency_ms`` is how long it ran before it was cut."""

    def __init__(self, message: str, *, latency_ms: int = 0) -> None:
        super().__init__(message)
        self.latency_ms = latency_ms


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


class _Deadlines:
    """The deadlines of every exchange in flight in this process, kept by one thread: at a
    deadline it fires that exchange's watchdog. (A timer thread per exchange cost a thread's
    start, a large share of a provider call's CPU.) The thread starts with the first deadline
    and ends after ``IDLE`` seconds without one: nothing it holds outlives the exchanges."""

    IDLE = 30.0

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No deadline and no thread (and, in a forked child, none of the parent's)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, _Watchdog]] = []
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, when: float, watchdog: _Watchdog) -> tuple[float, int, _Watchdog]:
        """Fire ``watchdog`` at monotonic time ``when`` unless ``remove``d before."""
        entry = (when, next(self._numbers), watchdog)
        with self._lock:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="provider-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._changed.notify()
        return entry

    def remove(self, entry: tuple[float, int, _Watchdog]) -> None:
        """The exchange ended: its watchdog is not fired (unless it is firing already)."""
        with self._lock:
            try:
                self._heap.remove(entry)
            except ValueError:
                return  # popped to fire
            heapq.heapify(self._heap)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                if not due:
                    if self._heap:
                        self._changed.wait(self._heap[0][0] - now)
                    elif not self._changed.wait(self.IDLE) and not self._heap:
                        self._thread = None
                        return
                    continue
            for watchdog in due:
                try:
                    watchdog.fire()
                except Exception:  # one exchange's trouble stops no other's deadline
                    log.exception("an exchange could not be cut at its deadline")


_deadlines = _Deadlines()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_deadlines.reset)


class _Watchdog:
    """Shuts a connection's socket down when the deadline passes (see the module docstring:
    it keeps the socket itself, which http.client may stop holding before the body is read)."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.connection = connection
        self.sock: socket.socket | None = None
        self.fired = False
        self.seconds = max(0.0, seconds)
        self._lock = threading.Lock()
        self._entry: tuple[float, int, _Watchdog] | None = None

    def hold(self) -> None:
        """Keep the connected socket, whatever the connection does with it later."""
        with self._lock:
            self.sock = self.connection.sock
            fired = self.fired
        if fired:
            self._shutdown()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
        self._shutdown()

    def _shutdown(self) -> None:
        sock = self.sock or self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Watchdog:
        self._entry = _deadlines.add(time.monotonic() + self.seconds, self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._entry is not None:
            _deadlines.remove(self._entry)


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
            watchdog.hold()
            ends = started + deadline
            try:
                connection.request(method, target, body=body, headers=headers)
                response = connection.getresponse()
                if after_response is not None:
                    after_response()
                answer_headers = {k.lower(): v for k, v in response.getheaders()}
                data = _read_limited(response, max_bytes, ends=ends)
            except (OSError, http.client.HTTPException) as exc:
                if watchdog.fired or time.monotonic() >= ends:
                    raise _late(deadline, started) from exc
                raise
    finally:
        connection.close()
        if watchdog.sock is not None:
            watchdog.sock.close()
    if watchdog.fired:
        raise _late(deadline, started)
    return Answer(response.status, data, _ms_since(started), answer_headers)


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _late(deadline: float, started: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"no complete answer within the {deadline:g}s deadline", latency_ms=_ms_since(started)
    )


class _PastDeadline(OSError):
    """A read came back after the deadline (the watchdog's shutdown may still be on its way)."""


def _read_limited(response: http.client.HTTPResponse, max_bytes: int, *, ends: float) -> bytes:
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise AnswerTooLarge(f"answer of {int(length)} bytes is over the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = response.read1(_CHUNK)
        if time.monotonic() >= ends:
            raise _PastDeadline("the answer was still coming at the deadline")
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise AnswerTooLarge(f"answer is over the {max_bytes}-byte limit")
        chunks.append(chunk)
    if response.length:  # the provider closed before the Content-Length it announced
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)
