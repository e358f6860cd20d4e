"""A short soak (bench/soak.py): agents through gunicorn while gunicorn workers, the reconcile
worker and the demo provider are SIGKILLed at random (and, on PostgreSQL, a throwaway database
server the soak starts itself is restarted once); every invariant must hold at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from bench.private_postgres import PG_BIN
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_a_short_soak_keeps_every_invariant() -> None:
    database = "postgres" if os.environ.get("DATABASE_URL") else "sqlite"
    if database == "postgres" and not (PG_BIN / "initdb").exists() and not shutil.which("initdb"):
        pytest.skip("PostgreSQL server binaries are not installed")
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--database", database, "--seconds", "15"]
        + ["--rate", "4", "--kill-every", "2.5", "--drain", "60", "--seed", "13"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "acknowledged intents lost        0" in out
    assert "duplicate non-idempotent effects 0" in out
    assert "unsettled outside MANUAL_REVIEW  0" in out
    assert "chain verified                   yes" in out
    kills = next(line for line in out.splitlines() if line.startswith("kills"))
    for target in ("gunicorn_worker", "reconcile_worker", "demo_provider"):
        assert target in kills, out[-3000:]
    if database == "postgres":
        assert "'postgres': 1" in out
