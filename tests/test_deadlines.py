"""Nothing the server starts may hang it: every child process it runs to completion has a
deadline (``timeout=``), wherever it is run from."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attempts", "reconciliation", "ledgerweb", "ledgerweb_client")
WAITS = {"run", "call", "check_call", "check_output"}


def runs_without_deadline(source: str) -> list[int]:
    """Lines of ``subprocess.run`` (and call, check_call, check_output) with no ``timeout=``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WAITS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "subprocess"
        and "timeout" not in {k.arg for k in node.keywords}
    ]


def test_every_child_process_run_to_completion_has_a_deadline() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in runs_without_deadline(path.read_text())
    ]
    assert missing == []
    assert runs_without_deadline("subprocess.run(['ledgerweb', 'migrate'], check=False)") == [1]
