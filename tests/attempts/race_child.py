"""Child process for the multi-process race: record the same intent and try to claim it.

Run as ``python -m tests.attempts.race_child START_AT KEY``; prints one JSON line.
"""

import json
import sys
import time

import django


def main() -> None:
    start_at, key = float(sys.argv[1]), sys.argv[2]
    django.setup()
    from attempts import ledger
    from attempts.states import Actor

    actor = Actor.agent(f"racer-{sys.argv[3] if len(sys.argv) > 3 else '?'}")
    time.sleep(max(0.0, start_at - time.time()))
    result: dict = {}
    try:
        attempt, created = ledger.record_intent(
            tenant="acme",
            task_id="race",
            tool_name="charge_card",
            idempotency_key=key,
            args={"amount": 1200, "currency": "EUR", "card": "tok_4242"},
            actor=actor,
        )
        attempt, claimed = ledger.claim_dispatch(attempt, actor=actor)
        result = {"attempt_id": attempt.attempt_id, "created": created, "claimed": claimed}
    except Exception as exc:  # reported to the parent, which fails the test
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
