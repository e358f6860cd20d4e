"""Request ids: each request has one, the caller's ``X-Request-ID`` when it is a sane token or a
new one, returned in the response's ``X-Request-ID``; every log line of the request carries it,
with the agent's trace id (from ``traceparent``) and the attempt the request concerns, and the
request itself is logged as fields, not as a Python repr."""

from __future__ import annotations

import json
import logging
import re

import pytest
from django.conf import settings

from ledgerweb.logs import JsonFormatter
from ledgerweb.request_context import RequestContextFilter
from tests.api.conftest import Api

pytestmark = pytest.mark.django_db

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Lines(logging.Handler):
    """The JSON lines the console handler would write, with its filters."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestContextFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines():
    handler = Lines()
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    logging.getLogger("ledgerweb.api").setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_the_console_handler_adds_the_request_fields() -> None:
    console = settings.LOGGING["handlers"]["console"]
    assert "request" in console["filters"]
    assert settings.LOGGING["filters"]["request"]["()"].endswith("RequestContextFilter")
    assert settings.MIDDLEWARE[0] == "ledgerweb.request_context.RequestIdMiddleware"


def test_the_callers_request_id_is_returned_and_on_every_line_with_trace_and_attempt(
    api: Api, lines: list[dict]
) -> None:
    made = api.post(
        "attempts",
        {
            "tenant": "acme",
            "task_id": "task-1",
            "tool_name": "open_ticket",
            "idempotency_key": "k:request-id",
            "args": {"title": "t"},
        },
        headers={"X-Request-ID": "lb-7f3a:42", "traceparent": TRACEPARENT},
    )
    assert made.status == 201
    assert made.headers["X-Request-ID"] == "lb-7f3a:42"
    attempt_id = made.body["attempt"]["attempt_id"]
    recorded = [line for line in lines if line.get("event") == "attempt.intent_recorded"]
    assert recorded, lines
    for line in lines:
        assert line["request_id"] == "lb-7f3a:42", line
        assert line["trace_id"] == TRACE_ID, line
    assert recorded[0]["attempt_id"] == attempt_id


def test_a_request_without_a_usable_id_gets_a_new_one_and_its_lines_name_the_attempt(
    api: Api, lines: list[dict]
) -> None:
    for header in ({}, {"X-Request-ID": "has spaces and\nlines"}, {"X-Request-ID": "x" * 129}):
        lines.clear()
        answer = api.get("attempts/att_missing0000000000000000", headers=header)
        assert answer.status == 404
        request_id = answer.headers["X-Request-ID"]
        assert re.fullmatch(r"[0-9a-f]{32}", request_id), request_id
        # Django's "Not Found" line: the request as fields, the id, the attempt from the URL.
        logged = [line for line in lines if line["logger"] == "django.request"]
        assert logged, lines
        assert logged[0]["request_id"] == request_id
        assert logged[0]["attempt_id"] == "att_missing0000000000000000"
        assert logged[0]["method"] == "GET"
        assert logged[0]["path"] == "/api/v1/attempts/att_missing0000000000000000"
        assert "request" not in logged[0] and "WSGIRequest" not in json.dumps(logged[0])


def test_lines_outside_a_request_carry_no_request_fields(lines: list[dict]) -> None:
    logging.getLogger("ledgerweb.test").warning("outside")
    assert (
        [line for line in lines if line["message"] == "outside"][0]
        .keys()
        .isdisjoint({"request_id", "trace_id", "attempt_id"})
    )
