"""The demo agents through the real API (live server) against a real demo provider process:
crashes are real SIGKILLs that leave exactly the state of their crash point, and timeouts leave
UNKNOWN attempts whose history was written by the agent."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from attempts.models import AgentToken, ApprovalPolicy, Attempt, State
from reconciliation import demo_agents
from reconciliation.demo_provider import wait_for_port_file
from tests.conftest import REPO

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider_url(tmp_path: Path):
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciliation.demo_provider",
            "--db",
            str(tmp_path / "p.db"),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--seed",
            "5",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = wait_for_port_file(port_file, process, seconds=15, poll=0.05)
        assert port is not None, "the demo provider did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def demo_world(db) -> None:
    call_command(
        "seed_demo",
        "--provider-url",
        "http://127.0.0.1:9",
        "--password",
        "pw-demo-123",
        stdout=io.StringIO(),
    )


def _run(live_server, token: str, provider_url: str, **options) -> Counter:
    """``demo_agents.run`` against the live server and the demo provider, with no mutated
    payloads or flaky lookups (unless ``options`` say otherwise) and its output kept quiet."""
    options = {"mismatch_rate": 0, "lookup_fault_rate": 0, **options}
    return demo_agents.run(
        api=live_server.url, token=token, provider_url=provider_url, out=io.StringIO(), **options
    )


def effects(provider_url: str, key: str) -> list:
    provider = demo_agents.Provider(provider_url, 5)
    status, body = provider.request("GET", f"/effects?idempotency_key={key}")
    assert status == 200
    return body


def test_crash_points_leave_their_states_and_timeouts_leave_unknown(
    demo_world, live_server, provider_url
) -> None:
    # Crash points only: the demo's approval policy would hold large charges before any of them.
    ApprovalPolicy.objects.update(active=False)
    _, token = AgentToken.issue("demo-test", ["acme", "globex"])
    tasks = demo_agents.make_tasks(30, seed=4, run_id="t", crash_rate=0.5, mismatch_rate=0)
    counts = _run(
        live_server,
        token,
        provider_url,
        tasks=30,
        crash_rate=0.5,
        timeout_rate=0.5,
        seed=4,
        agents=3,
        send_timeout=0.5,
    )
    assert sum(counts.values()) == 30
    assert not [what for what in counts if what.startswith(("ledger_error", "crash_child"))]
    crashed = {t.crash_point for t in tasks if t.crash_point}
    assert crashed == set(demo_agents.CRASH_POINTS)
    # The run plans tasks with a fresh run id, so match by kind and crash point via the ledger.
    by_state = {s: Attempt.objects.filter(state=s).count() for s in State.values}
    assert by_state[State.INTENT_RECORDED] == counts["crashed:A_after_intent"]
    assert (
        by_state[State.DISPATCHED]
        >= counts["crashed:B_after_claim"] + counts["crashed:C_after_send"]
    )
    assert by_state[State.UNKNOWN] >= 1
    for attempt in Attempt.objects.filter(state=State.UNKNOWN):
        moves = list(attempt.events.values_list("actor_kind", "to_state"))
        assert moves[-1] == ("agent", "UNKNOWN")
    for attempt in Attempt.objects.filter(state=State.INTENT_RECORDED):
        assert effects(provider_url, attempt.idempotency_key) == []
    # Every confirmed attempt matches exactly one effect at the provider with its hash.
    for attempt in Attempt.objects.filter(state=State.OUTCOME_CONFIRMED):
        found = effects(provider_url, attempt.idempotency_key)
        assert [e["args_hash"] for e in found] == [attempt.args_hash]


def _command(live_server, provider_url: str, *options: str, stdout=None) -> None:
    """The ``demo_agents`` command against the live server and the demo provider, with no
    crashes or timeouts; ``options`` its others."""
    api = ["--api", live_server.url, "--provider", provider_url]
    calm = ["--crash-rate", "0", "--timeout-rate", "0"]
    call_command("demo_agents", *api, *calm, *options, stdout=stdout or io.StringIO())


def test_the_command_issues_and_revokes_its_own_token(demo_world, live_server, provider_url):
    out = io.StringIO()
    _command(live_server, provider_url, "--tasks", "4", "--agents", "2", stdout=out)
    assert "demo agents: 4 tasks" in out.getvalue()
    assert Attempt.objects.count() == 4
    token = AgentToken.objects.get(name__startswith="demo-agents-")
    assert token.revoked_at is not None
    # Every run leaves one buggy CRM update in the UNKNOWN queue (a review item for newcomers);
    # settle it, and a second run with --if-queues-empty and no attention work runs tasks.
    from attempts import review

    (buggy,) = Attempt.objects.filter(state=State.UNKNOWN)
    assert buggy.tool_name == "update_crm"
    review.review_fail(buggy, user=User.objects.get(username="reviewer"), reason="demo")
    _command(live_server, provider_url, "--tasks", "2", "--if-queues-empty")
    assert Attempt.objects.count() == 6


def test_command_errors_are_clear(db, live_server) -> None:
    with pytest.raises(CommandError, match="seed_demo"):
        call_command(
            "demo_agents",
            "--api",
            live_server.url,
            "--provider",
            "http://x:1",
            stdout=io.StringIO(),
        )


def test_seed_demo_is_idempotent_and_prints_logins(db, settings, tmp_path) -> None:
    settings.DATA_DIR = tmp_path
    first = io.StringIO()
    call_command("seed_demo", "--provider-url", "http://127.0.0.1:1111", stdout=first)
    password = json.loads((tmp_path / "demo" / "logins.json").read_text())["password"]
    assert (tmp_path / "demo" / "logins.json").stat().st_mode & 0o077 == 0
    assert f"reviewer   password {password}" in first.getvalue()
    again = io.StringIO()
    call_command("seed_demo", "--provider-url", "http://127.0.0.1:2222", stdout=again)
    assert f"reviewer   password {password}" in again.getvalue()
    from django.contrib.auth import authenticate

    from attempts.models import Membership, Tool

    assert authenticate(username="reviewer", password=password) is not None
    assert Membership.objects.filter(user__username="admin").count() == 2
    assert Tool.objects.get(name="charge_card").dispatch_url == (
        "http://127.0.0.1:2222/tools/charge_card/send"
    )
    assert Tool.objects.get(name="deploy_service").lookup_url == ""


def test_the_demo_shows_a_non_critical_review_item_one_reviewer_retries(
    demo_world, live_server, provider_url
) -> None:
    from django.contrib.auth.models import User

    from attempts import review
    from reconciliation.reconciler import Reconciler

    call_command("seed_demo", "--provider-url", provider_url, stdout=io.StringIO())
    _, token = AgentToken.issue("demo-test", ["acme", "globex"])
    counts = _run(
        live_server,
        token,
        provider_url,
        tasks=3,
        crash_rate=0,
        timeout_rate=0,
        lookup_outage=(),
        seed=2,
        agents=1,
        send_timeout=2,
    )
    assert counts["unknown_mismatch"] == 1
    buggy = Attempt.objects.get(tool_name="update_crm", state=State.UNKNOWN)
    Attempt.objects.filter(pk=buggy.pk).update(next_check_at=buggy.created_at)
    Reconciler(worker_id="demo-test").run_once()
    buggy.refresh_from_db()
    assert (buggy.state, buggy.review_reason) == (State.MANUAL_REVIEW, "payload_mismatch")
    assert buggy.owner.username == "reviewer"
    # update_crm is not critical: one reviewer's approval sends a linked retry.
    child = review.approve_linked_retry(buggy, user=User.objects.get(username="reviewer"))
    assert child is not None and child.parent_id == buggy.pk
    buggy.refresh_from_db()
    assert buggy.state == State.RECONCILED
