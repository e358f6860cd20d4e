"""Real receivers for notification tests: an SMTP server (aiosmtpd) and a chat webhook (an
HTTP server), both on 127.0.0.1, recording what arrived by notice id."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MailSink:
    """An SMTP server. ``hold_next()`` makes the next DATA wait until ``release(accept)``:
    a sender killed meanwhile never had its message accepted (``accept=False`` answers 451)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[dict[str, str]] = []
        self._hold = threading.Event()
        self.holding = threading.Event()
        self._release = threading.Event()
        self._accept = True
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        import asyncio

        if self._hold.is_set():
            self._hold.clear()
            self.holding.set()
            while not self._release.is_set():
                await asyncio.sleep(0.02)
            self._release.clear()
            if not self._accept:
                return "451 4.3.0 not accepted, try again"
        message = message_from_bytes(envelope.content)
        self.messages.append(
            {
                "to": ",".join(envelope.rcpt_tos),
                "subject": str(message["Subject"]),
                "notice": str(message["X-Ledgerweb-Notice"]),
                "message_id": str(message["Message-ID"]),
            }
        )
        return "250 OK"

    def hold_next(self) -> None:
        self._hold.set()

    def release(self, *, accept: bool) -> None:
        self._accept = accept
        self._release.set()

    def counts(self) -> Counter:
        return Counter(m["notice"] for m in self.messages)

    def __enter__(self) -> MailSink:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self.controller.stop()


class Webhook:
    """A chat webhook receiver answering 200, recording each JSON body by notice id."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                body["_header"] = self.headers.get("X-Ledgerweb-Notice", "")
                sink.posts.append(body)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def counts(self) -> Counter:
        return Counter(p["notice_id"] for p in self.posts)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
