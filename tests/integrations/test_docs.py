"""docs/integrations.md runs as written: every ```python block without a file name is run as a
script (in order, in one folder) against a live ledger; blocks named ``file=NAME`` are written
there first (the MCP example's upstream server and the gateway's configuration)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attempts.models import Attempt, State
from tests.conftest import REPO
from tests.integrations.conftest import Tokens, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), sqlite_only]

DOC = REPO / "docs" / "integrations.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, file name or None, code) of every fenced block, in order."""
    found = []
    for language, info, code in BLOCK.findall(DOC.read_text(encoding="utf-8")):
        name = re.search(r"file=(\S+)", info)
        found.append((language, name.group(1) if name else None, code))
    return found


def test_the_page_has_an_example_for_each_integration() -> None:
    code = "\n".join(code for language, name, code in blocks() if language == "python")
    for needle in (
        "@ledgered(",
        "ledgered_tool(",
        "ToolNode(",
        "ledgered_function_tool(",
        "ledgerweb_client.mcp_gateway",
        "find_ticket",
    ):
        assert needle in code, needle


def test_every_example_runs_against_a_live_ledger(live_server, tokens: Tokens, tmp_path) -> None:
    env = {
        **os.environ,
        "LEDGERWEB_URL": live_server.url,
        "LEDGERWEB_TOKEN": tokens.acme,
        "PYTHONPATH": str(REPO),
        # "python" in the gateway's configuration is this interpreter.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    outputs = []
    for index, (language, name, code) in enumerate(blocks()):
        if name is not None:
            (tmp_path / name).write_text(code, encoding="utf-8")
        elif language == "python":
            script = tmp_path / f"example_{index}.py"
            script.write_text(code, encoding="utf-8")
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"example {index}:\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
    assert "refused: idempotency_conflict" in outputs[0]
    assert "acme-co is now won" in outputs[2]
    assert "'replayed': True" in outputs[3]
    assert set(Attempt.objects.values_list("state", flat=True)) == {State.OUTCOME_CONFIRMED}
    assert sorted(Attempt.objects.values_list("tool_name", flat=True)) == [
        "open_ticket",  # LangGraph's
        "open_ticket",  # the MCP gateway's
        "send_invoice_email",
        "update_crm",
    ]
    # The MCP example's upstream acted once for its two calls.
    assert (tmp_path / "tickets.json").read_text().count('"id"') == 1
