"""Fixtures for the integrations: a live ledger (the real API over HTTP on 127.0.0.1) and a
client with an agent token for the acme tenant."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from attempts.models import ApprovalPolicy
from ledgerweb_client import LedgerClient
from ledgerweb_client.guard import LedgerContext
from tests.api.conftest import Tokens, tokens  # noqa: F401  (the fixture)
from tests.conftest import World
from tests.integrations.approvals import hold

# The adapters are client code: which database the ledger runs on does not change what they do,
# so their tests run once, on SQLite. The MCP gateway's crash test runs on both.
ON_POSTGRES = bool(os.environ.get("DATABASE_URL"))
sqlite_only = pytest.mark.skipif(ON_POSTGRES, reason="client-side adapter: runs once, on SQLite")

# The tool every adapter's tests guard: its key template, and a call urgent enough to be held.
KEY = "ticket:{tenant}:{args.customer}:{args.title}"
URGENT = {"customer": "cus_1", "title": "Printer on fire", "priority": 3}


class Tickets:
    """The outside world of these tests: what the tool function did, and how it fails."""

    def __init__(self) -> None:
        self.effects: list[dict[str, Any]] = []
        self.fail_with: BaseException | None = None

    def open_ticket(self, customer: str, title: str, priority: int = 3) -> dict[str, Any]:
        """Open a support ticket for a customer."""
        if self.fail_with is not None:
            raise self.fail_with
        ticket = {"id": f"T-{len(self.effects) + 1}", "title": title, "priority": priority}
        self.effects.append({"customer": customer, **ticket})
        return ticket


@pytest.fixture
def tickets() -> Tickets:
    """The ticket system the tool calls: every effect it had, counted."""
    return Tickets()


@pytest.fixture
def held_urgent(world: World) -> ApprovalPolicy:
    """A policy that holds the URGENT call (priority 2 and up) for a person's approval."""
    return hold("open_ticket", "args.priority >= 2")


@pytest.fixture
def ledger(live_server, tokens: Tokens) -> Iterator[LedgerClient]:  # noqa: F811
    with LedgerClient(live_server.url, tokens.acme, timeout=10) as client:
        yield client


@pytest.fixture
def acme(ledger: LedgerClient) -> LedgerContext:
    return LedgerContext(ledger, "acme", "task-int")
