"""What the approvals tests share: the demo-like policy that holds large charges for two
approvers, held intents recorded through the ledger, and a logged-in client per person."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.test import Client

from attempts.models import ApprovalPolicy, Attempt, State
from tests.conftest import agent_intent


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
    attempt, _ = agent_intent(world, key, tool=tool, args=args, task=f"task-{key}", tenant=tenant)
    assert attempt.state == State.AWAITING_APPROVAL
    return attempt


def login(world, name: str) -> Client:
    client = Client()
    client.force_login(getattr(world, name))
    return client
