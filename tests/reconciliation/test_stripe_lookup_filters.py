"""The Stripe lookup asks only for what can be this attempt's payment (created since the intent,
of its customer), reads a bounded number of pages, and takes a 429 as backoff (issue 23).

localstripe lacks the filters, so a real local HTTP server records what the adapter sends."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from attempts.models import EffectClass, Tool
from reconciliation.providers.base import Call, LookupStatus, SendStatus
from reconciliation.providers.stripe import StripePaymentIntentAdapter
from tests.http_handler import QuietHandler


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.mode = "empty"
        recorder = self

        class Handler(QuietHandler):
            def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
                self.reply(status, json.dumps(body).encode(), headers=headers)

            def do_GET(self) -> None:  # noqa: N802
                parts = urlsplit(self.path)
                recorder.requests.append((parts.path, parse_qs(parts.query)))
                if recorder.mode == "ratelimit":
                    error = {"error": {"type": "rate_limit_error", "message": "Too many"}}
                    self._answer(429, error, {"Retry-After": "7"})
                    return
                more = recorder.mode == "endless"
                n = len(recorder.requests)
                data = (
                    [{"id": f"pi_{n}", "object": "payment_intent", "metadata": {}}] if more else []
                )
                self._answer(
                    200,
                    {"object": "list", "data": data, "has_more": more, "url": parts.path},
                )

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                recorder.requests.append((urlsplit(self.path).path, {}))
                error = {"error": {"type": "rate_limit_error", "message": "Too many"}}
                self._answer(429, error, {"Retry-After": "7"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.stop()


@pytest.fixture
def adapter(recorder: Recorder, settings) -> StripePaymentIntentAdapter:
    settings.LEDGER = {**settings.LEDGER, "STRIPE_API_KEY": "sk_test_filters"}
    tool = Tool(
        name="stripe_charge",
        effect_class=EffectClass.RECONCILABLE,
        adapter="stripe",
        dispatch_url=recorder.base,
        timeout_seconds=2,
    )
    return StripePaymentIntentAdapter(tool)


CREATED = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def call(**args: Any) -> Call:
    return Call(
        attempt_id="a1",
        tenant="acme",
        tool_name="stripe_charge",
        idempotency_key="pay:1",
        args={"amount": 100, "currency": "eur", "payment_method": "pm_card_visa", **args},
        args_hash="0" * 64,
        created_at=CREATED,
    )


def test_the_lookup_sends_created_gte_with_slack_and_the_customer(adapter, recorder) -> None:
    answer = adapter.lookup(call(customer="cus_42"))
    assert answer.status == LookupStatus.NOT_FOUND
    [(path, query)] = recorder.requests
    assert path == "/v1/payment_intents"
    since = int(CREATED.timestamp()) - adapter.created_slack_seconds
    assert query["created[gte]"] == [str(since)]
    assert query["customer"] == ["cus_42"]
    assert query["limit"] == ["100"]


def test_without_a_customer_only_the_time_filter_is_sent(adapter, recorder) -> None:
    adapter.lookup(call())
    [(_, query)] = recorder.requests
    assert "customer" not in query and "created[gte]" in query


def test_the_lookup_reads_a_bounded_number_of_pages_then_says_ambiguous(adapter, recorder) -> None:
    recorder.mode = "endless"
    answer = adapter.lookup(call(customer="cus_42"))
    assert answer.status == LookupStatus.AMBIGUOUS
    assert len(recorder.requests) == adapter.max_pages
    # Every page keeps the filters.
    assert all("created[gte]" in q and q["customer"] == ["cus_42"] for _, q in recorder.requests)


def test_a_429_is_backoff_with_its_retry_after(adapter, recorder) -> None:
    recorder.mode = "ratelimit"
    answer = adapter.lookup(call())
    assert answer.status == LookupStatus.UNAVAILABLE
    assert answer.http_status == 429 and answer.retry_after == 7.0
    assert len(recorder.requests) == 1  # the library never retries on its own
    sent = adapter.send(call())
    assert sent.status == SendStatus.REFUSED and sent.retryable and sent.retry_after == 7.0
