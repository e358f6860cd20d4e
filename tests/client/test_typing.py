"""The client ships ``py.typed``, so its users' type checkers read it: ``mypy --strict`` finds
nothing in it, on this Python and as Python 3.10 (the oldest it supports: a name from 3.11 on,
like ``typing.Self`` at run time, is an error there).

mypy's cache is kept per machine, outside the checkout (``machine_cache``): warm, each run takes
about a second; the first on a machine analyses the frameworks the extras bring (about a minute).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, machine_cache


@pytest.mark.one_database  # typing does not depend on the database
@pytest.mark.parametrize("python_version", ["current", "3.10"])
def test_mypy_strict_finds_nothing_in_the_client(python_version) -> None:
    target = [] if python_version == "current" else ["--python-version", python_version]
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            *target,
            "--cache-dir",
            str(machine_cache("mypy")),
            "ledgerweb_client",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("Success: no issues found"), checked.stdout
