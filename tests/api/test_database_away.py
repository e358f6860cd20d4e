"""An API call whose database connection fails answers 503 ``ledger_unavailable`` with
``Retry-After`` (issue 23); the real PostgreSQL restart is tests/test_database_away.py."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from attempts import ledger


def test_an_api_call_whose_database_connection_fails_is_a_503(api, monkeypatch) -> None:
    def lost(*args, **kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(ledger, "get_attempt", lost)
    api.client.raise_request_exception = False
    answer = api.get("attempts/att_01M8T5FA9Y72EJPBVHSCDQ45F0")
    assert answer.status == 503
    assert answer.body["error"]["code"] == "ledger_unavailable"
    assert answer.headers["Retry-After"] == "2"


def test_a_call_that_reaches_a_read_only_server_is_a_503_and_the_next_call_reconnects(
    api, transactional_db
) -> None:
    """After a failover a kept connection may reach a server that no longer takes writes: the
    call answers 503 ``ledger_unavailable`` with ``Retry-After`` (never a 500), that connection
    is closed, and the next call connects again (to the host that takes writes)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: a read-only server")
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    api.client.raise_request_exception = False
    answer = api.intent("failover:read-only:1")
    assert answer.status == 503, answer.body
    assert answer.body["error"]["code"] == "ledger_unavailable"
    assert answer.headers["Retry-After"] == "2"
    assert connection.connection is None
    answer = api.intent("failover:read-only:1")
    assert answer.status == 201, answer.body
