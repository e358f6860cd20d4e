"""The write-path benches, run short: they still work, and their baselines still write exactly
the ledger's rows (each bench compares them and stops if they differ). The figures themselves
are read from full runs on a quiet machine (docs/scaling.md), never asserted here."""

from __future__ import annotations

import os
import re
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


def _env_without_database_url() -> dict[str, str]:
    """The bench chooses its database itself (SQLite, a URL it is given or its own server)."""
    return {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}


def _sqlite_bench(script: str, *args: str) -> str:
    """Run a bench that measures SQLite, once, on the SQLite pass: what it printed."""
    if os.environ.get("DATABASE_URL"):
        pytest.skip(f"{script} measures SQLite: runs once, on the SQLite pass")
    done = _run(script, *args, env=_env_without_database_url())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_write_path_bench_writes_the_ledgers_rows():
    out = _sqlite_bench("bench/write_path.py", "--calls", "20", "--rounds", "1")
    assert "ratio API/raw:" in out
    assert "both wrote the same rows" in out


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


def test_providers_bench_prints_the_healthy_tools_latency_ratio():
    out = _sqlite_bench("bench/providers.py", "--healthy", "4", "--bad", "6")
    assert "alone " in out and "with bad providers" in out
    assert "ratio with/alone: median" in out


def test_reconcile_bench_shows_the_calls_in_flight_fall_and_rise_as_the_provider_degrades():
    out = _sqlite_bench(
        "bench/reconcile.py",
        *("--mode", "degrade", "--degrade-size", "120", "--phase-seconds", "1"),
        *("--concurrency", "4"),
    )
    phases = [line.split()[2] for line in out.splitlines() if line.startswith("t=")]
    assert {"healthy", "slow", "429"} <= set(phases), out
    assert "settled 120 of 120" in out


def test_providers_bench_runs_the_trickles_of_every_framing():
    """bench/providers.py --modes framings: Content-Length with Connection: close, HTTP/1.0,
    close-delimited and chunked trickles beside the healthy tool, short."""
    out = _sqlite_bench("bench/providers.py", "--healthy", "4", "--bad", "4", "--modes", "framings")
    assert "trickle_closedelim" in out and "trickle_chunked" in out
    assert "ratio with/alone: median" in out


def test_verify_bench_verifies_a_ledger_loaded_as_the_write_path_writes_it(tmp_path):
    """bench/verify.py, short: its loader's ledger verifies (verify_audit says OK with one job
    and with two), and it prints the ratios against the write path and a bare SHA-256 loop."""
    url = os.environ.get("DATABASE_URL")
    env = _env_without_database_url()
    args = ["bench/verify.py", "--events", "2000", "--jobs", "2", "--rate-seconds", "0.3"]
    prefix = f"test_verify_{uuid.uuid4().hex[:8]}"
    if url:
        args += ["--database-url", url, "--database-prefix", prefix]
    else:
        env["LEDGERWEB_BENCH_DATA"] = str(tmp_path)
    try:
        done = _run(*args, "--regenerate", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "--jobs 1: 2000 events" in done.stdout
        assert "--jobs 2: 2000 events" in done.stdout
        assert "ratio verify/write path:" in done.stdout and "verify/bare SHA-256:" in done.stdout
    finally:
        if url:
            import psycopg

            from bench.pg_peers import database_url

            with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
                for name in ("2000", "rate"):
                    conn.execute(f'DROP DATABASE IF EXISTS "{prefix}_{name}" WITH (FORCE)')


def test_seal_bench_seals_and_signs_everything():
    assert "ratio seal/writes:" in _sqlite_bench("bench/seal.py", "--attempts", "50")


def test_scale_bench_builds_a_valid_ledger_and_prints_every_figure(tmp_path):
    url = os.environ.get("DATABASE_URL")
    name = f"scale_test_{uuid.uuid4().hex[:8]}"
    where = ["--database", "postgres", "--database-url", url] if url else ["--database", "sqlite"]
    where += ["--name", name, "--dir", str(tmp_path)]
    env = _env_without_database_url()
    short = ["--attempts", "300", "--repeat", "1", "--calls", "3", "--rounds", "1"]
    try:
        done = _run("bench/scale.py", *where, *short, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        # PostgreSQL seals beside the build, SQLite (one writer) after it; both end sealed.
        assert ("the sealer seals beside the build" in out) == bool(url)
        assert "sealed in" in out
        for figure in (
            "bytes per attempt",
            "queue unknown deep",
            "prefix key broad",
            "overview cold",
            "approvals awaiting count",
            "approvals inbox (mine)",
            "export (JSON Lines",
            "write path (record, claim, attach, confirm",
            # The permanent key and effect indexes are part of what an attempt costs.
            "attempts_recordedkey",
            "attempts_providereffect",
        ):
            assert figure in out, figure
        # The loader's rows are the write path's: every chain and checkpoint verifies.
        assert "== verify_audit:" in out and out.split("== verify_audit:")[1].split("\n")[
            0
        ].endswith("ok")
        # Resumable: a second run builds nothing more (and, told to skip the sealer, says
        # how many attempts it left unsealed: the first run's write-path calls).
        again = _run(
            "bench/scale.py", *where, *short, "--skip", "pages,export,verify,write,seal", env=env
        )
        assert again.returncode == 0, again.stdout + again.stderr
        assert "300 attempts already built" in again.stdout
        assert re.search(r"NOT SEALED \(--skip seal\): \d+ attempts are not", again.stdout)
        assert "sealed in" not in again.stdout
    finally:
        _run("bench/scale.py", *where, "--drop", env=env)


def test_sync_commit_bench_prints_both_modes_and_their_ratio():
    if not os.environ.get("DATABASE_URL"):
        pytest.skip(
            "bench/sync_commit.py makes its own PostgreSQL pair: runs on the PostgreSQL pass"
        )
    env = _env_without_database_url()
    done = _run("bench/sync_commit.py", "--calls", "10", "--rounds", "1", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "round 1 synchronous" in done.stdout
    assert re.search(r"ratio: [0-9.]+x", done.stdout), done.stdout


def test_api_bench_spreads_its_clients_over_the_workers_and_loses_no_intent():
    out = _sqlite_bench("bench/api.py", "--seconds", "1", "--rounds", "1")
    assert re.search(r"ratio intents/baseline: +[0-9.]+", out), out
    assert re.search(r"lost: 0$", out, re.MULTILINE), out
    # Four clients over three workers: two, one and one, in both phases.
    (spread,) = re.findall(r"cores used by each worker: view (.+), intents (.+)", out)
    for phase in spread:
        assert len(phase.split("/")) == 3 and "0.00" not in phase.split("/"), out
