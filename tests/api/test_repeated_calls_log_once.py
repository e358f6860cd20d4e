"""Repeating a call that changes nothing is answered as success and logs nothing: one log line
per change, not one per call (issue 15: 19 lines for one attempt)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.django_db


def api_log_lines(caplog, event: str) -> int:
    return sum(1 for r in caplog.records if r.name == "ledgerweb.api" and event in r.getMessage())


def test_repeated_calls_that_change_nothing_log_nothing(world, api, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ledgerweb.api")
    created = api.intent("k-log-1", **{"tool_name": "open_ticket"})
    attempt_id = created.body["attempt"]["attempt_id"]
    for _ in range(3):
        assert api.intent("k-log-1").status == 200
    assert api.post(f"attempts/{attempt_id}/dispatch").status == 200
    for _ in range(3):
        assert (
            api.post(
                f"attempts/{attempt_id}/provider-request", {"provider_request_id": "p1"}
            ).status
            == 200
        )
    for _ in range(4):
        answer = api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "r-1"})
        assert answer.status == 200
    assert api_log_lines(caplog, "attempt.intent_recorded") == 1
    assert api_log_lines(caplog, "attempt.provider_request") == 1
    assert api_log_lines(caplog, "attempt.confirmed") == 1

    other = api.intent("k-log-2").body["attempt"]["attempt_id"]
    api.post(f"attempts/{other}/dispatch")
    for _ in range(3):
        assert (
            api.post(f"attempts/{other}/fail", {"reason": "no", "retryable": False}).status == 200
        )
    assert api_log_lines(caplog, "attempt.failed") == 1

    third = api.intent("k-log-3").body["attempt"]["attempt_id"]
    api.post(f"attempts/{third}/dispatch")
    for _ in range(3):
        assert api.post(f"attempts/{third}/unknown", {"reason": "timeout"}).status == 200
    assert api_log_lines(caplog, "attempt.unknown") == 1
