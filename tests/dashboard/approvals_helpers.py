"""What the approvals tests share: the demo-like policy that holds large charges for two
approvers, held intents recorded through the ledger, and a logged-in client per person."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.test import Client

from attempts import ledger
from attempts.models import ApprovalPolicy, Attempt, State


def hold_big_charges(**extra: Any) -> ApprovalPolicy:
    """``charge_card`` above 100,000 cents waits for two approvers (charge_card is critical)."""
    fields = {
        "name": "big-charges",
        "tool_id": "charge_card",
        "condition": "args.amount_cents > 100000",
        "approvals_needed": 2,
        "max_wait": dt.timedelta(hours=10),
        **extra,
    }
    return ApprovalPolicy.objects.create(**fields)


def held_intent(
    world, key: str, args: dict[str, Any], *, tool: str = "charge_card", tenant: str = "acme"
) -> Attempt:
    """An intent recorded by the world's agent that a policy holds."""
    attempt, _ = ledger.record_intent(
        tenant=tenant,
        task_id=f"task-{key}",
        tool_name=tool,
        idempotency_key=key,
        args=args,
        actor=world.agent,
    )
    assert attempt.state == State.AWAITING_APPROVAL
    return attempt


def login(world, name: str) -> Client:
    client = Client()
    client.force_login(getattr(world, name))
    return client
