"""Fixtures for retention and archives: a signing key (archived attempts carry receipts), and
a ledger with attempts that each retention rule should or should not move."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from django.utils import timezone

from attempts import ledger, log
from attempts.models import Attempt, RetentionRule
from attempts.states import Actor
from tests.attempts.audit_helpers import seal_all

AGENT = Actor.agent("test-agent")


@pytest.fixture
def key_file(tmp_path, settings):
    path = tmp_path / "log.key"
    verifier = log.write_key_file(path, "example.test/ledger")
    settings.TLOG = {
        **settings.TLOG,
        "KEY_FILE": str(path),
        "ORIGIN": "example.test/ledger",
        "SIGNER_STATE": str(tmp_path / "signer.state"),
    }
    return verifier


def make(tenant: str, tool: str, key: str, *, settle: bool = True) -> Attempt:
    """One attempt through the safe order: confirmed (settled), or left UNKNOWN."""
    attempt, _ = ledger.record_intent(
        tenant=tenant,
        task_id=f"task-{key}",
        tool_name=tool,
        idempotency_key=key,
        args={"customer": key, "email": f"{key}@example.test"},
        actor=AGENT,
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=AGENT)
    attempt = ledger.attach_provider_request(attempt, f"req-{key}", actor=AGENT)
    if settle:
        return ledger.confirm(attempt, result_ref=f"receipt-{key}", actor=AGENT)
    return ledger.mark_unknown(attempt, reason="timeout", actor=AGENT)


def age(attempts: list[Attempt], days: int) -> None:
    """Make the attempts' last change ``days`` old (outside the hashed history)."""
    Attempt.objects.filter(pk__in=[a.pk for a in attempts]).update(
        updated_at=timezone.now() - dt.timedelta(days=days)
    )


@dataclass
class Ledger:
    due: list[Attempt]  # what the rule acme/update_crm (30 days) moves
    stays: dict[str, Attempt]  # why each other one stays


@pytest.fixture
def ledger_with_rules(world, key_file) -> Ledger:
    due = [make("acme", "update_crm", f"old:{i}") for i in range(5)]
    stays = {
        "unsettled": make("acme", "update_crm", "old:unknown", settle=False),
        "younger": make("acme", "update_crm", "young:0"),
        "other tool": make("acme", "open_ticket", "old:ticket"),
        "other tenant": make("globex", "update_crm", "old:globex"),
    }
    age(due + [stays["unsettled"], stays["other tool"], stays["other tenant"]], 40)
    age([stays["younger"]], 10)
    seal_all()
    # Changed after the last seal: settled and old, but not sealed.
    unsealed = make("acme", "update_crm", "old:unsealed")
    age([unsealed], 40)
    stays["unsealed"] = unsealed
    RetentionRule.objects.create(tenant_id="acme", tool_id="update_crm", archive_after_days=30)
    RetentionRule.objects.create(tenant_id="globex", tool_id="open_ticket", archive_after_days=30)
    return Ledger(due=due, stays=stays)
