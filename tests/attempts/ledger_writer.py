"""A separate writer process for the audit tests: records, claims and confirms attempts in a
loop, appending each attempt id to a log file only after its intent is committed.

    python -m tests.attempts.ledger_writer --log FILE --prefix P [--count N]
"""

from __future__ import annotations

import argparse
import os

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, default=10**9)
    parser.add_argument("--setup", action="store_true", help="create tenant acme and its tool")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
    django.setup()
    from attempts import ledger
    from attempts.models import EffectClass, Grant, Tenant, Tool
    from attempts.states import Actor

    if args.setup:
        tenant = Tenant.objects.create(slug="acme", name="Acme Corp")
        tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
        Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=[])

    agent = Actor.agent(f"writer-{args.prefix}")
    with open(args.log, "a", buffering=1) as log:
        for i in range(args.count):
            attempt, _ = ledger.record_intent(
                tenant="acme",
                task_id=f"{args.prefix}-task",
                tool_name="update_crm",
                idempotency_key=f"{args.prefix}:{i}",
                args={"n": i},
                actor=agent,
            )
            log.write(attempt.attempt_id + "\n")
            attempt, _ = ledger.claim_dispatch(attempt, actor=agent)
            ledger.confirm(attempt, result_ref=f"r-{args.prefix}-{i}", actor=agent)
    print("done", flush=True)


if __name__ == "__main__":
    main()
