"""Protocol section 7, invariant 12 under real concurrency: four processes confirm four attempts
with the same provider request id at the same instant. The database's unique constraint lets one
win; the three others are refused (409 ``effect_claimed``) and wait in MANUAL_REVIEW."""

import pytest

from attempts import ledger
from attempts.models import Attempt, ProviderEffect, State
from tests.attempts.racers import CHARGE, race
from tests.conftest import agent_intent, make_world

PROCESSES = 4


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_confirms_of_one_effect_have_one_winner():
    world = make_world()
    attempts = []
    for n in range(PROCESSES):
        attempt, _ = agent_intent(
            world, f"charge:acme:effect-race-{n}", tool="charge_card", args=CHARGE, task="race"
        )
        attempts.append(ledger.claim_dispatch(attempt, actor=world.agent)[0])
    argvs = [[a.attempt_id, "ch_1"] for a in attempts]
    results = race("tests.attempts.effect_race_child", argvs)
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
