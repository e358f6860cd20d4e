"""What a new team tripped over on its first deployment (issue 15): each is fixed and stays so."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from attempts import ledger
from attempts.models import AgentToken, Attempt, State
from reconciliation.reconciler import Reconciler
from tests.reconciliation.conftest import dispatched, intent

pytestmark = pytest.mark.django_db


def test_an_unknown_tenant_names_the_way_to_make_one(world) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("create_agent_token", "bot", "--tenant", "alpha", stdout=io.StringIO())
    message = str(caught.value)
    assert "unknown tenant(s): alpha" in message
    assert "[[tenants]]" in message and "ledger_config apply" in message
    assert "Known tenants: acme, globex" in message
    assert not AgentToken.objects.exists()


def claimed_ids(cutoff: dt.datetime) -> list[str]:
    found = Reconciler(worker_id="w-test").claim(
        cutoff=cutoff, limit=50, lease=dt.timedelta(seconds=60)
    )
    return [attempt.attempt_id for attempt in found]


def age(attempt: Attempt, seconds: float) -> None:
    """The attempt last changed ``seconds`` ago (its next_check_at stays as it was written)."""
    Attempt.objects.filter(pk=attempt.pk).update(
        updated_at=timezone.now() - dt.timedelta(seconds=seconds)
    )


@pytest.mark.parametrize("make", [intent, dispatched])
def test_the_stale_threshold_is_read_by_the_worker_when_it_looks(world, settings, make) -> None:
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 600}
    attempt = make(world, "open_ticket", f"k-{make.__name__}")
    age(attempt, 120)
    assert claimed_ids(timezone.now()) == []  # 2 minutes old, stale after 10
    # The operator lowers the threshold on the worker: attempts already recorded follow it.
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 60}
    assert claimed_ids(timezone.now()) == [attempt.attempt_id]


def test_a_fresh_in_flight_attempt_is_left_to_its_agent(world, settings) -> None:
    settings.LEDGER = {**settings.LEDGER, "STALE_AFTER": 60}
    attempt = dispatched(world, "open_ticket", "k-fresh")
    age(attempt, 30)
    assert claimed_ids(timezone.now()) == []


def test_a_repeat_flag_does_not_stick_to_the_callers_copy(world) -> None:
    attempt = dispatched(world, "open_ticket", "k-flag")
    ledger.mark_unknown(attempt, reason="t", actor=world.agent)
    assert not attempt.repeated_call
    ledger.mark_unknown(attempt, reason="t", actor=world.agent)
    assert attempt.repeated_call
    ledger.confirm(attempt, result_ref="r", actor=world.agent)
    assert attempt.state == State.OUTCOME_CONFIRMED and not attempt.repeated_call
