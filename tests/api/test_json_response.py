"""An attempt's answer is encoded by an encoder built once (``api.json_response``): the bytes
and headers JsonResponse writes for the same data."""

from __future__ import annotations

import datetime as dt
import decimal

from django.http import JsonResponse

from attempts.api import json_response

DATA = {
    "attempt": {
        "attempt_id": "att_01M93GBYDY864P4PVDZGH5A666",
        "args": {"title": "Drucker brennt \u2014 \U0001f525", "n": [1, 2.5, None, True], "e": {}},
        "credential_scope": ["tickets:write"],
        "created_at": "2026-12-05T16:25:03.681000Z",
        "owner": None,
    },
    "created": True,
    "when": dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC),
    "amount": decimal.Decimal("12.50"),
}


def test_an_answer_is_what_jsonresponse_writes():
    for status in (200, 201, 202):
        ours, django = json_response(DATA, status), JsonResponse(DATA, status=status)
        assert ours.content == django.content
        assert ours.status_code == django.status_code == status
        assert dict(ours.headers) == dict(django.headers)
