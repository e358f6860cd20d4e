"""Child process for the provider-effect race: confirm one attempt with a provider request id
that other processes confirm their own attempts with at the same instant.

Run as ``python -m tests.attempts.effect_race_child START_AT ATTEMPT_ID PROVIDER_ID``; prints one
JSON line.
"""

import json
import sys
import time

import django


def main() -> None:
    start_at, attempt_id, provider_id = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    django.setup()
    from attempts import ledger
    from attempts.states import Actor

    actor = Actor.agent(f"confirmer-{attempt_id[-4:]}")
    time.sleep(max(0.0, start_at - time.time()))
    try:
        ledger.confirm(
            attempt_id,
            result_ref=f"receipt:{provider_id}",
            provider_request_id=provider_id,
            actor=actor,
        )
        result = {"confirmed": True}
    except ledger.StateConflict as exc:
        result = {"confirmed": False, "code": exc.code}
    except Exception as exc:  # reported to the parent, which fails the test
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
