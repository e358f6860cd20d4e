"""Protocol section 7, invariant 12 under real concurrency: four processes confirm four attempts
with the same provider request id at the same instant. The database's unique constraint lets one
win; the three others are refused (409 ``effect_claimed``) and wait in MANUAL_REVIEW."""

import json
import subprocess
import time

import pytest

from attempts import ledger
from attempts.models import Attempt, ProviderEffect, State
from tests.conftest import PYTHON, REPO, child_env, make_world

PROCESSES = 4


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_confirms_of_one_effect_have_one_winner():
    world = make_world()
    attempts = []
    for n in range(PROCESSES):
        attempt, _ = ledger.record_intent(
            tenant="acme",
            task_id="race",
            tool_name="charge_card",
            idempotency_key=f"charge:acme:effect-race-{n}",
            args={"amount": 1200, "currency": "EUR", "card": "tok_4242"},
            actor=world.agent,
        )
        attempts.append(ledger.claim_dispatch(attempt, actor=world.agent)[0])
    start_at = time.time() + 3.0
    children = [
        subprocess.Popen(
            [PYTHON, "-m", "tests.attempts.effect_race_child", str(start_at), a.attempt_id, "ch_1"],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in attempts
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r for r in results if "error" in r] == []
    assert sum(r["confirmed"] for r in results) == 1
    assert sorted(r.get("code", "") for r in results) == ["", *["effect_claimed"] * 3]
    states = sorted(Attempt.objects.values_list("state", "review_reason"))
    assert states == [
        *[(State.MANUAL_REVIEW, "effect_claimed")] * 3,
        (State.OUTCOME_CONFIRMED, ""),
    ]
    (winner,) = Attempt.objects.filter(state=State.OUTCOME_CONFIRMED)
    assert list(ProviderEffect.objects.values_list("attempt_id", flat=True)) == [winner.attempt_id]
