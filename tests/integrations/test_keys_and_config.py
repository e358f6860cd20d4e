"""Key templates and the gateway's configuration file: every mistake is caught when the template
or file is read, with a message naming it, never at the first tool call."""

from __future__ import annotations

import pytest

from ledgerweb_client.guard import KeyTemplate, json_receipt, read_json_receipt
from ledgerweb_client.mcp_gateway.config import ConfigError, parse_config
from ledgerweb_client.mcp_gateway.receipts import kept_result, result_ref_for
from tests.integrations.conftest import sqlite_only

pytestmark = sqlite_only


def test_key_templates_render_arguments_faithfully() -> None:
    template = KeyTemplate("{{lit}}:{tenant}:{args.order.id}:{args.n}:{args.tags}")
    key = template.render({"order": {"id": "請求書-42"}, "n": 7, "tags": ["b", "a"]}, tenant="t1")
    assert key == '{lit}:t1:請求書-42:7:["b","a"]'
    with pytest.raises(ValueError, match="needs argument 'order.id'"):
        template.render({"n": 1, "tags": []}, tenant="t1")
    for bad in ("{args.}", "{nope}", "open { brace", ""):
        with pytest.raises(ValueError):
            KeyTemplate(bad)


def test_receipts_keep_small_results_and_digest_large_ones() -> None:
    assert read_json_receipt(json_receipt({"id": "T-1"})) == {"id": "T-1"}
    assert json_receipt("x" * 600).startswith("sha256:")
    ref = result_ref_for({"structuredContent": {"id": "T-1", "body": "long"}}, ["id"])
    assert kept_result(ref)["structuredContent"] == {"id": "T-1"}
    assert kept_result(result_ref_for({"content": [{"type": "text", "text": "ok"}]})) == {
        "content": [{"type": "text", "text": "ok"}]
    }
    assert kept_result("lookup:T-1") is None


UPSTREAM = {"a": {"url": "http://127.0.0.1:1/mcp"}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"upstreams": {}}, "at least one upstream"),
        ({"upstreams": {"a": {"url": "x", "command": "y"}}}, "exactly one of command"),
        ({"upstreams": {"a": {"url": "ftp://h"}}}, "must start with http"),
        ({"upstreams": UPSTREAM, "tools": {"t": {}}}, "[tools.t] key must be"),
        ({"upstreams": UPSTREAM, "tools": {"t": {"key": "k", "colour": 1}}}, "unknown setting"),
        (
            {"upstreams": UPSTREAM, "tools": {"t": {"key": "k", "error_result": "x"}}},
            "error_result",
        ),
        (
            {
                "upstreams": UPSTREAM,
                "tools": {"t": {"key": "k", "lookup_args": {"q": "{task_id}"}}},
            },
            "lookup_args: unknown field {task_id}",
        ),
        (
            {"upstreams": {**UPSTREAM, "b": {"command": "c"}}, "tools": {"t": {"key": "k"}}},
            "needs upstream",
        ),
        *(
            (
                {"upstreams": UPSTREAM, "tools": {"t": {"key": "k", "approval_wait_seconds": v}}},
                "approval_wait_seconds must be a number from 0 to 60",
            )
            for v in (-1, 61, True, "5")
        ),
        (
            {
                "upstreams": UPSTREAM,
                "tools": {
                    "t": {"key": "k", "ledger_tool": "x"},
                    "u": {"key": "k", "ledger_tool": "x"},
                },
            },
            "more than one tool",
        ),
    ],
)
def test_configuration_mistakes_are_named(data, message) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(data, path="gw.toml")
    assert message in str(error.value) and str(error.value).startswith("gw.toml: ")


def test_a_good_configuration() -> None:
    config = parse_config(
        {
            "ledger": {"tenant": "acme"},
            "upstreams": UPSTREAM,
            "tools": {"create": {"key": "c:{args.id}", "lookup_tool": "find"}},
        }
    )
    tool = config.tools["create"]
    assert (tool.upstream, tool.ledger_tool, tool.receipt, tool.error_result) == (
        "a",
        "create",
        False,
        "unknown",
    )
    assert tool.approval_wait_seconds == 0
    assert tool.lookup_arguments({"key": "K"}, {}) == {"idempotency_key": "K"}
    waits = parse_config(
        {"upstreams": UPSTREAM, "tools": {"t": {"key": "k", "approval_wait_seconds": 15}}}
    )
    assert waits.tools["t"].approval_wait_seconds == 15.0
    assert config.tool_for_ledger_tool("create") is tool
