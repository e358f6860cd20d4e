"""A small C2SP tlog-witness on 127.0.0.1: the one the simulation runs in its process (and can
take down or make lie), and the one the tests run as a process of its own
(``python -m reconciliation.simulate.witness``).

It knows one log (origin and verifier keys), holds the newest tree it cosigned (in memory, or
also in a file in ``--state`` so a restarted witness remembers it) and answers
``POST /add-checkpoint`` as the spec says: 404 unknown origin, 403 no valid signature of the
log's key, 400 an old size above the checkpoint's, 409 an old size that is not the one it holds
(with ``text/x.tlog.size``), 409 a different root at the same size, 422 a consistency proof that
does not verify; it cosigns with a timestamped Ed25519 cosignature/v1 (C2SP tlog-cosignature).

Modes: ``up``; ``down`` (closes the connection without an answer); ``lying`` (a 409 whose
unauthenticated body claims a size far larger than the log); ``bad_signature`` (a 200 whose
cosignature no configured key made). ``lie_once``: the first answer is a 409 claiming that size.
It needs ``cryptography`` and the standalone ``attempts/verify_export.py``, not Django.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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


class Witness:
    """One witness: its key, what it holds, how it behaves, and its HTTP server thread."""

    def __init__(
        self,
        name: str,
        origin: str,
        *,
        log_keys: list[VerifierKey] | None = None,
        state: Path | None = None,
        lie_once: int = 0,
    ) -> None:
        self.name = name
        self.origin = origin
        self.log_keys: list[VerifierKey] = list(log_keys or [])
        self.mode = "up"
        self.lie_once = lie_once
        self.state = state
        self._lock = threading.Lock()
        self._key = _key(state)
        self._impostor = Ed25519PrivateKey.generate()
        public = self._key.public_key().public_bytes_raw()
        self.verifier = VerifierKey(
            name, key_id(name, ALG_COSIGNATURE_V1, public), ALG_COSIGNATURE_V1, public
        )
        self.size, self.root = _held(state)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1 (``port`` 0: a free one) in a thread; returns the URL."""
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="witness", daemon=True
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
        """(status, content type, body) for one add-checkpoint request."""
        if self.lie_once:
            lie, self.lie_once = self.lie_once, 0
            return 409, "text/x.tlog.size", f"{lie}\n"
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
        if old > checkpoint.size:
            return 400, "text/plain", "old size is larger than the checkpoint\n"
        with self._lock:  # checking the old size and holding the new one are one step
            refused = self._refused(old, checkpoint, proof)
            if refused is not None:
                return refused
            self._hold(checkpoint.size, checkpoint.root)
        return 200, "text/plain", self._cosign(text)

    def _refused(
        self, old: int, checkpoint: LogCheckpoint, proof: list[bytes]
    ) -> tuple[int, str, str] | None:
        if old != self.size:
            return 409, "text/x.tlog.size", f"{self.size}\n"
        if old == checkpoint.size and self.root and self.root != checkpoint.root:
            return 409, "text/plain", "same size, different root: a fork\n"
        if old and not consistent(old, self.root, checkpoint.size, checkpoint.root, proof):
            return 422, "text/plain", "the consistency proof does not verify\n"
        if not old and proof:
            return 422, "text/plain", "a proof from size 0 must be empty\n"
        return None

    def _hold(self, size: int, root: bytes) -> None:
        self.size, self.root = size, root
        if self.state is not None:
            temporary = self.state / "latest.json.tmp"
            held = {"size": size, "root": base64.b64encode(root).decode()}
            temporary.write_text(json.dumps(held))
            os.replace(temporary, self.state / "latest.json")

    def _cosign(self, text: str) -> str:
        key = self._impostor if self.mode == "bad_signature" else self._key
        stamp = int(time.time())
        signature = key.sign(f"cosignature/v1\ntime {stamp}\n{text}".encode())
        raw = self.verifier.id + stamp.to_bytes(8, "big") + signature
        return f"\u2014 {self.name} {base64.b64encode(raw).decode()}\n"


def _key(state: Path | None) -> Ed25519PrivateKey:
    """A new key, or the one kept in ``state`` (made there the first time)."""
    if state is None:
        return Ed25519PrivateKey.generate()
    key_file = state / "witness.key"
    if not key_file.exists():
        key_file.write_bytes(Ed25519PrivateKey.generate().private_bytes_raw())
        key_file.chmod(0o600)
    return Ed25519PrivateKey.from_private_bytes(key_file.read_bytes())


def _held(state: Path | None) -> tuple[int, bytes]:
    """The newest tree a witness with ``state`` cosigned before it (re)started."""
    path = state / "latest.json" if state is not None else None
    if path is None or not path.exists():
        return 0, b""
    data = json.loads(path.read_text())
    return data["size"], base64.b64decode(data["root"])


def _handler(witness: Witness) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 -- http.server's name
            if self.path.rstrip("/") != "/add-checkpoint":
                self.send_error(404)
                return
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

    return Handler


def main() -> None:
    """Run one witness until killed; prints ``witness-key <VKEY>`` once it listens."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--origin", required=True)
    parser.add_argument("--log-key", required=True)
    parser.add_argument(
        "--lie-once", type=int, default=0, metavar="SIZE",
        help="answer the first request with a 409 claiming a tree of SIZE leaves",
    )  # fmt: skip
    args = parser.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    witness = Witness(
        args.name,
        args.origin,
        log_keys=[VerifierKey.parse(args.log_key)],
        state=args.state,
        lie_once=args.lie_once,
    )
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(witness))
    print(f"witness-key {witness.verifier}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
