"""Both clients' wait follows an edit-and-approve link, against the live API on 127.0.0.1: the
held original ends RECONCILED with ``linked_attempt_id`` (the API's read-only link), the wait
moves to the linked attempt, waits there while it needs a second approver, and the call sends
the linked attempt's corrected arguments under its key, once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from typing import Any

import pytest

from attempts.models import Attempt, State
from ledgerweb_client import LedgerClient, SendResult
from tests.api.conftest import Tokens, tokens  # noqa: F401  (the fixture)
from tests.conftest import REPO, World
from tests.integrations.approvals import approve, edit_and_approve, hold

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT = REPO / "clients" / "typescript"
HELD = {
    "tenant": "acme",
    "task_id": "task-links",
    "tool_name": "open_ticket",
    "idempotency_key": "ticket:links:1",
    "args": {"customer": "cus_1", "title": "Sreen flickers"},
}
FIXED = {"customer": "cus_1", "title": "Screen flickers"}


def _once_recorded(key: str) -> Attempt:
    deadline = time.monotonic() + 20
    while not Attempt.objects.filter(idempotency_key=key).exists():
        assert time.monotonic() < deadline, "the client never recorded its intent"
        time.sleep(0.1)
    return Attempt.objects.get(idempotency_key=key)


def test_the_api_shows_the_link_on_the_reconciled_original_only(
    live_server,
    tokens: Tokens,  # noqa: F811
    world: World,
) -> None:
    hold("open_ticket")
    with LedgerClient(live_server.url, tokens.acme) as client:
        original = client.record_intent(**HELD)
        assert original.state == "AWAITING_APPROVAL" and original.linked_attempt_id is None
        linked = edit_and_approve(original.attempt_id, world.reviewer, FIXED)
        after = client.get(original.attempt_id)
        assert (after.state, after.linked_attempt_id) == ("RECONCILED", linked.attempt_id)
        child = client.get(linked.attempt_id)
        assert child.parent_attempt_id == original.attempt_id and child.linked_attempt_id is None
        assert child.args == FIXED and child.state == "INTENT_RECORDED"
        # The list shows it too (one query for the page's links).
        [listed] = client.find(HELD["idempotency_key"])
        assert listed.linked_attempt_id == linked.attempt_id
        assert client.follow_links(after) == child


@pytest.mark.one_database  # client behaviour, independent of the database
def test_python_call_follows_the_link_and_waits_for_the_second_approver(
    live_server,
    tokens: Tokens,  # noqa: F811
    world: World,
) -> None:
    hold("open_ticket", approvals_needed=2)
    sent: list[tuple[str, dict[str, Any]]] = []
    results: list[Any] = []

    def send(attempt):
        sent.append((attempt.idempotency_key, dict(attempt.args)))
        return SendResult(provider_request_id="T-9", result_ref="ticket:T-9")

    def agent() -> None:
        with LedgerClient(live_server.url, tokens.acme, timeout=25) as client:
            results.append(client.call(**HELD, send=send, wait_for_approval=20))

    waiting = threading.Thread(target=agent)
    waiting.start()
    original = _once_recorded(HELD["idempotency_key"])
    linked = edit_and_approve(original.attempt_id, world.reviewer, FIXED)
    assert linked.state == State.AWAITING_APPROVAL  # the policy wants a second person
    time.sleep(1.5)
    assert sent == []
    approve(linked.attempt_id, world.reviewer2)
    waiting.join(timeout=40)
    [result] = results
    assert result.sent and result.confirmed
    assert result.attempt.attempt_id == linked.attempt_id
    assert sent == [(linked.idempotency_key, FIXED)]
    # After a restart, the same call (same key) ends on the linked attempt's outcome.
    with LedgerClient(live_server.url, tokens.acme) as client:
        again = client.call(**HELD, send=send, wait_for_approval=5)
    assert not again.sent and again.confirmed and len(sent) == 1
    original.refresh_from_db()
    assert (original.state, original.send_count) == (State.RECONCILED, 0)


@pytest.mark.one_database  # client behaviour, independent of the database
def test_typescript_call_follows_the_link(
    live_server,
    tokens: Tokens,  # noqa: F811
    world: World,
    tmp_path,
) -> None:
    node = shutil.which("node")
    if node is None or not (CLIENT / "node_modules").is_dir():
        pytest.fail("the TypeScript client needs Node.js 20 and npm; run scripts/setup (npm ci)")
    built = subprocess.run(
        [shutil.which("npm") or "npm", "run", "build"], cwd=CLIENT, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout + built.stderr
    hold("open_ticket", approvals_needed=2)
    script = tmp_path / "follow.mjs"
    script.write_text(
        f"""
import {{ LedgerClient }} from {json.dumps((CLIENT / "dist" / "src" / "index.js").as_uri())};
const client = new LedgerClient(process.env.LEDGERWEB_URL, process.env.LEDGERWEB_TOKEN,
  {{ timeoutMs: 25000 }});
const sent = [];
const result = await client.call({{
  ...{json.dumps(HELD)},
  waitForApprovalMs: 25000,
  send: async (attempt) => {{
    sent.push([attempt.idempotency_key, attempt.args]);
    return {{ providerRequestId: "T-ts", resultRef: "ticket:T-ts" }};
  }},
}});
console.log(JSON.stringify({{ sent, attempt: result.attempt.attempt_id,
  state: result.attempt.state, didSend: result.sent }}));
"""
    )
    env = {**os.environ, "LEDGERWEB_URL": live_server.url, "LEDGERWEB_TOKEN": tokens.acme}
    agent = subprocess.Popen(
        [node, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        original = _once_recorded(HELD["idempotency_key"])
        linked = edit_and_approve(original.attempt_id, world.reviewer, FIXED)
        time.sleep(1.5)
        approve(linked.attempt_id, world.reviewer2)
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, err.decode()
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert answer == {
        "sent": [[linked.idempotency_key, FIXED]],
        "attempt": linked.attempt_id,
        "state": "OUTCOME_CONFIRMED",
        "didSend": True,
    }
    linked.refresh_from_db()
    assert linked.send_count == 1


@pytest.mark.one_database  # client behaviour, independent of the database
def test_the_documented_edit_and_approve_example_runs(
    live_server,
    tokens: Tokens,  # noqa: F811
    world: World,
    tmp_path,
) -> None:
    """docs/client.md's edit-and-approve example, run as written while a reviewer corrects the
    amount: the corrected charge is sent once, under the linked attempt's key."""
    import ast
    import re
    import sys

    text = (REPO / "docs" / "client.md").read_text(encoding="utf-8")
    [code] = re.findall(r"^```python runs=edit-and-approve\n(.*?)^```$", text, re.M | re.S)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    hold("charge_card", "args.amount_cents > 100000")
    env = {
        **os.environ,
        "LEDGERWEB_URL": live_server.url,
        "LEDGERWEB_TOKEN": tokens.acme,
        "PYTHONPATH": str(REPO),
    }
    agent = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        original = _once_recorded("charge:acme:order-17")
        fixed = {"amount_cents": 200000, "customer": "cus_1"}
        linked = edit_and_approve(original.attempt_id, world.reviewer, fixed)
        # charge_card is critical: four eyes, so a second person approves the corrected call.
        assert linked.state == State.AWAITING_APPROVAL
        approve(linked.attempt_id, world.reviewer2)
        out, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0
    # The args as the ledger returns them: PostgreSQL's jsonb keeps its own key order.
    outcome, rest = out.strip().split(" ", 1)
    printed, sends = rest.rsplit(" ", 1)
    assert (outcome, ast.literal_eval(printed), sends) == ("OUTCOME_CONFIRMED", fixed, "1"), out
    linked.refresh_from_db()
    assert (linked.state, linked.send_count) == (State.OUTCOME_CONFIRMED, 1)
