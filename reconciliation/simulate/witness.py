"""An in-process C2SP tlog-witness on 127.0.0.1 that the simulation can take down or make lie.

It keeps the newest tree it cosigned in memory (each history starts it afresh) and answers
``POST /add-checkpoint`` as the spec says (409 with ``text/x.tlog.size`` when the old size is
not the one it holds, 422 for a proof that does not verify). Modes: ``up``; ``down`` (closes the
connection without an answer); ``lying`` (a 409 whose unauthenticated body claims a size far
larger than the log); ``bad_signature`` (a 200 whose cosignature no configured key made).
"""

from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attempts.verify_export import (
    ALG_COSIGNATURE_V1,
    LogCheckpoint,
    NoteError,
    VerifierKey,
    consistent,
    key_id,
    note_signed_by,
    split_note,
)

WITNESS_MODES = ("up", "down", "lying", "bad_signature")


class SimWitness:
    """One witness: its key, what it holds, how it behaves, and its HTTP server thread."""

    def __init__(self, name: str, origin: str) -> None:
        self.name = name
        self.origin = origin
        self.log_keys: list[VerifierKey] = []
        self.mode = "up"
        self._lock = threading.Lock()
        self._key = Ed25519PrivateKey.generate()
        self._impostor = Ed25519PrivateKey.generate()
        public = self._key.public_key().public_bytes_raw()
        self.verifier = VerifierKey(
            name, key_id(name, ALG_COSIGNATURE_V1, public), ALG_COSIGNATURE_V1, public
        )
        self.size = 0
        self.root = b""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> str:
        witness = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode("utf-8", errors="replace")
                if witness.mode == "down":
                    self.close_connection = True
                    return  # no status line: the caller's connection just ends
                status, kind, answer = witness.add_checkpoint(body)
                data = answer.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sim-witness", daemon=True
        )
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def reset(self, log_key: VerifierKey) -> None:
        """A new history: a new log to witness, nothing held."""
        with self._lock:
            self.log_keys = [log_key]
            self.size, self.root, self.mode = 0, b"", "up"

    def trust(self, log_key: VerifierKey) -> None:
        """The log rotated its key and told its witnesses."""
        with self._lock:
            self.log_keys.append(log_key)

    # -- the protocol ---------------------------------------------------------------------------

    def add_checkpoint(self, body: str) -> tuple[int, str, str]:
        head, sep, note = body.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old ") or not lines[0][4:].isdigit():
            return 400, "text/plain", "malformed request\n"
        old = int(lines[0][4:])
        try:
            proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
            text, signatures = split_note(note)
            checkpoint = LogCheckpoint.parse(text)
        except (NoteError, ValueError) as exc:
            return 400, "text/plain", f"malformed checkpoint: {exc}\n"
        if checkpoint.origin != self.origin:
            return 404, "text/plain", "unknown log\n"
        if not any(note_signed_by(text, s, k) for s in signatures for k in self.log_keys):
            return 403, "text/plain", "no valid signature from the log's key\n"
        if self.mode == "lying":
            return 409, "text/x.tlog.size", f"{checkpoint.size + 1_000_000}\n"
        with self._lock:
            if old != self.size:
                return 409, "text/x.tlog.size", f"{self.size}\n"
            if old == checkpoint.size and self.root and self.root != checkpoint.root:
                return 409, "text/plain", "same size, different root: a fork\n"
            if old and not consistent(old, self.root, checkpoint.size, checkpoint.root, proof):
                return 422, "text/plain", "the consistency proof does not verify\n"
            self.size, self.root = checkpoint.size, checkpoint.root
        key = self._impostor if self.mode == "bad_signature" else self._key
        stamp = int(time.time())
        signature = key.sign(f"cosignature/v1\ntime {stamp}\n{text}".encode())
        raw = self.verifier.id + stamp.to_bytes(8, "big") + signature
        return 200, "text/plain", f"\u2014 {self.name} {base64.b64encode(raw).decode()}\n"
