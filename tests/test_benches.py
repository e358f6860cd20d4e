"""The write-path benches, run short: they still work, and their baselines still write exactly
the ledger's rows (each bench compares them and stops if they differ). The figures themselves
are read from full runs on a quiet machine (docs/scaling.md), never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_write_path_bench_writes_the_ledgers_rows():
    if os.environ.get("DATABASE_URL"):
        pytest.skip("bench/write_path.py measures SQLite: runs once, on the SQLite pass")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = _run("bench/write_path.py", "--calls", "20", "--rounds", "1", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ratio API/raw:" in done.stdout
    assert "both wrote the same rows" in done.stdout


def test_pg_peers_bench_writes_the_ledgers_rows():
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.skip("bench/pg_peers.py needs PostgreSQL: runs on the PostgreSQL pass")
    import psycopg

    from bench.pg_peers import database_url

    prefix = f"test_peers_{uuid.uuid4().hex[:8]}"
    args = ["--seconds", "1", "--rounds", "1", "--procs", "1", "--systems", "ledger,raw,raw1"]
    try:
        done = _run("bench/pg_peers.py", *args, "--database-url", url, "--database-prefix", prefix)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ledger and raw wrote the same rows" in done.stdout
        assert "ledger and raw1 wrote the same rows" in done.stdout
        assert "ledger / raw1  at 1:" in done.stdout
        assert "ledger / raw   at 1:" in done.stdout
        assert "durable commit round trip" in done.stdout
    finally:
        with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
            for system in ("ledger", "raw", "raw1"):
                conn.execute(f'DROP DATABASE IF EXISTS "{prefix}_{system}" WITH (FORCE)')


def test_scale_bench_builds_a_valid_ledger_and_prints_every_figure(tmp_path):
    url = os.environ.get("DATABASE_URL")
    name = f"scale_test_{uuid.uuid4().hex[:8]}"
    where = ["--database", "postgres", "--database-url", url] if url else ["--database", "sqlite"]
    where += ["--name", name, "--dir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    short = ["--attempts", "300", "--repeat", "1", "--calls", "3", "--rounds", "1"]
    try:
        done = _run("bench/scale.py", *where, *short, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        for figure in (
            "bytes per attempt",
            "queue unknown deep",
            "prefix key broad",
            "overview cold",
            "approvals awaiting count",
            "export (JSON Lines",
            "write path (record, claim, attach, confirm",
        ):
            assert figure in out, figure
        # The loader's rows are the write path's: every chain and checkpoint verifies.
        assert "== verify_audit:" in out and out.split("== verify_audit:")[1].split("\n")[
            0
        ].endswith("ok")
        # Resumable: a second run builds nothing more.
        again = _run(
            "bench/scale.py", *where, *short, "--skip", "pages,export,verify,write", env=env
        )
        assert again.returncode == 0, again.stdout + again.stderr
        assert "300 attempts already built" in again.stdout
    finally:
        _run("bench/scale.py", *where, "--drop", env=env)
