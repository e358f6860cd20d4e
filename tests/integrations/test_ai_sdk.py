"""The Vercel AI SDK (docs/integrations.md): the real ``ai`` package (v7) with its mock model
(``ai/test``: no network, no LLM), the TypeScript client's ``ledger-client/ai-sdk`` helpers and
a live ledger. Each step is a new Node process (``clients/typescript/scripts/ai-sdk-agent.mjs``),
as an agent restarted while a call is held: the ``toolApproval`` rule answers ``user-approval``
for a held call, ``ledgerApprovalResponses`` answers with the ledger's decision, and the tool
wrapper sends an approved call once (the corrected arguments after an edit), nothing after a
rejection or an expiry; effects are counted in the provider's own file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.db import connection

from attempts.models import Attempt, State
from tests.api.conftest import Tokens
from tests.conftest import REPO, World
from tests.integrations.approvals import (
    approve,
    assert_only_the_correction_was_sent,
    edit_and_approve,
    expire_waits,
    hold,
    reject,
)
from tests.integrations.conftest import sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

CLIENT = REPO / "clients" / "typescript"
KEY = "ticket:acme:cus_1:Printer on fire"


@pytest.fixture(scope="module")
def built() -> str:
    npm = shutil.which("npm")
    if npm is None or not (CLIENT / "node_modules" / "ai").is_dir():
        pytest.fail("the AI SDK tests need Node.js 20 and npm; run scripts/setup (npm ci)")
    done = subprocess.run(
        [npm, "run", "build"], cwd=CLIENT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return shutil.which("node") or "node"


class Agent:
    """Runs the agent script, one process per step, sharing its state and effects files."""

    def __init__(self, node: str, url: str, token: str, folder: Path) -> None:
        self.node, self.folder = node, folder
        self.env = {**os.environ, "LEDGERWEB_URL": url, "LEDGERWEB_TOKEN": token}

    def __call__(self, phase: str) -> str:
        connection.close()  # the live server's threads see every commit at once
        done = subprocess.run(
            [
                self.node,
                str(CLIENT / "scripts" / "ai-sdk-agent.mjs"),
                phase,
                str(self.folder / "state.json"),
                str(self.folder / "effects.jsonl"),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    @property
    def effects(self) -> list[dict]:
        path = self.folder / "effects.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def agent(built: str, live_server, tokens: Tokens, tmp_path: Path) -> Agent:
    return Agent(built, live_server.url, tokens.acme, tmp_path)


@pytest.fixture
def held(world: World, agent: Agent) -> Attempt:
    """The agent ran until the ledger held its call, kept its state and stopped."""
    hold("open_ticket", "args.priority >= 2")
    assert agent("start") == "held: open_ticket"
    assert agent("resume") == "pending"  # nobody decided yet
    attempt = Attempt.objects.get(idempotency_key=KEY)
    assert attempt.state == State.AWAITING_APPROVAL and agent.effects == []
    return attempt


def test_approved_on_the_ledger_a_restarted_agent_sends_once(
    agent: Agent, held: Attempt, world: World
) -> None:
    approve(held.attempt_id, world.reviewer)
    assert agent("resume") == 'done: {"type":"json","value":{"id":"T-1","priority":3}}'
    assert len(agent.effects) == 1
    held.refresh_from_db()
    assert (held.state, held.send_count) == (State.OUTCOME_CONFIRMED, 1)
    # Resumed again from the same kept state (another restart): answered from the ledger.
    assert "T-1" in agent("resume") and len(agent.effects) == 1


def test_a_rejection_reaches_the_model_as_a_denial_and_nothing_is_sent(
    agent: Agent, held: Attempt, world: World
) -> None:
    reject(held.attempt_id, world.reviewer, "not urgent")
    answer = agent("resume")
    assert "execution-denied" in answer and "approval_rejected" in answer
    assert agent.effects == [] and Attempt.objects.get(pk=held.pk).send_count == 0


def test_an_expiry_reaches_the_model_as_a_denial_and_nothing_is_sent(
    agent: Agent, held: Attempt, world: World
) -> None:
    assert expire_waits() == 1
    answer = agent("resume")
    assert "execution-denied" in answer and "approval_expired" in answer
    assert agent.effects == []


def test_edit_and_approve_sends_the_corrected_call_never_the_original(
    agent: Agent, held: Attempt, world: World
) -> None:
    linked = edit_and_approve(
        held.attempt_id,
        world.reviewer,
        {"customer": "cus_1", "title": "Printer on fire", "priority": 2},
    )
    assert '"priority":2' in agent("resume")
    assert [e["priority"] for e in agent.effects] == [2]
    assert_only_the_correction_was_sent(linked, held)


def test_approving_in_the_sdk_alone_sends_nothing(agent: Agent, held: Attempt) -> None:
    assert "ledgerweb awaiting_approval" in agent("approve-in-sdk")
    assert agent.effects == []
    assert Attempt.objects.get(pk=held.pk).state == State.AWAITING_APPROVAL


def test_a_call_no_policy_holds_runs_at_once_and_once(agent: Agent, world: World) -> None:
    assert agent("start") == 'done: {"type":"json","value":{"id":"T-1","priority":3}}'
    assert agent("start").startswith("done:") and len(agent.effects) == 1
