"""A small C2SP tlog-witness, run in its own process by the tests: it knows one log (origin and
verifier key), keeps the newest checkpoint it cosigned in a file on disk, and answers
``POST /add-checkpoint`` as the spec says (404 unknown origin, 403 bad signature, 400 old size
above the checkpoint, 409 old size not the one it holds, with ``text/x.tlog.size``, 422 a
consistency proof that does not verify, 409 a different root at the same size), cosigning with
a timestamped Ed25519 cosignature/v1 (C2SP tlog-cosignature).

Usage: python tests/log_witness.py --state DIR --port N --name NAME --origin ORIGIN --log-key VKEY
[--lie-once SIZE] (a witness that answers its first request with a 409 claiming SIZE leaves).
It prints ``witness-key <VKEY>`` once it listens. Signing uses ``cryptography``; the note, proof
and key formats are checked with attempts/verify_export.py (the standalone file, no Django).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from attempts.verify_export import (  # noqa: E402
    ALG_COSIGNATURE_V1,
    LogCheckpoint,
    NoteError,
    VerifierKey,
    consistent,
    key_id,
    note_signed_by,
    split_note,
)


class Witness:
    def __init__(
        self, state: Path, name: str, origin: str, log_key: VerifierKey, lie_once: int = 0
    ) -> None:
        self.state, self.name, self.origin, self.log_key = state, name, origin, log_key
        self.lie_once = lie_once  # the first answer is a 409 claiming this size (0: never)
        self.lock = threading.Lock()
        key_file = state / "witness.key"
        if not key_file.exists():
            key_file.write_bytes(Ed25519PrivateKey.generate().private_bytes_raw())
            key_file.chmod(0o600)
        self.key = Ed25519PrivateKey.from_private_bytes(key_file.read_bytes())
        public = self.key.public_key().public_bytes_raw()
        self.verifier = VerifierKey(
            name, key_id(name, ALG_COSIGNATURE_V1, public), ALG_COSIGNATURE_V1, public
        )

    def _held(self) -> tuple[int, bytes]:
        path = self.state / "latest.json"
        if not path.exists():
            return 0, b""
        data = json.loads(path.read_text())
        return data["size"], base64.b64decode(data["root"])

    def _persist(self, size: int, root: bytes) -> None:
        temporary = self.state / "latest.json.tmp"
        temporary.write_text(json.dumps({"size": size, "root": base64.b64encode(root).decode()}))
        os.replace(temporary, self.state / "latest.json")

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
        if not any(note_signed_by(text, s, self.log_key) for s in signatures):
            return 403, "text/plain", "no valid signature from the log's key\n"
        if old > checkpoint.size:
            return 400, "text/plain", "old size is larger than the checkpoint\n"
        with self.lock:  # checking the old size and persisting the new one are one step
            size, root = self._held()
            if old != size:
                return 409, "text/x.tlog.size", f"{size}\n"
            if old == checkpoint.size and root and root != checkpoint.root:
                return 409, "text/plain", "same size, different root: a fork\n"
            if old and not consistent(old, root, checkpoint.size, checkpoint.root, proof):
                return 422, "text/plain", "the consistency proof does not verify\n"
            if not old and proof:
                return 422, "text/plain", "a proof from size 0 must be empty\n"
            self._persist(checkpoint.size, checkpoint.root)
        stamp = int(time.time())
        signature = self.key.sign(f"cosignature/v1\ntime {stamp}\n{text}".encode())
        raw = self.verifier.id + stamp.to_bytes(8, "big") + signature
        return 200, "text/plain", f"\u2014 {self.name} {base64.b64encode(raw).decode()}\n"


def main() -> None:
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
        args.state, args.name, args.origin, VerifierKey.parse(args.log_key), args.lie_once
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 -- http.server's name
            if self.path.rstrip("/") != "/add-checkpoint":
                self.send_error(404)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            status, kind, answer = witness.add_checkpoint(body)
            data = answer.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"witness-key {witness.verifier}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
