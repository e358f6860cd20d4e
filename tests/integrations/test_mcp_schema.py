"""The MCP gateway records what the upstream acts on: arguments coerced and validated against
the upstream tool's ``inputSchema`` before anything is recorded (issue 23); the server's mcp
adapter looks effects up on one pooled upstream session."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from attempts.models import Tool
from ledgerweb_client.mcp_gateway.gateway import LEDGER_ERROR_CODES, Gateway, _Route
from ledgerweb_client.mcp_gateway.schema import SchemaMissing, SchemaRefusal, conform
from reconciliation.providers.base import Call, LookupStatus
from reconciliation.providers.mcp import SESSIONS, McpAdapter
from tests.conftest import PYTHON, REPO
from tests.reconciliation.conftest import BadProvider

TICKET = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "priority": {"type": "integer"},
        "amount": {"type": "number"},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "integer"}},
            "additionalProperties": False,
        },
    },
    "required": ["customer"],
    "additionalProperties": False,
}


def test_strings_are_coerced_where_the_schema_says_how() -> None:
    sent = {
        "customer": "c-1",
        "priority": "7",
        "amount": "12.5",
        "urgent": "true",
        "tags": ["1", 2],
        "address": {"zip": "10115", "note": "dropped"},
    }
    assert conform(sent, TICKET) == {
        "customer": "c-1",
        "priority": 7,
        "amount": 12.5,
        "urgent": True,
        "tags": [1, 2],
        "address": {"zip": 10115},
    }


def test_fields_the_upstream_does_not_take_are_dropped_only_when_it_says_so() -> None:
    assert conform({"customer": "c", "junk": 1}, TICKET) == {"customer": "c"}
    open_schema = {**TICKET, "additionalProperties": True}
    assert conform({"customer": "c", "junk": 1}, open_schema) == {"customer": "c", "junk": 1}


@pytest.mark.parametrize(
    "sent, where",
    [
        ({"customer": "c", "priority": "7.5"}, "priority"),
        ({"customer": "c", "priority": "seven"}, "priority"),
        ({"priority": 1}, "(arguments)"),
        ({"customer": 5}, "customer"),
    ],
)
def test_arguments_that_do_not_fit_are_refused_with_where_and_why(sent, where) -> None:
    with pytest.raises(SchemaRefusal, match=rf"{where}") as caught:
        conform(sent, TICKET)
    assert "inputSchema" in str(caught.value)


def test_the_gateway_refuses_with_an_invalid_params_mcp_error_before_recording() -> None:
    tool = types.Tool(name="create_ticket", input_schema=TICKET)
    route = _Route(upstream=None, client=None, tool=tool)  # type: ignore[arg-type]
    assert Gateway.conformed_arguments(route, {"customer": "c", "priority": "3"}) == {
        "customer": "c",
        "priority": 3,
    }
    with pytest.raises(MCPError) as caught:
        Gateway.conformed_arguments(route, {"customer": "c", "priority": "x"})
    assert caught.value.error.code == LEDGER_ERROR_CODES["invalid_call"]
    assert caught.value.error.data["code"] == "invalid_call"
    assert "priority" in caught.value.error.message


def test_without_jsonschema_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with pytest.raises(SchemaMissing, match=r"ledgerweb-client\[mcp\]"):
        conform({"customer": "c"}, TICKET)


@pytest.fixture
def gateway_config(tmp_path: Path, settings) -> Path:
    args = ["-m", "tests.integrations.mcp_upstream", "--db", str(tmp_path / "t.db")]
    args += ["--noun", "ticket"]
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
[ledger]
url = "http://127.0.0.1:9"
tenant = "acme"
task_id = "t"

[upstreams.tickets]
command = "{PYTHON}"
args = {args!r}
cwd = "{REPO}"

[tools.create_ticket]
upstream = "tickets"
ledger_tool = "open_ticket"
key = "ticket:{{tenant}}:{{args.customer}}"
lookup_tool = "find_ticket"
""".replace("'", '"'),
        encoding="utf-8",
    )
    settings.LEDGER = {**settings.LEDGER, "MCP_GATEWAY_CONFIG": str(path)}
    yield path
    SESSIONS.close()


def test_lookups_reuse_one_pooled_upstream_session_closed_with_the_worker(
    world, gateway_config
) -> None:
    Tool.objects.filter(name="open_ticket").update(adapter="mcp", timeout_seconds=30)
    adapter = McpAdapter(Tool.objects.get(name="open_ticket"))
    call = Call("a1", "acme", "open_ticket", "ticket:acme:c1", {"customer": "c1"}, "0" * 64)
    assert adapter.lookup(call).status == LookupStatus.NOT_FOUND
    [first] = [entry[0] for entry in SESSIONS._sessions.values()]
    again = McpAdapter(Tool.objects.get(name="open_ticket"))  # as the next pass builds it
    assert again.lookup(call).status == LookupStatus.NOT_FOUND
    [second] = [entry[0] for entry in SESSIONS._sessions.values()]
    assert second is first
    McpAdapter.close_shared()
    assert SESSIONS.open_sessions == 0


def test_an_upstream_slow_to_connect_holds_up_no_other_upstreams_lookups(
    world, gateway_config: Path, tmp_path: Path
) -> None:
    """One upstream that never answers its handshake (a streamable HTTP black hole) holds up
    its own lookups for their timeout, not another upstream's: each is its own bulkhead."""
    stuck_provider = BadProvider(tmp_path, "blackhole")
    with gateway_config.open("a", encoding="utf-8") as config:
        config.write(
            f"""
[upstreams.stuck]
url = "{stuck_provider.base}/mcp"

[tools.update_contact]
upstream = "stuck"
ledger_tool = "update_crm"
key = "crm:{{tenant}}:{{args.customer}}"
lookup_tool = "find_contact"
"""
        )
    Tool.objects.filter(name="open_ticket").update(adapter="mcp", timeout_seconds=30)
    Tool.objects.filter(name="update_crm").update(adapter="mcp", timeout_seconds=10)
    stuck = McpAdapter(Tool.objects.get(name="update_crm"))
    tickets = McpAdapter(Tool.objects.get(name="open_ticket"))
    answers: dict[str, LookupStatus] = {}

    def look_up_stuck() -> None:
        call = Call("a1", "acme", "update_crm", "crm:acme:c1", {"customer": "c1"}, "0" * 64)
        answers["stuck"] = stuck.lookup(call).status

    waiting = threading.Thread(target=look_up_stuck)
    try:
        waiting.start()
        deadline = time.monotonic() + 5
        while stuck_provider.hits() == 0:  # its handshake is on its way, and never answered
            assert time.monotonic() < deadline, "the stuck upstream was never called"
            time.sleep(0.02)
        call = Call("a2", "acme", "open_ticket", "ticket:acme:c1", {"customer": "c1"}, "0" * 64)
        assert tickets.lookup(call).status == LookupStatus.NOT_FOUND
        assert waiting.is_alive(), "the other upstream's lookup waited for the stuck one"
        waiting.join(timeout=20)
        assert answers["stuck"] == LookupStatus.UNAVAILABLE
    finally:
        stuck_provider.stop()
        waiting.join(timeout=20)
