"""The TypeScript client checks receipts with the log's verifier key alone (Node's built-in
Ed25519), against a live server: pytest seals and signs (with a witness cosigning), writes the
fixture the client's receipts suite reads, and runs it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess

import pytest
import rfc8785

from attempts import log
from attempts.verify_export import LogCheckpoint, NoteSignature
from ledgerweb_client import LedgerClient
from tests.api.conftest import Tokens
from tests.api.test_typescript_client import CLIENT, npm
from tests.attempts.audit_helpers import ORIGIN, seal_all, sign_with_new_key
from tests.attempts.test_witness import _start_witness

# The client's behaviour does not depend on the database: one pass runs it.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_database]


def test_typescript_client_verifies_receipts(live_server, tokens: Tokens, tmp_path, settings):
    key_path, verifier = sign_with_new_key(tmp_path, settings)
    process, port, witness_key = _start_witness(tmp_path, verifier)
    settings.TLOG = {**settings.TLOG, "WITNESSES": [f"{witness_key} http://127.0.0.1:{port}"]}
    try:
        with LedgerClient(live_server.url, tokens.acme) as ledger:
            ids = []
            for i in range(3):
                ids.append(
                    ledger.record_intent(
                        tenant="acme", task_id="t", tool_name="update_crm",
                        idempotency_key=f"ts-r:{i}", args={"i": i},
                    ).attempt_id
                )  # fmt: skip
            seal_all()
            log.publish()
            first = log.newest_signed()
            for i in range(3, 6):
                ledger.record_intent(
                    tenant="acme", task_id="t", tool_name="update_crm",
                    idempotency_key=f"ts-r:{i}", args={"i": i},
                )  # fmt: skip
            seal_all()
            log.publish()
            second = log.newest_signed()
            unsealed = ledger.record_intent(
                tenant="acme", task_id="t", tool_name="update_crm",
                idempotency_key="ts-r:late", args={},
            ).attempt_id  # fmt: skip
        fixture = {
            "url": live_server.url,
            "token": tokens.acme,
            "verifier": str(verifier),
            "other_key": str(log.generate_key(ORIGIN)[1]),
            "witness_key": witness_key,
            "attempt_id": ids[1],
            "unsealed_id": unsealed,
            "first": log.signed_note(first),
            "second": log.signed_note(second),
            "proof_first_second": [
                base64.b64encode(h).decode() for h in log.consistency_proof(first.size, second.size)
            ],
        }
        fixture["sent"] = {
            "tenant": "acme",
            "task_id": "t",
            "tool_name": "update_crm",
            "idempotency_key": "ts-r:1",
            "args": {"i": 1},
        }
        # RFC 8785 as the server's reference writes it, for values where a naive encoder differs.
        values = [0.1, 1e21, 1e-7, -0.0, 5e-324, 2**53 - 1, 1.5e300, 123.456, "\u2028\x01é😀"]
        values.append({"\U0001f600": 1, "\uffff": 2, "é": 3, "b": [None, True], "a": {}})
        fixture["jcs"] = [[value, rfc8785.dumps(value).decode()] for value in values]
        # A fork, as an operator holding the key would sign it: another root for a larger tree,
        # offered with the honest proof; the client that kept the first checkpoint refuses it.
        body = LogCheckpoint(ORIGIN, second.size + 1, hashlib.sha256(b"forged").digest()).text()
        signature = log.read_key_file(key_path).sign(body)
        line = NoteSignature(verifier.name, verifier.id, signature).line()
        fixture["forked"] = body + "\n" + line
        fixture["proof_first_forked"] = fixture["proof_first_second"]
        path = tmp_path / "fixture.json"
        path.write_text(json.dumps(fixture))
        done = subprocess.run(
            [npm(), "run", "build:test", "--silent"], cwd=CLIENT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        done = subprocess.run(
            ["node", "--test", "dist/test/receipts.test.js"],
            cwd=CLIENT,
            env={"PATH": "/usr/bin:/bin", "LEDGERWEB_RECEIPT_FILE": str(path), "NO_COLOR": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "# pass 4" in done.stdout and "# fail 0" in done.stdout, done.stdout[-2000:]
    finally:
        process.terminate()
        process.wait(timeout=10)
