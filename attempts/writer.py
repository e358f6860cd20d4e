"""The intent writer: one process that records the web workers' intents in shared commits.

On the embedded SQLite database every ledger write takes one write lock and ends in a durable
commit of about twenty pages. A web worker holds only a request or two at a time, so its own
group commits (``states.GroupCommit``) stay small, and under load the lock holder shares the
CPU with every other process. The writer is a single process on a Unix socket beside the
database (``<database>-writer.sock``, mode 0600): a worker sends an intent already prepared
outside the lock (its row values, its first event's values and canonical bytes, as JSON), the
writer takes everything that has arrived, writes each piece in its own savepoint under one write transaction, commits once
(``synchronous=FULL``), and only then answers each worker. It runs the statements a worker
would (``states.write_new_attempt_rows``), under the same writer queue, so the chain and the
lock order are the ledger's own; only Django's cursor and transaction wrappers are left out
(``write_requests``).

Nothing depends on the writer being there:

- no writer (not started, stopped, crashed): the worker records the intent itself;
- the writer dies or stalls after a request was sent: the worker cannot know whether the intent
  was committed, so it records it itself. If the writer had committed it, the unique
  idempotency key refuses the second insert and ``record_intent`` answers with the recorded
  attempt, as for any replay. Never two rows, never a lost intent;
- a piece the database refuses (the key is taken) is rolled back alone; the worker is told
  ``integrity`` and takes the replay path; any other failure there makes the worker write the
  intent itself (and meet the same error in its own words).

PostgreSQL has no writer: its server groups concurrent commits itself.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import sqlite3
import threading
import time
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection

from attempts import states

log = logging.getLogger("ledgerweb.writer")

SOCKET_SUFFIX = "-writer.sock"
MAX_FRAME = 8 * 1024 * 1024  # a prepared intent is its args (bounded) and a few hundred bytes
REPLY_TIMEOUT = 30.0  # as long as a direct writer would wait for the lock (the busy timeout)
RETRY_AFTER = 1.0  # how long a worker writes for itself after finding no writer
RECV_SIZE = 64 * 1024


def socket_path() -> str | None:
    """The writer's socket for this process's database, or None (PostgreSQL, in-memory)."""
    database = states.sqlite_file()
    return database + SOCKET_SUFFIX if database else None


def enabled() -> bool:
    return settings.LEDGER.get("INTENT_WRITER", True)


def status() -> str | None:
    """ "ok" when a writer listens for this database, "absent" when none does, None when there
    is no writer to expect (PostgreSQL, or turned off)."""
    path = socket_path() if enabled() else None
    if path is None:
        return None
    return "ok" if _listening(path) else "absent"


def _listening(path: str) -> bool:
    """Whether something accepts connections on the socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


# ---------------------------------------------------------------------------------------------
# Framing: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.


def _frame(value: Any) -> bytes:
    body = json.dumps(value, separators=(",", ":")).encode("utf-8")
    return len(body).to_bytes(4, "big") + body


def _take_frames(buffer: bytearray, what: str) -> list[bytes]:
    """Remove the complete frames at the start of ``buffer`` and return their bodies (both
    sides of the socket read this way); ValueError for a length over MAX_FRAME."""
    bodies = []
    while len(buffer) >= 4:
        size = int.from_bytes(buffer[:4], "big")
        if size > MAX_FRAME:
            raise ValueError(f"a {size}-byte {what} is over the {MAX_FRAME}-byte limit")
        if len(buffer) < 4 + size:
            break
        bodies.append(bytes(buffer[4 : 4 + size]))
        del buffer[: 4 + size]
    return bodies


def _read_frame(sock: socket.socket) -> Any:
    """The writer's one reply, usually in a single read (a reply is a few hundred bytes)."""
    buffer = bytearray()
    while True:
        chunk = sock.recv(RECV_SIZE)
        if not chunk:
            raise ConnectionError("the writer closed the connection")
        buffer += chunk
        bodies = _take_frames(buffer, "reply")
        if bodies:
            if len(bodies) > 1 or buffer:
                raise ConnectionError("the writer sent more than one reply")
            return json.loads(bodies[0])


# ---------------------------------------------------------------------------------------------
# The worker's side


class _Connections(threading.local):
    """Each thread's connection to the writer (a socket carries one request at a time)."""

    sock: socket.socket | None = None
    pid: int = 0
    retry_at: float = 0.0


_local = _Connections()
submitted = 0  # intents this process recorded through the writer (for tests)


def _connection(path: str) -> socket.socket | None:
    if _local.sock is not None and _local.pid == os.getpid():
        return _local.sock
    _local.sock = None
    if time.monotonic() < _local.retry_at:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REPLY_TIMEOUT)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        _local.retry_at = time.monotonic() + RETRY_AFTER
        return None
    _local.sock, _local.pid = sock, os.getpid()
    return sock


def _drop() -> None:
    if _local.sock is not None:
        try:
            _local.sock.close()
        except OSError:
            pass
    _local.sock = None


def submit(prepared: states.PreparedAttempt):
    """Record ``prepared`` through the writer. Returns the saved attempt; None when no writer
    answered (the caller records it itself); raises IntegrityError when the database refused
    it (the idempotency key or the attempt id is taken)."""
    global submitted
    if not enabled() or connection.in_atomic_block:
        return None
    path = socket_path()
    if path is None:
        return None
    sock = _connection(path)
    if sock is None:
        return None
    event = prepared.first_event
    try:
        before, after = event.parts
        sock.sendall(
            _frame(
                {"a": prepared.values, "e": event.values, "h": [before.decode(), after.decode()]}
            )
        )
        reply = _read_frame(sock)
    except (OSError, ValueError) as exc:
        # Lost (the writer died, stalled or is not one): the intent may or may not be
        # committed. The caller's own write settles it either way (see the module docstring).
        log.warning("intent writer did not answer (%s); writing the intent here", exc)
        _drop()
        return None
    if isinstance(reply, dict) and isinstance(reply.get("ok"), list) and len(reply["ok"]) == 4:
        submitted += 1
        return prepared.finish(*reply["ok"])
    if isinstance(reply, dict) and reply.get("refused") == "integrity":
        raise IntegrityError(str(reply.get("message", "refused by the database")))
    log.warning("intent writer failed (%s); writing the intent here", reply)
    return None


# ---------------------------------------------------------------------------------------------
# The writer's side


class _Peer:
    __slots__ = ("sock", "buffer")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def frames(self) -> list[Any]:
        """Complete requests in the buffer; ValueError for anything that is not one."""
        return [_request(json.loads(body)) for body in _take_frames(self.buffer, "request")]


def _request(value: Any) -> tuple[list, list, tuple[bytes, bytes]]:
    """(attempt values, event values, the event's canonical bytes around its prev_hash)."""
    parts = value.get("h") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("a"), list)
        or not isinstance(value.get("e"), list)
        or not isinstance(parts, list)
        or len(parts) != 2
        or not all(isinstance(part, str) for part in parts)
    ):
        raise ValueError("a request is {'a': [...], 'e': [...], 'h': [before, after]}")
    return value["a"], value["e"], (parts[0].encode(), parts[1].encode())


def _refusal(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, IntegrityError | sqlite3.IntegrityError):
        return {"refused": "integrity", "message": str(exc)}
    return {"error": f"{type(exc).__name__}: {exc}"}


def write_requests(requests: list[tuple[list, list, tuple[bytes, bytes]]]) -> list[dict[str, Any]]:
    """Record ``requests`` in one transaction and one durable commit; returns one reply each.

    Runs on the bare sqlite3 connection under Django's (which stays in autocommit): the writer
    queue, then ``BEGIN IMMEDIATE``, each piece in its own savepoint when there are several (a
    refused piece rolls back alone), ``COMMIT``. The statements are the ledger's own
    (``states.write_new_attempt_rows``); only Django's cursor and transaction wrappers are left
    out, which halves the writer's CPU per commit. If the transaction fails, no piece is kept
    and every reply says so."""
    database = states.sqlite_file()
    raw = _raw_connection()
    alone = len(requests) == 1
    replies: list[dict[str, Any]] = []
    with states.writer_queue_held(database):
        cursor = raw.cursor()
        statements = states.QmarkCursor(cursor)
        try:
            cursor.execute("BEGIN IMMEDIATE")
            for attempt_values, event_values, parts in requests:
                if alone:
                    written = states.write_new_attempt_rows(
                        statements, attempt_values, event_values, parts
                    )
                    replies.append({"ok": list(written)})
                    continue
                cursor.execute("SAVEPOINT intent")
                try:
                    written = states.write_new_attempt_rows(
                        statements, attempt_values, event_values, parts
                    )
                except Exception as exc:  # noqa: BLE001 (this piece's reply)
                    cursor.execute("ROLLBACK TO intent")
                    cursor.execute("RELEASE intent")
                    replies.append(_refusal(exc))
                    continue
                cursor.execute("RELEASE intent")
                replies.append({"ok": list(written)})
            cursor.execute("COMMIT")
        except BaseException as exc:
            if raw.in_transaction:
                raw.rollback()
            if not isinstance(exc, Exception):
                raise
            failure = _refusal(exc) if alone else {"error": f"{type(exc).__name__}: {exc}"}
            return [failure] * len(requests)
        finally:
            cursor.close()
    states.checkpoint_now_and_then()
    return replies


_tuned: sqlite3.Connection | None = None


def _raw_connection() -> sqlite3.Connection:
    """Django's sqlite3 connection, with the writer's statement journals kept in memory.

    Each piece of a group runs in a savepoint, whose journal holds the original of every page
    the piece changes: some 20 pages, more than SQLite keeps in memory before it spills the
    journal to a temporary file (open, writes, unlink: a third of the writer's system calls).
    The writer only inserts, so its temporary storage stays a few pages."""
    global _tuned
    connection.ensure_connection()
    raw = connection.connection
    if raw is not _tuned:
        raw.execute("PRAGMA temp_store=MEMORY")
        _tuned = raw
    return raw


def _remove_stale(path: str) -> None:
    """Remove a socket file nobody listens on; refuse to start beside a live writer."""
    if not os.path.exists(path):
        return
    if _listening(path):
        raise RuntimeError(f"another intent writer is already listening on {path}")
    os.unlink(path)


def serve(stop: threading.Event, *, ready: threading.Event | None = None) -> dict[str, int]:
    """Serve until ``stop`` is set; returns counts (groups, intents, refused, peers)."""
    path = socket_path()
    if path is None:
        raise RuntimeError("the intent writer serves the embedded SQLite database only")
    _remove_stale(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: only this user may write intents
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    listener.listen(256)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    counts = {"groups": 0, "intents": 0, "refused": 0, "peers": 0}
    log.info("intent writer listening on %s", path)
    if ready is not None:
        ready.set()
    try:
        while not stop.is_set():
            batch: list[tuple[_Peer, tuple]] = []
            for key, _ in selector.select(timeout=0.2):
                if key.data is None:
                    _accept(listener, selector, counts)
                    continue
                peer = key.data
                try:
                    # Under 128 KiB, so the buffer comes from the heap rather than a fresh
                    # mmap (and mremap, munmap) per read; a longer frame takes more reads.
                    data = peer.sock.recv(RECV_SIZE)
                    if not data:
                        raise ConnectionError("closed")
                    peer.buffer += data
                    batch.extend((peer, request) for request in peer.frames())
                except (OSError, ValueError) as exc:
                    if not isinstance(exc, ConnectionError):
                        log.warning("intent writer: dropping a peer: %s", exc)
                    _close(selector, peer)
            if batch:
                _write_batch(batch, selector, counts)
    finally:
        for key in list(selector.get_map().values()):
            if key.data is not None:
                _close(selector, key.data)
        selector.close()
        listener.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        log.info("intent writer stopped: %s", counts)
    return counts


def _accept(listener: socket.socket, selector: selectors.BaseSelector, counts: dict) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        sock.settimeout(REPLY_TIMEOUT)
        selector.register(sock, selectors.EVENT_READ, _Peer(sock))
        counts["peers"] += 1


def _close(selector: selectors.BaseSelector, peer: _Peer) -> None:
    try:
        selector.unregister(peer.sock)
    except (KeyError, ValueError):
        pass
    peer.sock.close()


def _write_batch(batch: list, selector: selectors.BaseSelector, counts: dict) -> None:
    """One group commit for everything that arrived; each peer is answered after it."""
    for start in range(0, len(batch), states.GroupCommit.MAX_GROUP):
        chunk = batch[start : start + states.GroupCommit.MAX_GROUP]
        replies = write_requests([request for _, request in chunk])
        counts["groups"] += 1
        for (peer, _), reply in zip(chunk, replies, strict=True):
            counts["intents" if "ok" in reply else "refused"] += 1
            try:
                peer.sock.sendall(_frame(reply))
            except OSError:
                _close(selector, peer)
