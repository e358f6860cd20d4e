"""A provider process that misbehaves on purpose, for the bulkhead and validation tests and
bench/providers.py: ``python -m tests.reconciliation.bad_provider MODE --port-file F``.

Modes (every request, send or lookup alike):

- ``trickle``: ``200`` with ``Content-Length: 200``, then one byte a second;
- ``trickle_close``: the same with ``Connection: close``;
- ``trickle_http10``: an ``HTTP/1.0 200`` answer with ``Content-Length: 200``, one byte a second;
- ``trickle_closedelim``: ``200`` with ``Connection: close`` and no length (the body ends when
  the connection closes), one byte a second;
- ``trickle_chunked``: ``200`` chunked, a one-byte chunk a second;
- ``blackhole``: reads the request and never answers;
- ``slow_headers``: the status line and headers one byte a second;
- ``huge``: ``200`` announcing and streaming a 30 MB JSON body;
- ``huge_chunked``: the same without ``Content-Length`` (chunked), so only the bytes read tell;
- ``ratelimit``: ``429`` with ``Retry-After: 30``;
- ``bad_id_newline`` / ``bad_id_nul`` / ``bad_id_long``: a found lookup (and an accepted send)
  whose ``id`` is ``"a\\nb\\u202e<script>"``, ``"a\\u0000b"`` or 100,000 characters;
- ``bad_encoding``: a found lookup whose body is not UTF-8.

Each request is counted: ``GET /_hits`` answers the count (in every mode, before misbehaving).
"""

from __future__ import annotations

import argparse
import json
import socketserver
import threading
import time
from pathlib import Path

BAD_IDS = {
    "bad_id_newline": "a\nb\u202e<script>",
    "bad_id_nul": "a\u0000b",
    "bad_id_long": "x" * 100_000,
}
HUGE_BYTES = 30 * 1024 * 1024
_JSON = b"Content-Type: application/json\r\n"
# The trickles, by framing: (status line and headers, what is sent every second after them).
TRICKLES = {
    "trickle": (b"HTTP/1.1 200 OK\r\n" + _JSON + b"Content-Length: 200\r\n\r\n", b" "),
    "trickle_close": (
        b"HTTP/1.1 200 OK\r\n" + _JSON + b"Content-Length: 200\r\nConnection: close\r\n\r\n",
        b" ",
    ),
    "trickle_http10": (b"HTTP/1.0 200 OK\r\n" + _JSON + b"Content-Length: 200\r\n\r\n", b" "),
    "trickle_closedelim": (b"HTTP/1.1 200 OK\r\n" + _JSON + b"Connection: close\r\n\r\n", b" "),
    "trickle_chunked": (
        b"HTTP/1.1 200 OK\r\n" + _JSON + b"Transfer-Encoding: chunked\r\n\r\n",
        b"1\r\n \r\n",
    ),
}


class _State:
    hits = 0
    lock = threading.Lock()
    mode = "trickle"
    stopping = threading.Event()


def _read_request(rfile) -> tuple[str, dict[str, str]]:
    request_line = rfile.readline(65537).decode("latin-1").strip()
    headers = {}
    while True:
        line = rfile.readline(65537)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    if length:
        rfile.read(length)
    return request_line, headers


def _answer(wfile, status: str, body: bytes, extra: str = "") -> None:
    wfile.write(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n".encode()
        + body
    )


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            self._handle()
        except OSError:
            pass  # the client gave up: that is the point

    def _handle(self) -> None:
        request_line, _ = _read_request(self.rfile)
        if request_line.startswith("GET /_hits"):
            _answer(self.wfile, "200 OK", json.dumps({"hits": _State.hits}).encode())
            return
        with _State.lock:
            _State.hits += 1
        mode = _State.mode
        if mode in TRICKLES:
            head, piece = TRICKLES[mode]
            self.wfile.write(head)
            self.wfile.flush()
            for _ in range(200):
                if _State.stopping.wait(1.0):
                    return
                self.wfile.write(piece)
                self.wfile.flush()
        elif mode == "blackhole":
            _State.stopping.wait(3600)
        elif mode == "slow_headers":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: 1\r\n":
                if _State.stopping.wait(1.0):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        elif mode in ("huge", "huge_chunked"):
            chunked = mode == "huge_chunked"
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += (
                "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {HUGE_BYTES}\r\n"
            )
            self.wfile.write((head + "\r\n").encode())
            block = b" " * 65536
            for _ in range(HUGE_BYTES // len(block)):
                if _State.stopping.is_set():
                    return
                self.wfile.write(b"10000\r\n" + block + b"\r\n" if chunked else block)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        elif mode == "ratelimit":
            body = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}})
            _answer(self.wfile, "429 Too Many Requests", body.encode(), "Retry-After: 30\r\n")
        elif mode == "bad_encoding":
            _answer(
                self.wfile, "200 OK", b'{"id": "pi_\xff\xfe", "args_hash": "' + b"0" * 64 + b'"}'
            )
        elif mode in BAD_IDS:
            found = {"id": BAD_IDS[mode], "args_hash": "0" * 64}
            _answer(self.wfile, "200 OK", json.dumps(found).encode())
        else:
            _answer(self.wfile, "500 Internal Server Error", b"{}")


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode")
    parser.add_argument("--port-file", type=Path, required=True)
    options = parser.parse_args()
    _State.mode = options.mode
    server = Server(("127.0.0.1", 0), Handler)
    tmp = options.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(options.port_file)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        _State.stopping.set()


if __name__ == "__main__":
    time.sleep(0)
    main()
