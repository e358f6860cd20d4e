"""Fixtures for the integrations: a live ledger (the real API over HTTP on 127.0.0.1) and a
client with an agent token for the acme tenant."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ledgerweb_client import LedgerClient
from ledgerweb_client.guard import LedgerContext
from tests.api.conftest import Tokens, tokens  # noqa: F401  (the fixture)

# The adapters are client code: which database the ledger runs on does not change what they do,
# so their tests run once, on SQLite. The MCP gateway's crash test runs on both.
ON_POSTGRES = bool(os.environ.get("DATABASE_URL"))
sqlite_only = pytest.mark.skipif(ON_POSTGRES, reason="client-side adapter: runs once, on SQLite")


@pytest.fixture
def ledger(live_server, tokens: Tokens) -> Iterator[LedgerClient]:  # noqa: F811
    with LedgerClient(live_server.url, tokens.acme, timeout=10) as client:
        yield client


@pytest.fixture
def acme(ledger: LedgerClient) -> LedgerContext:
    return LedgerContext(ledger, "acme", "task-int")
