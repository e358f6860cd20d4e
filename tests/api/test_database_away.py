"""An API call whose database connection fails answers 503 ``ledger_unavailable`` with
``Retry-After`` (issue 23); the real PostgreSQL restart is tests/test_database_away.py."""

from __future__ import annotations

from django.db import OperationalError

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
