"""Demo provider: a fake external side-effect provider for the interruption ledger.

This is a stand-alone process (standard library + ``rfc8785``, no Django) that plays the part of an
external API with side effects (a payment processor, an email service, ...). The ledger's
reconciliation worker and the crash tests talk to it over HTTP on a loopback address, kill it with
SIGKILL and start it again on the same database. It speaks the generic HTTP provider protocol of
``ledger-protocol.md`` section 10:

* send: ``POST /tools/<tool>/send`` with a JSON object body and the headers ``Idempotency-Key``
  (required), ``X-Ledger-Attempt-Id`` and ``X-Ledger-Args-Hash`` (both optional, stored as
  received). A 2xx answer carries ``{"id": "<provider request id>", "args_hash": ...}``.
* look up: ``GET /tools/<tool>/lookup?idempotency_key=<key>`` (alias ``?correlation=<key>``).
  With ``Idempotency-Key-Encoding: percent`` (send and lookup) the key is percent-encoded UTF-8
  and is decoded before it is stored or looked up, so effects carry the agent's exact key.
  200 ``{"id", "args_hash", "created_at", "count"}`` describes the FIRST effect recorded for that
  tool and key (``count`` = how many effects carry the key); 404 ``{"error": "not_found"}`` means
  not found; anything else (503, a hang) means unavailable.

Durable record
--------------
Every effect is a row in a SQLite database (WAL, ``synchronous=FULL``) committed BEFORE any answer
is written, so a SIGKILL after the commit leaves the effect recorded. ``args_hash`` is the lowercase
hex SHA-256 of the RFC 8785 canonical JSON of the body as the provider received it, computed here,
independently of the ``X-Ledger-Args-Hash`` header.

Effect classes
--------------
* Tools that honour keys (the default, ``--honour-keys``): a send whose key was already used for the
  tool performs nothing new. Same args hash: 200 ``{"id", "args_hash", "replayed": true}`` with the
  original effect. Different hash: 422 ``{"error": {...}}``, nothing recorded.
* Tools that do not honour keys (``honour_keys: false``): every send records a new effect, so
  duplicated non-idempotent effects can be counted (``GET /effects/summary``).

Endpoints
---------
==========================  ===============================================================
``POST /tools/T/send``      201 performed / 200 replayed / 422 key reused with other payload /
                            400 missing key, malformed JSON or non-object body / faults below
``GET /tools/T/lookup``     200 found / 404 not found / 400 no key / faults below
``GET /effects``            list of effects, filters ``?tool=`` and ``?idempotency_key=``
``GET /effects/summary``    ``{"total", "by_key", "duplicates"}`` (optional ``?tool=``)
``GET /healthz``            200 ``{"status": "ok"}``
``GET /_control``           current fault configuration
``POST /_control``          merge a JSON patch into the configuration, answers the new one
``POST /_control/reset``    back to the start-up configuration (and the start-up random seed)
``POST /_control/effects``  ``{tool, idempotency_key, args}``: record an effect directly
``GET /_stats``             ``{"in_flight", "peak_in_flight"}``: send and lookup requests being
                            answered now, and the most at once since the last ``POST /_stats``
``POST /_stats``            the same, then starts a new peak
==========================  ===============================================================

Fault configuration (in memory only)
------------------------------------
Global keys, each of which may be overridden per tool under ``{"tools": {"<tool>": {...}}}``.
In a patch, ``null`` resets a global key to its default, removes a per-tool key, or (as the whole
value of a tool) removes that tool's overrides.

* ``honour_keys`` (bool), ``latency_ms`` (delay before send and lookup), ``lookup_latency_ms``
  (lookup only; overrides ``latency_ms``), ``hang_seconds`` (default 30).
* ``send_mode``: ``ok`` | ``error_5xx`` (503, no effect) | ``refuse`` (400
  ``{"error": {"code": "refused", "retryable": false}}``, no effect) | ``refuse_retryable``
  (``retryable_status``, 429 by default or 409, ``"retryable": true``, no effect) |
  ``hang_before_effect`` (wait ``hang_seconds``, close without answer or effect) |
  ``hang_after_effect`` (commit, wait ``hang_seconds``, then answer) | ``drop_after_effect``
  (commit, close the connection without any HTTP answer).
* ``lookup_mode``: ``ok`` | ``error_5xx`` (503) | ``hang`` (wait ``hang_seconds``, then 503) |
  ``not_found`` (404 even when the effect exists) | ``rate_limited`` (429 with
  ``Retry-After: <retry_after_seconds>``, 1 by default).
* ``outage_message`` (text, at most 200 characters): the message of the 503 answers a fault
  gives, so that an outage injected on purpose says so wherever the ledger shows the provider's
  error (the demo: "demo: the ticket provider is down on purpose").
* ``send_fault_rate`` / ``lookup_fault_rate`` (0..1, default 1): probability that a non-``ok`` mode
  applies to a request (drawn from a generator seeded by ``--seed``).
* ``remaining_faults`` (int): only the next N faults are applied, then requests behave as ``ok``.
  The counter lives where it was set (globally or per tool), is shared by send and lookup faults
  and is decremented only when a fault is actually applied.

Run ``python -m reconciliation.demo_provider --help`` for the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import random
import re
import secrets
import signal
import socket
import socketserver
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import rfc8785

SEND_MODES = (
    "ok",
    "error_5xx",
    "refuse",
    "refuse_retryable",
    "hang_before_effect",
    "hang_after_effect",
    "drop_after_effect",
)
LOOKUP_MODES = ("ok", "error_5xx", "hang", "not_found", "rate_limited")
RETRYABLE_STATUSES = (409, 429)
MAX_BODY_BYTES = 1024 * 1024
MAX_KEY_LENGTH = 255
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
SELECT_EFFECTS = (
    "SELECT seq, id, tool, idempotency_key, args_hash, body, ledger_attempt_id, "
    "ledger_args_hash, source, created_at FROM effects "
)
FILTERED_EFFECTS = (
    SELECT_EFFECTS + "WHERE (:tool IS NULL OR tool = :tool) "
    "AND (:key IS NULL OR idempotency_key = :key) ORDER BY seq"
)
FIRST_EFFECT = SELECT_EFFECTS + "WHERE tool = ? AND idempotency_key = ? ORDER BY seq LIMIT 1"


class RequestError(Exception):
    """A client error answered as JSON ``{"error": {"code", "message"}}``."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# --------------------------------------------------------------------------- canonical JSON


def _reject_duplicate_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise ValueError(f"duplicate member name {name!r}")
        result[name] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse a request body that must be one JSON object (strict: no NaN, no duplicate names)."""
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_reject_duplicate_names,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError("malformed_json", f"body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RequestError("not_an_object", "body must be a JSON object")
    return value


def canonical_json(value: Any) -> str:
    """RFC 8785 (JCS) canonical JSON text of a parsed JSON value."""
    try:
        return rfc8785.dumps(value).decode("utf-8")
    except rfc8785.CanonicalizationError as exc:
        raise RequestError("not_canonicalizable", f"body cannot be canonicalized: {exc}") from exc


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- durable record


@dataclass(frozen=True)
class Effect:
    seq: int
    id: str
    tool: str
    idempotency_key: str
    args_hash: str
    body: str
    ledger_attempt_id: str | None
    ledger_args_hash: str | None
    source: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "idempotency_key": self.idempotency_key,
            "args_hash": self.args_hash,
            "body": self.body,
            "args": json.loads(self.body),
            "ledger_attempt_id": self.ledger_attempt_id,
            "ledger_args_hash": self.ledger_args_hash,
            "source": self.source,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class SendResult:
    outcome: str  # "performed", "replayed" or "conflict"
    effect: Effect


@dataclass(frozen=True)
class NewEffect:
    tool: str
    idempotency_key: str
    body: str
    args_hash: str
    ledger_attempt_id: str | None = None
    ledger_args_hash: str | None = None
    source: str = "send"


SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tool TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    body TEXT NOT NULL,
    ledger_attempt_id TEXT,
    ledger_args_hash TEXT,
    source TEXT NOT NULL DEFAULT 'send',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_tool_key ON effects (tool, idempotency_key, seq);
"""


class EffectStore:
    """The provider's own durable record of effects: one SQLite connection behind a lock."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=30
        )
        self._conn.execute("PRAGMA busy_timeout = 30000")
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"could not switch {path} to WAL mode (got {mode})")
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: committed (and fsynced, synchronous=FULL) before returning."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def record_send(self, new: NewEffect, honour_keys: bool) -> SendResult:
        with self._transaction() as conn:
            if honour_keys:
                first = self._first(conn, new.tool, new.idempotency_key)
                if first is not None:
                    same = first.args_hash == new.args_hash
                    return SendResult("replayed" if same else "conflict", first)
            return SendResult("performed", self._insert(conn, new))

    def inject(self, new: NewEffect) -> Effect:
        with self._transaction() as conn:
            return self._insert(conn, new)

    def lookup(self, tool: str, key: str) -> tuple[Effect | None, int]:
        with self._lock:
            first = self._first(self._conn, tool, key)
            row = self._conn.execute(
                "SELECT COUNT(*) FROM effects WHERE tool = ? AND idempotency_key = ?", (tool, key)
            ).fetchone()
        return first, int(row[0])

    def effects(self, tool: str | None = None, key: str | None = None) -> list[Effect]:
        with self._lock:
            rows = self._conn.execute(FILTERED_EFFECTS, {"tool": tool, "key": key}).fetchall()
        return [Effect(*row) for row in rows]

    @staticmethod
    def _first(conn: sqlite3.Connection, tool: str, key: str) -> Effect | None:
        row = conn.execute(FIRST_EFFECT, (tool, key)).fetchone()
        return Effect(*row) if row else None

    @staticmethod
    def _insert(conn: sqlite3.Connection, new: NewEffect) -> Effect:
        values = (
            "prv_" + secrets.token_hex(12),
            new.tool,
            new.idempotency_key,
            new.args_hash,
            new.body,
            new.ledger_attempt_id,
            new.ledger_args_hash,
            new.source,
            utc_now(),
        )
        cursor = conn.execute(
            "INSERT INTO effects (id, tool, idempotency_key, args_hash, body, ledger_attempt_id, "
            "ledger_args_hash, source, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            values,
        )
        return Effect(int(cursor.lastrowid or 0), *values)


def summarize(effects: list[Effect]) -> dict[str, Any]:
    by_key: dict[str, int] = {}
    for effect in effects:
        by_key[effect.idempotency_key] = by_key.get(effect.idempotency_key, 0) + 1
    duplicates = {key: count for key, count in by_key.items() if count > 1}
    return {"total": len(effects), "by_key": by_key, "duplicates": duplicates}


# --------------------------------------------------------------------------- fault configuration


def _check_bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")


def _check_non_negative(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError("must be a non-negative number")


def _check_rate(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError("must be a number between 0 and 1")


def _check_count(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a non-negative integer")


def _check_message(value: Any) -> None:
    if not isinstance(value, str) or not value.isprintable() or len(value) > 200:
        raise ValueError("must be printable text of at most 200 characters")


def _one_of(choices: tuple[Any, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices or isinstance(value, bool):
            raise ValueError(f"must be one of {', '.join(map(str, choices))}")

    return check


SETTING_CHECKS: dict[str, Callable[[Any], None]] = {
    "honour_keys": _check_bool,
    "latency_ms": _check_non_negative,
    "lookup_latency_ms": _check_non_negative,
    "hang_seconds": _check_non_negative,
    "retry_after_seconds": _check_count,
    "send_mode": _one_of(SEND_MODES),
    "lookup_mode": _one_of(LOOKUP_MODES),
    "send_fault_rate": _check_rate,
    "lookup_fault_rate": _check_rate,
    "remaining_faults": _check_count,
    "retryable_status": _one_of(RETRYABLE_STATUSES),
    "outage_message": _check_message,
}


def default_settings(honour_keys: bool, latency_ms: float) -> dict[str, Any]:
    return {
        "honour_keys": honour_keys,
        "latency_ms": latency_ms,
        "lookup_latency_ms": None,
        "hang_seconds": 30.0,
        "retry_after_seconds": 1,
        "send_mode": "ok",
        "lookup_mode": "ok",
        "send_fault_rate": None,
        "lookup_fault_rate": None,
        "remaining_faults": None,
        "retryable_status": 429,
        "outage_message": None,
    }


def validate_settings(settings: Any, where: str) -> dict[str, Any]:
    if not isinstance(settings, dict):
        raise RequestError("invalid_control", f"{where} must be a JSON object")
    for name, value in settings.items():
        check = SETTING_CHECKS.get(name)
        if check is None:
            raise RequestError("invalid_control", f"unknown control key {where}{name!r}")
        if value is None:
            continue
        try:
            check(value)
        except ValueError as exc:
            raise RequestError("invalid_control", f"{where}{name!r} {exc}") from exc
    return settings


def validate_patch(patch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a control patch into (global settings, per-tool overrides), validated."""
    if not isinstance(patch, dict):
        raise RequestError("invalid_control", "control patch must be a JSON object")
    global_part = {name: value for name, value in patch.items() if name != "tools"}
    validate_settings(global_part, "")
    tools = patch.get("tools") or {}
    if not isinstance(tools, dict):
        raise RequestError("invalid_control", "'tools' must be a JSON object")
    for tool, overrides in tools.items():
        if overrides is not None:
            validate_settings(overrides, f"tools.{tool}.")
    return global_part, tools


@dataclass(frozen=True)
class SendPlan:
    mode: str
    honour_keys: bool
    latency_s: float
    hang_s: float
    retryable_status: int
    message: str = ""


@dataclass(frozen=True)
class LookupPlan:
    mode: str
    latency_s: float
    hang_s: float
    message: str = ""
    retry_after_s: int = 1


class FaultConfig:
    """Run-time fault switches: global settings plus per-tool overrides, guarded by a lock."""

    def __init__(self, honour_keys: bool, latency_ms: float, seed: int | None) -> None:
        self._lock = threading.Lock()
        self._defaults = default_settings(honour_keys, latency_ms)
        self._seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.reset()

    def reset(self) -> dict[str, Any]:
        with self._lock:
            self._global = dict(self._defaults)
            self._tools: dict[str, dict[str, Any]] = {}
            self._rng = random.Random(self._seed)
            return self._snapshot()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        tools = {tool: dict(overrides) for tool, overrides in self._tools.items()}
        return {**self._global, "seed": self._seed, "tools": tools}

    def update(self, patch: Any) -> dict[str, Any]:
        global_part, tools = validate_patch(patch)
        with self._lock:
            for name, value in global_part.items():
                self._global[name] = self._defaults[name] if value is None else value
            for tool, overrides in tools.items():
                self._merge_tool(tool, overrides)
            return self._snapshot()

    def _merge_tool(self, tool: str, overrides: dict[str, Any] | None) -> None:
        if overrides is None:
            self._tools.pop(tool, None)
            return
        merged = dict(self._tools.get(tool, {}))
        for name, value in overrides.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        if merged:
            self._tools[tool] = merged
        else:
            self._tools.pop(tool, None)

    def _scope(self, tool: str, name: str) -> dict[str, Any]:
        overrides = self._tools.get(tool, {})
        return overrides if name in overrides else self._global

    def _get(self, tool: str, name: str) -> Any:
        return self._scope(tool, name)[name]

    def _draw(self, tool: str, mode_name: str, rate_name: str) -> str:
        """The mode to apply to this request: the configured one, or ``ok`` if the dice say so."""
        mode = self._get(tool, mode_name)
        if mode == "ok":
            return "ok"
        rate = self._get(tool, rate_name)
        if rate is not None and rate < 1 and self._rng.random() >= rate:
            return "ok"
        scope = self._scope(tool, "remaining_faults")
        remaining = scope["remaining_faults"]
        if remaining is not None:
            if remaining <= 0:
                return "ok"
            scope["remaining_faults"] = remaining - 1
        return mode

    def plan_send(self, tool: str) -> SendPlan:
        with self._lock:
            return SendPlan(
                mode=self._draw(tool, "send_mode", "send_fault_rate"),
                honour_keys=bool(self._get(tool, "honour_keys")),
                latency_s=float(self._get(tool, "latency_ms")) / 1000,
                hang_s=float(self._get(tool, "hang_seconds")),
                retryable_status=int(self._get(tool, "retryable_status")),
                message=self._get(tool, "outage_message") or "",
            )

    def plan_lookup(self, tool: str) -> LookupPlan:
        with self._lock:
            latency = self._get(tool, "lookup_latency_ms")
            if latency is None:
                latency = self._get(tool, "latency_ms")
            return LookupPlan(
                mode=self._draw(tool, "lookup_mode", "lookup_fault_rate"),
                latency_s=float(latency) / 1000,
                hang_s=float(self._get(tool, "hang_seconds")),
                message=self._get(tool, "outage_message") or "",
                retry_after_s=int(self._get(tool, "retry_after_seconds")),
            )


# --------------------------------------------------------------------------- HTTP


class Dropped(Exception):
    """Raised by a handler to close the connection without writing any HTTP answer."""


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        store: EffectStore,
        faults: FaultConfig,
        access_log: bool = False,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.store = store
        self.faults = faults
        self.access_log = access_log
        self.stopping = threading.Event()
        self._calls_lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        super().__init__(address, ProviderHandler)

    def call_started(self) -> None:
        with self._calls_lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def call_finished(self) -> None:
        with self._calls_lock:
            self.in_flight -= 1

    def stats(self, *, new_peak: bool = False) -> dict[str, int]:
        with self._calls_lock:
            out = {"in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight}
            if new_peak:
                self.peak_in_flight = self.in_flight
            return out

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn); loopback needs none.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def pause(self, seconds: float) -> None:
        """Sleep without blocking other requests; cut short when the server stops."""
        if seconds > 0:
            self.stopping.wait(seconds)


Answer = tuple[int, Any]


class ProviderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ledgerweb-demo-provider/1"
    timeout = 120  # idle keep-alive connections are closed after this many seconds
    server: ProviderServer

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            super().log_message(format, *args)

    # -- plumbing

    def _handle(self, method: str) -> None:
        try:
            body = self._read_body()
            status, payload, headers = self._route(method, body)
        except Dropped:
            self._drop_connection()
            return
        except RequestError as exc:
            status, headers = exc.status, {}
            payload = {"error": {"code": exc.code, "message": exc.message}}
        except Exception as exc:  # noqa: BLE001 - never answer a client with a traceback page
            traceback.print_exc(file=sys.stderr)
            status, headers = 500, {}
            payload = {"error": {"code": "internal", "message": str(exc)}}
        self._write_json(status, payload, headers)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise RequestError("length_required", "send a Content-Length body", 411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError as exc:
            self.close_connection = True
            raise RequestError("bad_length", "invalid Content-Length") from exc
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError("too_large", f"body over {MAX_BODY_BYTES} bytes", 413)
        return self.rfile.read(length) if length else b""

    def _write_json(self, status: int, payload: Any, headers: dict[str, str]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away (timed out during a hang, ...)
            self.close_connection = True

    def _drop_connection(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _route(self, method: str, body: bytes) -> tuple[int, Any, dict[str, str]]:
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        parts = [part for part in url.path.split("/") if part]
        if len(parts) == 3 and parts[0] == "tools" and parts[2] in ("send", "lookup"):
            tool = parts[1]
            if not TOOL_NAME.match(tool):
                raise RequestError("bad_tool", f"invalid tool name {tool!r}", 404)
            self._require(method, "POST" if parts[2] == "send" else "GET")
            self.server.call_started()
            try:
                if parts[2] == "send":
                    return self._send(tool, body)
                return self._lookup(tool, query)
            finally:
                self.server.call_finished()
        handler = STATIC_ROUTES.get((method, "/" + "/".join(parts)))
        if handler is None:
            known = any(path == "/" + "/".join(parts) for _, path in STATIC_ROUTES)
            if known:
                raise RequestError("method_not_allowed", f"{method} not allowed here", 405)
            raise RequestError("no_route", f"no such endpoint {url.path}", 404)
        return (*handler(self, query, body), {})

    @staticmethod
    def _require(method: str, expected: str) -> None:
        if method != expected:
            raise RequestError("method_not_allowed", f"use {expected}", 405)

    # -- tools

    def _wire_key(self, value: str) -> str:
        """The exact key: percent-decoded when ``Idempotency-Key-Encoding: percent`` says the
        ledger encoded it (a key outside printable ASCII, or with ``%``)."""
        encoding = (self.headers.get("Idempotency-Key-Encoding") or "").strip().lower()
        if not encoding:
            return value
        if encoding != "percent":
            raise RequestError("bad_idempotency_key", f"unknown key encoding {encoding!r}")
        try:
            return unquote(value, errors="strict")
        except UnicodeDecodeError:
            raise RequestError(
                "bad_idempotency_key", "the key is not percent-encoded UTF-8"
            ) from None

    def _send(self, tool: str, body: bytes) -> tuple[int, Any, dict[str, str]]:
        key = self._wire_key((self.headers.get("Idempotency-Key") or "").strip())
        if not key:
            raise RequestError("missing_idempotency_key", "the Idempotency-Key header is required")
        if len(key) > MAX_KEY_LENGTH:
            raise RequestError("bad_idempotency_key", f"key longer than {MAX_KEY_LENGTH}")
        text = canonical_json(parse_json_object(body))
        new = NewEffect(
            tool=tool,
            idempotency_key=key,
            body=text,
            args_hash=sha256_hex(text),
            ledger_attempt_id=self.headers.get("X-Ledger-Attempt-Id"),
            ledger_args_hash=self.headers.get("X-Ledger-Args-Hash"),
        )
        plan = self.server.faults.plan_send(tool)
        self.server.pause(plan.latency_s)
        refusal = refusal_answer(plan)
        if refusal is not None:
            return (*refusal, {})
        if plan.mode == "hang_before_effect":
            self.server.pause(plan.hang_s)
            raise Dropped
        result = self.server.store.record_send(new, plan.honour_keys)
        if plan.mode == "drop_after_effect":
            raise Dropped
        if plan.mode == "hang_after_effect":
            self.server.pause(plan.hang_s)
        return send_answer(result)

    def _lookup(self, tool: str, query: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        key = self._wire_key(query.get("idempotency_key") or query.get("correlation") or "")
        if not key:
            raise RequestError("missing_key", "pass ?idempotency_key= (or ?correlation=)")
        plan = self.server.faults.plan_lookup(tool)
        self.server.pause(plan.latency_s)
        if plan.mode == "hang":
            self.server.pause(plan.hang_s)
            return 503, unavailable(plan.message), {}
        if plan.mode == "error_5xx":
            return 503, unavailable(plan.message), {}
        if plan.mode == "rate_limited":
            limited = {"error": {"code": "rate_limited", "message": "slow down", "retryable": True}}
            return 429, limited, {"Retry-After": str(plan.retry_after_s)}
        first, count = self.server.store.lookup(tool, key)
        if plan.mode == "not_found" or first is None:
            return 404, {"error": "not_found"}, {}
        return (
            200,
            {
                "id": first.id,
                "tool": first.tool,
                "idempotency_key": first.idempotency_key,
                "args_hash": first.args_hash,
                "created_at": first.created_at,
                "count": count,
            },
            {},
        )

    # -- inspection and control

    def _get_stats(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, self.server.stats()

    def _new_peak(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, self.server.stats(new_peak=True)

    def _healthz(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, {"status": "ok"}

    def _effects(self, query: dict[str, str], body: bytes) -> Answer:
        key = query.get("idempotency_key") or query.get("correlation")
        effects = self.server.store.effects(query.get("tool"), key)
        return 200, [effect.to_json() for effect in effects]

    def _summary(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, summarize(self.server.store.effects(query.get("tool")))

    def _get_control(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, self.server.faults.snapshot()

    def _post_control(self, query: dict[str, str], body: bytes) -> Answer:
        patch = parse_json_object(body) if body.strip() else {}
        return 200, self.server.faults.update(patch)

    def _reset_control(self, query: dict[str, str], body: bytes) -> Answer:
        return 200, self.server.faults.reset()

    def _inject_effect(self, query: dict[str, str], body: bytes) -> Answer:
        request = parse_json_object(body)
        tool, key, args = request.get("tool"), request.get("idempotency_key"), request.get("args")
        if not isinstance(tool, str) or not TOOL_NAME.match(tool):
            raise RequestError("invalid_effect", "'tool' must be a valid tool name")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise RequestError("invalid_effect", "'idempotency_key' must be a non-empty string")
        if not isinstance(args, dict):
            raise RequestError("invalid_effect", "'args' must be a JSON object")
        text = canonical_json(args)
        attempt = request.get("ledger_attempt_id")
        new = NewEffect(
            tool=tool,
            idempotency_key=key,
            body=text,
            args_hash=sha256_hex(text),
            ledger_attempt_id=attempt if isinstance(attempt, str) else None,
            source="injected",
        )
        return 201, self.server.store.inject(new).to_json()


STATIC_ROUTES: dict[tuple[str, str], Callable[[ProviderHandler, dict[str, str], bytes], Answer]] = {
    ("GET", "/healthz"): ProviderHandler._healthz,
    ("GET", "/effects"): ProviderHandler._effects,
    ("GET", "/effects/summary"): ProviderHandler._summary,
    ("GET", "/_control"): ProviderHandler._get_control,
    ("POST", "/_control"): ProviderHandler._post_control,
    ("POST", "/_control/reset"): ProviderHandler._reset_control,
    ("POST", "/_control/effects"): ProviderHandler._inject_effect,
    ("GET", "/_stats"): ProviderHandler._get_stats,
    ("POST", "/_stats"): ProviderHandler._new_peak,
}


def unavailable(message: str = "") -> dict[str, Any]:
    return {
        "error": {
            "code": "unavailable",
            "message": message or "try again later",
            "retryable": True,
        }
    }


def refusal_answer(plan: SendPlan) -> Answer | None:
    """The answer of a send fault that performs nothing, or None if the send goes ahead."""
    if plan.mode == "error_5xx":
        return 503, unavailable(plan.message)
    if plan.mode == "refuse":
        message = "the provider refused this request for good"
        return 400, {"error": {"code": "refused", "message": message, "retryable": False}}
    if plan.mode == "refuse_retryable":
        message = "the provider did not perform this request; retry later with the same key"
        return plan.retryable_status, {
            "error": {"code": "retry_later", "message": message, "retryable": True}
        }
    return None


def send_answer(result: SendResult) -> tuple[int, Any, dict[str, str]]:
    effect = result.effect
    if result.outcome == "conflict":
        message = "idempotency key already used with a different payload"
        return (
            422,
            {
                "error": {
                    "code": "idempotency_key_reused",
                    "message": message,
                    "id": effect.id,
                    "args_hash": effect.args_hash,
                }
            },
            {},
        )
    replayed = result.outcome == "replayed"
    payload = {
        "id": effect.id,
        "args_hash": effect.args_hash,
        "status": "performed",
        "replayed": replayed,
        "idempotency_key": effect.idempotency_key,
        "created_at": effect.created_at,
    }
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return (200 if replayed else 201), payload, headers


# --------------------------------------------------------------------------- command line


def loopback_host(value: str) -> str:
    if value == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an IP address; use a loopback address such as 127.0.0.1"
        ) from None
    if not address.is_loopback:
        raise argparse.ArgumentTypeError(
            f"refusing to listen on non-loopback address {value!r}: the demo provider is a test "
            "fixture with no authentication; use 127.0.0.1 or ::1"
        )
    return str(address)


def port_number(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("port must be between 0 and 65535")
    return port


def non_negative(value: str) -> float:
    number = float(value)
    if number < 0 or number != number:
        raise argparse.ArgumentTypeError("must be a non-negative number")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reconciliation.demo_provider",
        description="Fake external side-effect provider for ledger reconciliation and crash "
        "tests (loopback only). See the module docstring for the HTTP protocol.",
    )
    parser.add_argument("--host", type=loopback_host, default="127.0.0.1", help="loopback only")
    parser.add_argument("--port", type=port_number, default=8765, help="0 picks a free port")
    parser.add_argument("--db", required=True, help="SQLite file holding the durable effects")
    parser.add_argument("--port-file", help="write the bound port here (atomically) once bound")
    parser.add_argument("--seed", type=int, help="seed for the fault-rate random generator")
    parser.add_argument(
        "--latency-ms", type=non_negative, default=0.0, help="default delay of send and lookup"
    )
    parser.add_argument(
        "--honour-keys",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="default for tools: replay sends with a known Idempotency-Key (default: yes)",
    )
    parser.add_argument("--access-log", action="store_true", help="log requests to stderr")
    return parser


def write_port_file(path: str, port: int) -> None:
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(f"{port}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def wait_for_port_file(
    path: Path, process: subprocess.Popen[bytes], *, seconds: float, poll: float = 0.02
) -> int | None:
    """The port a child ``process`` wrote to ``path`` once it was listening (as
    ``write_port_file`` does); None when it exited or ``seconds`` passed first, and then it is
    killed: a child that never said where it listens is of no use."""
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return None
        time.sleep(poll)
    return int(path.read_text().strip())


def display_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    store = EffectStore(options.db)
    faults = FaultConfig(options.honour_keys, options.latency_ms, options.seed)
    server = ProviderServer((options.host, options.port), store, faults, options.access_log)
    host, port = server.server_address[:2]

    def request_stop(signum: int, frame: Any) -> None:
        server.stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(f"demo provider listening on {display_url(str(host), int(port))}", flush=True)
    if options.port_file:  # written last: once it exists, the provider is fully started
        write_port_file(options.port_file, int(port))
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    serving.daemon = True
    serving.start()
    while not server.stopping.wait(0.2) and serving.is_alive():
        pass
    server.stopping.set()
    server.shutdown()
    server.server_close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
