"""``ledgerweb-mcp-gateway init --upstream ...`` (docs/integrations.md): a real MCP server
(the SDK's, on stdio) describes its tools with annotations; the command drafts a gateway
configuration and a ledger_config fragment from them (read-only passes through unrecorded,
idempotent is idempotent, destructive is critical and held by a suggested policy), each choice
commented; both files load as they are, and nothing is applied by the command."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attempts.actors import Actor
from attempts.models import ApprovalPolicy, Tool
from ledgerweb_client.mcp_gateway.config import load_config
from reconciliation import config as ledger_config
from reconciliation.config.document import read
from tests.conftest import REPO

SERVER = textwrap.dedent(
    '''
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("orders")


    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def list_orders(customer: str) -> list[str]:
        """The customer's orders."""
        return []


    @server.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
    def set_status(order: str, status: str) -> str:
        """Set an order's status."""
        return status


    @server.tool(annotations=ToolAnnotations(destructiveHint=True, idempotentHint=True))
    def delete_order(order: str) -> str:
        """Delete an order."""
        return order


    @server.tool()
    def create_order(customer: str, item: str, note: str = "") -> str:
        """Create an order (says nothing about itself)."""
        return item


    @server.tool(annotations=ToolAnnotations(destructiveHint=False))
    def add_note(order: str, text: str) -> str:
        """Add a note to an order."""
        return text


    if __name__ == "__main__":
        server.run("stdio")
    '''
)


def documented() -> list[str]:
    """docs/integrations.md's ``init`` command, as words, ``python`` being this interpreter."""
    page = (REPO / "docs" / "integrations.md").read_text(encoding="utf-8")
    [line] = re.findall(r"^```sh runs=mcp-init\n(.*?)\n```$", page, re.MULTILINE | re.DOTALL)
    words = [sys.executable if w == "python" else w for w in shlex.split(line)]
    upstream = words.index("--upstream") + 1
    words[upstream] = words[upstream].replace("python ", f"{sys.executable} ", 1)
    return words


def init(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*documented(), *extra],
        cwd=folder,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def drafted(tmp_path: Path) -> Path:
    (tmp_path / "orders_server.py").write_text(SERVER, encoding="utf-8")
    done = init(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 tools: 4 recorded" in done.stdout and "Review each commented choice" in done.stdout
    return tmp_path


def test_the_gateway_draft_records_all_but_read_only_tools_each_choice_commented(
    drafted: Path,
) -> None:
    text = (drafted / "gateway.toml").read_text()
    assert "# list_orders: read-only: passes through the gateway unrecorded" in text
    assert "# create_order: the server says: nothing (no annotations)" in text
    assert "review every choice" in text
    gateway = load_config(drafted / "gateway.toml")
    assert sorted(gateway.tools) == ["add_note", "create_order", "delete_order", "set_status"]
    assert (
        gateway.tools["create_order"].key.render(
            {"customer": "c1", "item": "i1"}, tenant="acme", task_id="t", tool="create_order"
        )
        == "create_order:acme:c1:i1"
    )  # the required arguments only
    (upstream,) = gateway.upstreams.values()
    assert upstream.command == sys.executable and upstream.args[-1].endswith("orders_server.py")


def test_the_ledger_fragment_is_a_valid_plan_with_the_annotations_choices(
    world, drafted: Path
) -> None:
    document = read(str(drafted / "ledger_config.toml"))
    assert ApprovalPolicy.objects.count() == 0 and not Tool.objects.filter(name="set_status")
    ledger_config.apply(document, actor=Actor.system("reviewed by a person"))
    classes = dict(
        Tool.objects.filter(
            name__in=["set_status", "delete_order", "create_order", "add_note"]
        ).values_list("name", "effect_class")
    )
    assert classes == {
        "set_status": "idempotent",  # idempotentHint, not destructive
        "delete_order": "idempotent",  # idempotent, and destructive: critical and held
        "create_order": "manual",  # no annotations: MCP's defaults (destructive)
        "add_note": "manual",  # neither idempotent nor destructive
    }
    critical = set(Tool.objects.filter(critical=True).values_list("name", flat=True))
    assert {"delete_order", "create_order"} <= critical and "set_status" not in critical
    held = dict(ApprovalPolicy.objects.values_list("tool_id", "approvals_needed"))
    assert held == {"delete_order": 2, "create_order": 2}
    assert not Tool.objects.filter(name="list_orders").exists()


def test_nothing_is_overwritten_without_force_and_an_unreachable_upstream_is_said(
    drafted: Path,
) -> None:
    before = (drafted / "gateway.toml").read_text()
    (drafted / "gateway.toml").write_text(before + "# edited by a person\n")
    refused = init(drafted)
    assert refused.returncode == 2 and "exists; --force overwrites" in refused.stderr
    assert (drafted / "gateway.toml").read_text().endswith("# edited by a person\n")
    assert init(drafted, "--force").returncode == 0
    assert (drafted / "gateway.toml").read_text() == before

    missing = subprocess.run(
        [sys.executable, "-m", "ledgerweb_client.mcp_gateway", "init"]
        + ["--upstream", "/nonexistent/server", "--config", "g2.toml"]
        + ["--ledger-config", "l2.toml", "--timeout", "10"],
        cwd=drafted,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "cannot read the upstream's tools" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (drafted / "g2.toml").exists()
