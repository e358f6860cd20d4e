"""Attempt.new: the write path's attempt is the one ``Model.__init__`` would build, and its id
the ULID-style id the ledger always made."""

import datetime as dt
import os
import time

from django.db.models import signals

from attempts.models import Attempt, new_attempt_id
from attempts.models.attempts import _CROCKFORD

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
GIVEN = {
    "attempt_id": "att_01M93GBYDY864P4PVDZGH5A666",
    "state": "INTENT_RECORDED",
    "created_at": NOW,
    "updated_at": NOW,
    "next_check_at": NOW,
    "recorded_by": "agent-1",
    "recorded_by_issuer": "",
    "tenant_id": "acme",
    "task_id": "task-1",
    "tool_name": "open_ticket",
    "idempotency_key": "key-1",
    "args": {"title": "Printer on fire"},
    "args_hash": "ab" * 32,
    "policy_version": "v1",
    "credential_scope": ["tickets:write"],
}


def _fields(attempt: Attempt) -> dict:
    return {name: value for name, value in vars(attempt).items() if name != "_state"}


def test_new_builds_what_model_init_builds():
    built = Attempt.new(**GIVEN)
    by_django = Attempt(**GIVEN)
    assert _fields(built) == _fields(by_django)
    assert list(vars(built)) == list(vars(by_django))
    for state in (built._state, by_django._state):
        assert (state.adding, state.db, state.fields_cache) == (True, None, {})
    assert built.tenant_id == "acme" and built.parent_id is None and built.pk is None


def test_new_gives_each_attempt_its_own_defaults():
    given = {k: v for k, v in GIVEN.items() if k not in ("attempt_id", "credential_scope")}
    first, second = Attempt.new(**given), Attempt.new(**given)
    assert first.credential_scope == second.credential_scope == []
    assert first.credential_scope is not second.credential_scope
    assert first._state is not second._state
    assert first.attempt_id != second.attempt_id


def test_new_goes_through_model_init_while_something_listens():
    seen = []

    def listener(sender, instance, **kwargs):
        seen.append(instance)

    signals.post_init.connect(listener, sender=Attempt)
    try:
        built = Attempt.new(**GIVEN)
    finally:
        signals.post_init.disconnect(listener, sender=Attempt)
    assert seen == [built]


def _letters(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "att_" + "".join(reversed(chars))


def test_an_attempt_id_spells_its_time_and_randomness_in_crockford_letters(monkeypatch):
    random = bytes(range(10, 20))
    monkeypatch.setattr(os, "urandom", lambda n: random[:n])
    monkeypatch.setattr(time, "time", lambda: 1_796_472_000.123)
    value = (1_796_472_000_123 << 80) | int.from_bytes(random, "big")
    assert new_attempt_id() == _letters(value)
    for bits in (0, 1, 2**80 - 1, 2**128 - 1):
        monkeypatch.setattr(time, "time", lambda bits=bits: (bits >> 80) / 1000)
        monkeypatch.setattr(
            os, "urandom", lambda n, bits=bits: (bits & (2**80 - 1)).to_bytes(10, "big")
        )
        assert new_attempt_id() == _letters(bits)
