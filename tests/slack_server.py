"""A Slack stand-in for the Slack approvals tests: an HTTP server on 127.0.0.1 that speaks the
Web API methods the ledger calls (chat.postMessage, chat.update, chat.postEphemeral,
users.info) and records them, and a signer that sends interaction payloads as Slack signs them
(``v0=`` HMAC-SHA256 of ``v0:<timestamp>:<body>`` with the app's signing secret)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeSlack:
    """``users`` maps Slack user ids to their users.info ``user`` object. ``down`` makes every
    method answer 503 (Slack unreachable as far as the client can tell)."""

    def __init__(self, users: dict[str, dict[str, Any]]) -> None:
        self.users = users
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[str, dict[str, Any]] = {}  # ts -> the message as last posted
        self.down = False
        # Answer a byte at a time, each within any per-read timeout, all far past a deadline.
        self.drip = False
        self._lock = threading.Lock()
        self._next_ts = 1000
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not fake.drip:
                    self.wfile.write(data)
                    return
                for byte in data[:20]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.3)

            def _handle(self, args: dict[str, Any]) -> None:
                method = self.path.split("?")[0].removeprefix("/api/")
                if self.headers.get("Authorization") != "Bearer xoxb-test":
                    return self._answer(200, {"ok": False, "error": "invalid_auth"})
                if fake.down:
                    return self._answer(503, {"ok": False, "error": "service_unavailable"})
                self._answer(200, fake.call(method, args))

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                query = urllib.parse.urlsplit(self.path).query
                self._handle({k: v[0] for k, v in urllib.parse.parse_qs(query).items()})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    args = json.loads(raw or "{}")
                else:
                    args = {k: v[0] for k, v in urllib.parse.parse_qs(raw).items()}
                self._handle(args)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def call(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls.append((method, args))
            if method == "chat.postMessage":
                self._next_ts += 1
                ts = f"{self._next_ts}.000100"
                self.messages[ts] = {**args, "ts": ts}
                return {"ok": True, "channel": args["channel"], "ts": ts}
            if method == "chat.update":
                if args.get("ts") not in self.messages:
                    return {"ok": False, "error": "message_not_found"}
                self.messages[args["ts"]] = {**args}
                return {"ok": True, "channel": args["channel"], "ts": args["ts"]}
            if method == "chat.postEphemeral":
                return {"ok": True, "message_ts": "1.0"}
            if method == "users.info":
                user = self.users.get(args.get("user", ""))
                if user is None:
                    return {"ok": False, "error": "user_not_found"}
                return {"ok": True, "user": user}
            return {"ok": False, "error": "unknown_method"}

    def named(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [args for name, args in self.calls if name == method]

    def __enter__(self) -> FakeSlack:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def slack_user(user_id: str, email: str, *, confirmed: bool = True) -> dict[str, Any]:
    return {
        "id": user_id,
        "team_id": "T0LEDGER",
        "deleted": False,
        "is_bot": False,
        "is_email_confirmed": confirmed,
        "profile": {"email": email},
    }


def click_body(
    user_id: str, action_id: str, value: str, *, channel: str = "C0APPROVE", action_ts: str = ""
) -> bytes:
    """The form body Slack posts when ``user_id`` clicks a button of the message."""
    payload = {
        "type": "block_actions",
        "team": {"id": "T0LEDGER", "domain": "ledger"},
        "user": {"id": user_id, "team_id": "T0LEDGER"},
        "api_app_id": "A0LEDGER",
        "channel": {"id": channel},
        "container": {"type": "message", "channel_id": channel},
        "response_url": "https://hooks.slack.invalid/actions/T0LEDGER/1/x",
        "actions": [
            {
                "type": "button",
                "block_id": "ledger",
                "action_id": action_id,
                "value": value,
                "action_ts": action_ts or f"{time.time():.6f}",
            }
        ],
    }
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: bytes, secret: str, *, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack sends with ``body``."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + stamp.encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
