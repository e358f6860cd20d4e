"""Named crash points: real agent processes SIGKILLed at a point leave exactly the ledger state
that point promises; without the environment (or in production) nothing happens."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from attempts import faults
from attempts.models import Attempt, State
from tests.conftest import CONFIRMED_IN_ORDER, REPO, child_env, manage

pytestmark = pytest.mark.django_db(transaction=True)


def plan(tmp_path: Path, *keys: str, tool: str = "open_ticket") -> Path:
    path = tmp_path / "plan.json"
    calls = [
        {
            "tenant": "acme",
            "task_id": f"task-{key}",
            "tool_name": tool,
            "idempotency_key": key,
            "args": {"ref": key},
        }
        for key in keys
    ]
    path.write_text(json.dumps(calls))
    return path


def agent(plan_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return manage(
        "crashtest_agent", str(plan_path), env=child_env(LEDGERWEB_FAULTS_ALLOWED="1", **env)
    )


def test_crash_points_do_nothing_without_the_environment(monkeypatch) -> None:
    for name in faults.FAULT_ENV:
        monkeypatch.delenv(name, raising=False)
    faults.crash_point("intent_committed")  # would SIGKILL this test run if it were armed
    assert faults.mutation("claim_after_send") is False
    assert faults.arm_kill_timer() is None


def test_killed_after_the_intent_commit_nothing_was_sent(wired, demo, tmp_path) -> None:
    done = agent(plan(tmp_path, "k:1"), LEDGERWEB_CRASH_AT="intent_committed")
    assert done.returncode == -signal.SIGKILL
    assert "crash point intent_committed" in done.stderr
    assert "done 0" not in done.stdout
    attempt = Attempt.objects.get(idempotency_key="k:1")
    assert (attempt.state, attempt.send_count) == (State.INTENT_RECORDED, 0)
    assert demo.summary()["total"] == 0


def test_killed_after_the_response_the_effect_exists_but_is_not_recorded(
    wired, demo, tmp_path
) -> None:
    done = agent(plan(tmp_path, "k:2"), LEDGERWEB_CRASH_AT="response_received")
    assert done.returncode == -signal.SIGKILL
    attempt = Attempt.objects.get(idempotency_key="k:2")
    assert attempt.state == State.DISPATCHED
    assert attempt.provider_request_id == ""
    [effect] = demo.effects(idempotency_key="k:2")
    assert effect["ledger_attempt_id"] == attempt.attempt_id
    assert effect["args_hash"] == attempt.args_hash


def test_crash_after_counts_hits_across_calls(wired, demo, tmp_path) -> None:
    done = agent(
        plan(tmp_path, "k:3", "k:4"),
        LEDGERWEB_CRASH_AT="dispatch_claimed",
        LEDGERWEB_CRASH_AFTER="2",
    )
    assert done.returncode == -signal.SIGKILL
    assert "done 0 OUTCOME_CONFIRMED" in done.stdout
    first = Attempt.objects.get(idempotency_key="k:3")
    second = Attempt.objects.get(idempotency_key="k:4")
    assert first.state == State.OUTCOME_CONFIRMED
    assert first.provider_request_id and first.result_ref.startswith("receipt:")
    assert second.state == State.DISPATCHED
    assert demo.summary()["by_key"] == {"k:3": 1}


def test_a_kill_timer_kills_wherever_the_process_is(wired, demo, tmp_path) -> None:
    done = agent(plan(tmp_path, "k:5"), LEDGERWEB_CRASH_TIMER_MS="0")
    assert done.returncode == -signal.SIGKILL
    assert "kill timer after 0 ms" in done.stderr


def test_without_faults_the_agent_completes_in_the_safe_order(wired, demo, tmp_path) -> None:
    done = agent(plan(tmp_path, "k:6"))
    assert done.returncode == 0, done.stderr
    attempt = Attempt.objects.get(idempotency_key="k:6")
    assert attempt.state == State.OUTCOME_CONFIRMED
    actions = list(attempt.events.values_list("action", flat=True))
    assert actions == CONFIRMED_IN_ORDER


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LEDGERWEB_HTTPS": "1", "LEDGERWEB_CRASH_AT": "intent_committed"}, "does not allow it"),
        ({"LEDGERWEB_HTTPS": "1", "LEDGERWEB_MUTATION": "blind_retry"}, "does not allow it"),
        ({"LEDGERWEB_HTTPS": "1", "LEDGERWEB_FAULTS_ALLOWED": "1"}, "cannot be on in production"),
        (
            {
                "LEDGERWEB_FAULTS_ALLOWED": "1",
                "LEDGERWEB_CRASH_AT": "x",
                "LEDGERWEB_CRASH_AFTER": "zero",
            },
            "whole number >= 1",
        ),
        # Off unless a test process enables it: plain settings (say, behind a TLS-terminating
        # proxy with LEDGERWEB_HTTPS off) refuse it too.
        ({"LEDGERWEB_CRASH_AT": "intent_committed"}, "does not allow it"),
        ({"LEDGERWEB_MUTATION": "blind_retry"}, "does not allow it"),
    ],
)
def test_fault_injection_in_production_refuses_to_start(env: dict[str, str], message: str) -> None:
    done = manage("check", env=child_env(**env), timeout=60)
    assert done.returncode != 0
    assert message in done.stderr


def test_the_catalogue_and_the_code_agree() -> None:
    """Every catalogued point is placed in the code, and every placed point is catalogued."""
    from reconciliation import faults as reconciliation_faults

    sources = [
        REPO / "attempts" / "ledger.py",
        REPO / "attempts" / "notify.py",
        *sorted((REPO / "reconciliation").glob("*.py")),
    ]
    text = "\n".join(path.read_text() for path in sources if path.name != "faults.py")
    called = {chunk.split('"', 1)[0] for chunk in text.split('crash_point("')[1:]}
    assert called <= set(reconciliation_faults.POINTS)
    for name in reconciliation_faults.POINTS:
        assert f'"{name}"' in text, f"crash point {name} is catalogued but never placed"
