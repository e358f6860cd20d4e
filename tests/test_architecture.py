"""The house plan's arrows hold (.importlinter): no import cycle, counting imports inside
functions; the client imports nothing of the server; the ledger never imports reconciliation;
and each module of the ledger imports only from the floors below its own. A new cycle or a
forbidden arrow fails here, with import-linter's account of the imports that make it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Does not depend on the database: one pass runs it.
pytestmark = pytest.mark.one_database("postgres")


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--no-cache", "--config", str(REPO / ".importlinter")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
