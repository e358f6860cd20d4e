"""Property-based: random sequences of write-ahead API calls only ever make legal moves, every
move leaves exactly one event, refusals change nothing, and the chain stays linked."""

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from attempts import ledger
from attempts.models import Attempt, AttemptEvent
from attempts.states import LEGAL_MOVES
from tests.conftest import make_world

KEYS = st.sampled_from([f"key-{n}" for n in range(4)])
ARGS = st.sampled_from([{"n": 1}, {"n": 2}])
TOOLS = st.sampled_from(["update_crm", "open_ticket"])


@pytest.mark.django_db
class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # Each example runs in its own savepoint, rolled back in teardown, so every example
        # starts from the same empty ledger.
        self._example = transaction.atomic()
        self._example.__enter__()
        self.world = make_world()
        self.first_hash: dict[str, tuple[str, str]] = {}

    def _attempts(self):
        return list(Attempt.objects.order_by("id"))

    def _call(self, func, *args, **kwargs):
        """Run one API call; a refusal must leave the database exactly as it was."""
        before = (list(Attempt.objects.order_by("id").values()), AttemptEvent.objects.count())
        try:
            func(*args, **kwargs)
        except ledger.LedgerError:
            after = (list(Attempt.objects.order_by("id").values()), AttemptEvent.objects.count())
            assert after == before

    @rule(key=KEYS, args=ARGS, tool=TOOLS)
    def record(self, key, args, tool):
        self._call(
            ledger.record_intent,
            tenant="acme",
            task_id="t",
            tool_name=tool,
            idempotency_key=key,
            args=args,
            actor=self.world.agent,
        )
        stored = Attempt.objects.filter(idempotency_key=key).first()
        if stored is not None:
            seen = self.first_hash.setdefault(key, (stored.args_hash, stored.tool_name))
            assert seen == (stored.args_hash, stored.tool_name), "a key's record was overwritten"

    @precondition(lambda self: Attempt.objects.exists())
    @rule(data=st.data(), action=st.sampled_from(["claim", "unknown", "confirm", "fail", "retry"]))
    def act(self, data, action):
        attempt = data.draw(st.sampled_from(self._attempts()))
        agent = self.world.agent
        if action == "claim":
            self._call(ledger.claim_dispatch, attempt, actor=agent)
        elif action == "unknown":
            self._call(ledger.mark_unknown, attempt, reason="timeout", actor=agent)
        elif action == "confirm":
            ref = data.draw(st.sampled_from(["r1", "r2"]))
            self._call(ledger.confirm, attempt, result_ref=ref, actor=agent)
        elif action == "fail":
            self._call(ledger.fail, attempt, reason="refused", retryable=False, actor=agent)
        else:
            self._call(ledger.fail, attempt, reason="busy", retryable=True, actor=agent)

    def teardown(self):
        transaction.set_rollback(True)
        self._example.__exit__(None, None, None)

    @invariant()
    def only_legal_moves_each_with_one_event(self):
        for attempt in Attempt.objects.all():
            events = list(attempt.events.order_by("id"))
            assert events[0].action == "attempt.created"
            moves = [e for e in events[1:] if e.from_state != e.to_state]
            state = events[0].to_state
            for event in moves:
                assert event.from_state == state
                assert event.to_state in LEGAL_MOVES[state]
                state = event.to_state
            assert state == attempt.state
            # version counts every change, so each change left exactly one event
            assert attempt.version == len(events)

    @invariant()
    def each_attempts_chain_is_linked(self):
        last: dict[int, str] = {}
        for attempt_pk, prev, digest in AttemptEvent.objects.order_by("id").values_list(
            "attempt_id", "prev_hash", "hash"
        ):
            assert prev == last.get(attempt_pk, "0" * 64)
            last[attempt_pk] = digest


LedgerMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.django_db
class TestLedgerProperties(LedgerMachine.TestCase):
    pass
