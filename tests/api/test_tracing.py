"""OpenTelemetry: the W3C traceparent an agent sends is kept on its attempt (found from the trace,
linked to the tracing UI), a malformed one is refused, and the ledger's steps (intent, claim,
confirm, lookup, settle) are exported as spans of the agent's trace to a real OTLP/HTTP receiver
on 127.0.0.1 that decodes the protobuf export requests. Off, nothing of OpenTelemetry loads."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time

import pytest

from attempts import tracing
from attempts.models import Attempt, State
from reconciliation.reconciler import Reconciler
from tests.api.conftest import intent_body
from tests.conftest import PYTHON, REPO, child_env
from tests.dashboard.conftest import login
from tests.http_handler import QuietHandler
from tests.reconciliation.conftest import DemoProvider, make_due

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"


def record(api, key: str, traceparent: str | None = TRACEPARENT, **overrides):
    headers = {"traceparent": traceparent} if traceparent is not None else {}
    return api.call("POST", "attempts", intent_body(key, **overrides), headers=headers)


def test_the_traceparent_is_kept_and_the_attempt_found_from_its_trace(api, world):
    answer = record(api, "trace:1")
    assert answer.status == 201
    attempt = answer.body["attempt"]
    assert attempt["traceparent"] == TRACEPARENT and attempt["trace_id"] == TRACE
    found = api.get(f"attempts?trace_id={TRACE}")
    assert [a["attempt_id"] for a in found.body["attempts"]] == [attempt["attempt_id"]]
    assert api.get("attempts?trace_id=" + "a" * 32).body["attempts"] == []
    assert api.get("attempts?trace_id=XYZ").status == 422
    # A replay with another traceparent is the same intent: the first trace stays.
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    again = record(api, "trace:1", traceparent=other)
    assert again.status == 200 and again.body["attempt"]["trace_id"] == TRACE
    # The history records it with the intent.
    row = Attempt.objects.get(attempt_id=attempt["attempt_id"])
    assert row.events.get(action="attempt.created").details["traceparent"] == TRACEPARENT


def test_an_intent_without_a_traceparent_has_none(api, world):
    answer = record(api, "trace:none", traceparent=None)
    assert answer.status == 201
    assert answer.body["attempt"]["traceparent"] is None
    assert answer.body["attempt"]["trace_id"] is None


@pytest.mark.parametrize(
    "bad",
    [
        "nonsense",
        f"00-{TRACE.upper()}-{SPAN}-01",  # uppercase hex
        f"ff-{TRACE}-{SPAN}-01",  # version ff
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has four fields
        f"00-{TRACE[:-1]}-{SPAN}-01",
        "",  # sent but empty (only no header at all means no trace)
        "  ",
    ],
)
def test_a_malformed_traceparent_is_refused_and_nothing_is_recorded(api, world, bad):
    answer = record(api, "trace:bad", traceparent=bad)
    assert answer.status == 422, answer.body
    assert answer.body["error"]["code"] == "invalid_traceparent"
    assert "traceparent" in answer.body["error"]["message"]
    assert not Attempt.objects.filter(idempotency_key="trace:bad").exists()


def test_a_later_version_is_read_for_its_first_four_fields(api, world):
    answer = record(api, "trace:v1", traceparent=f"01-{TRACE}-{SPAN}-00-what-comes-next")
    assert answer.status == 201
    assert answer.body["attempt"]["traceparent"] == f"00-{TRACE}-{SPAN}-00"


def test_the_attempt_page_links_the_trace(api, world, settings):
    settings.TRACING = {**settings.TRACING, "TRACE_URL": "https://tempo.example/trace/{trace_id}"}
    attempt_id = record(api, "trace:page").body["attempt"]["attempt_id"]
    viewer = login(world.viewer)
    page = viewer.get(f"/attempts/{attempt_id}/").content.decode()
    assert f'data-testid="trace-id">{TRACE}</code>' in page
    assert f'href="https://tempo.example/trace/{TRACE}"' in page
    settings.TRACING = {**settings.TRACING, "TRACE_URL": ""}
    page = viewer.get(f"/attempts/{attempt_id}/").content.decode()
    assert TRACE in page and "tempo.example" not in page


# ---------------------------------------------------------------------------------------------
# Spans over OTLP/HTTP


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: decodes each protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.spans: list = []
        self.requests: list[tuple[str, str]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class ReceiverHandler(QuietHandler):
    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, self.headers.get("Content-Type", "")))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get(
                "service.name"
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {}
                    for a in span.attributes:
                        value = a.value
                        attributes[a.key] = (
                            value.string_value
                            if value.HasField("string_value")
                            else value.bool_value
                            if value.HasField("bool_value")
                            else value.int_value
                        )
                    self.server.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "attributes": attributes,
                            "service": service,
                        }
                    )
        answer = ExportTraceServiceResponse().SerializeToString()
        self.reply(200, answer, "application/x-protobuf")


@pytest.fixture
def receiver(settings):
    server = Receiver()
    tracing.reset()
    settings.TRACING = {
        **settings.TRACING,
        "OTLP_ENDPOINT": server.endpoint,
        "SERVICE_NAME": "ledger-under-test",
    }
    yield server
    tracing.reset()
    server.shutdown()
    server.server_close()


def exported(server: Receiver, count: int) -> list[dict]:
    assert tracing.flush()
    deadline = time.monotonic() + 10
    while len(server.spans) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.spans


def test_the_agents_steps_are_spans_of_its_trace(api, world, receiver):
    attempt_id = record(api, "trace:spans").body["attempt"]["attempt_id"]
    assert api.post(f"attempts/{attempt_id}/dispatch").body["dispatch"] is True
    assert api.post(f"attempts/{attempt_id}/confirm", {"result_ref": "receipt-1"}).status == 200
    spans = exported(receiver, 3)
    assert [s["name"] for s in spans] == ["ledger.intent", "ledger.claim", "ledger.confirm"]
    for span in spans:
        assert span["trace_id"] == TRACE and span["parent_span_id"] == SPAN
        assert span["attributes"]["ledger.attempt_id"] == attempt_id
        assert span["attributes"]["ledger.tenant"] == "acme"
        assert span["service"] == "ledger-under-test"
    assert spans[0]["attributes"]["ledger.created"] is True
    assert spans[2]["attributes"]["ledger.state"] == State.OUTCOME_CONFIRMED
    assert receiver.requests[0] == ("/v1/traces", "application/x-protobuf")


def test_an_intent_without_a_traceparent_starts_its_own_trace(api, world, receiver):
    record(api, "trace:root", traceparent=None)
    [span] = exported(receiver, 1)
    assert span["name"] == "ledger.intent" and span["parent_span_id"] == ""
    assert span["trace_id"] != TRACE


@pytest.fixture
def demo(world, tmp_path):
    """The demo provider as a real process, every tool pointed at it."""
    provider = DemoProvider(tmp_path)
    provider.configure_tools()
    yield provider
    provider.stop()


def test_recovery_lookups_and_settlements_are_spans_of_the_agents_trace(api, demo, receiver):
    answer = record(api, "trace:recover", tool_name="open_ticket", args={"n": 1})
    attempt_id = answer.body["attempt"]["attempt_id"]
    api.post(f"attempts/{attempt_id}/dispatch")
    api.post(f"attempts/{attempt_id}/unknown", {"reason": "agent timed out"})
    demo.inject("open_ticket", "trace:recover", {"n": 1})
    make_due(Attempt.objects.get(attempt_id=attempt_id))
    Reconciler(worker_id="trace-worker", concurrency=2).run_pass()
    assert Attempt.objects.get(attempt_id=attempt_id).state == State.OUTCOME_CONFIRMED
    spans = exported(receiver, 4)
    by_name = {s["name"]: s for s in spans}
    assert {"ledger.lookup", "ledger.settle"} <= set(by_name), [s["name"] for s in spans]
    lookup, settle = by_name["ledger.lookup"], by_name["ledger.settle"]
    assert lookup["trace_id"] == settle["trace_id"] == TRACE
    assert lookup["attributes"]["ledger.lookup_status"].endswith("found")
    assert settle["attributes"]["ledger.state"] == State.OUTCOME_CONFIRMED
    assert settle["attributes"]["ledger.attempt_id"] == attempt_id


def test_with_tracing_off_nothing_of_opentelemetry_is_imported():
    code = (
        "import sys, django; django.setup()\n"
        "from attempts import api, ledger, tracing\n"
        "from reconciliation import reconciler\n"
        "with tracing.span('ledger.intent') as s: pass\n"
        "print(s is None, sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = child_env()
    env.pop("LEDGERWEB_OTLP_ENDPOINT", None)
    done = subprocess.run(
        [PYTHON, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True []", done.stdout + done.stderr
