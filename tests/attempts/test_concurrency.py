"""Section 4 under real concurrency: 8 processes record the same intent and race to claim its
dispatch. Exactly one claim wins, one attempt exists, no error escapes (SQLite file and
PostgreSQL: whichever database the suite runs on)."""

import pytest

from attempts.models import Attempt, AttemptEvent, State
from tests.attempts.racers import race
from tests.conftest import make_world

PROCESSES = 8


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_eight_processes_one_claim(round_):
    make_world()
    key = f"charge:acme:race-{round_}"
    results = race("tests.attempts.race_child", [[key, str(n)] for n in range(PROCESSES)])
    assert [r for r in results if "error" in r] == []
    assert sum(r["claimed"] for r in results) == 1
    assert sum(r["created"] for r in results) == 1
    assert len({r["attempt_id"] for r in results}) == 1
    attempt = Attempt.objects.get(idempotency_key=key)
    assert attempt.state == State.DISPATCHED and attempt.send_count == 1
    actions = list(AttemptEvent.objects.filter(attempt=attempt).values_list("action", flat=True))
    assert actions == ["attempt.created", "attempt.dispatched"]
