"""A confirm that loses its compare-and-set to a concurrent change that does not conflict (a
worker's lease claim, a repeated attach of the same id) is decided again on a fresh read: 200,
never a spurious 409 (issue 23: a confirm got 409 on a DISPATCHED attempt whose id had just been
attached)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from attempts import ledger, states
from attempts.locking import write_transaction
from attempts.models import Attempt, State


@pytest.fixture
def racing(monkeypatch):
    """The first fresh read of the attempt is overtaken by a reconcile worker's lease claim
    (it bumps the version) before the caller's compare-and-set. Armed by ``racing.clear()``."""
    real = ledger.get_attempt
    raced = ["disarmed"]

    def get_attempt(attempt_id, *, tenants=None):
        found = real(attempt_id, tenants=tenants)
        if not raced:
            raced.append(attempt_id)
            now = timezone.now()
            with write_transaction():
                states.claim_lease(
                    [(found.pk, found.version)],
                    owner="worker-1",
                    until=now + timezone.timedelta(seconds=60),
                    now=now,
                )
        return found

    monkeypatch.setattr(ledger, "get_attempt", get_attempt)
    return raced


def test_confirm_overtaken_by_a_lease_claim_still_confirms(api, racing) -> None:
    created = api.intent("race:1").body["attempt"]
    attempt_id = created["attempt_id"]
    assert api.post(f"attempts/{attempt_id}/dispatch").status == 200
    assert (
        api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "req-1"}).status
        == 200
    )
    racing.clear()
    answer = api.post(
        f"attempts/{attempt_id}/confirm",
        {"result_ref": "receipt-1", "provider_request_id": "req-1"},
    )
    assert racing, "the race did not happen"
    assert answer.status == 200, answer.body
    attempt = Attempt.objects.get(attempt_id=attempt_id)
    assert attempt.state == State.OUTCOME_CONFIRMED
    assert attempt.provider_request_id == "req-1"


def test_an_attach_overtaken_by_a_lease_claim_still_attaches(api, racing) -> None:
    attempt_id = api.intent("race:2").body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{attempt_id}/dispatch").status == 200
    racing.clear()
    answer = api.post(f"attempts/{attempt_id}/provider-request", {"provider_request_id": "req-2"})
    assert racing and answer.status == 200, answer.body


def test_a_confirmed_attempt_names_its_effect_by_id_or_by_a_receipt_carrying_it() -> None:
    """The rule crashtest's invariant 3 and the soak check (docs/api.md)."""
    by_id = Attempt(provider_request_id="pi_1", result_ref="whatever")
    assert by_id.identifies_effect("pi_1") and not by_id.identifies_effect("pi_2")
    by_receipt = Attempt(provider_request_id="", result_ref="receipt:pi_1")
    assert by_receipt.identifies_effect("pi_1")
    assert not Attempt(provider_request_id="", result_ref="done").identifies_effect("pi_1")
