"""The ``langchain`` extra installs langchain-core only: its module imports without LangGraph,
and a held call, which nothing can pause there, is the ordinary LedgerToolException."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

SCRIPT = r"""
import sys
sys.modules["langgraph"] = None  # as if not installed: any import of it fails
from ledgerweb_client.guard import ToolCallAwaitingApproval
from ledgerweb_client.integrations import langchain

held = ToolCallAwaitingApproval.__new__(ToolCallAwaitingApproval)
held.message, held.attempt, held.sent, held.dashboard_url = "held", None, False, None
try:
    langchain.pause_for_approval(held)
except langchain.LedgerToolException as exc:
    print("held call:", type(exc).__name__, type(exc.__cause__).__name__)
"""


def test_the_langchain_module_imports_without_langgraph() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "held call: LedgerToolException ModuleNotFoundError" in done.stdout, done.stdout
