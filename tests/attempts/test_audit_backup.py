"""Backups and concurrent writers, with real processes on a real, committed database of their own
(a scratch SQLite file, or a scratch PostgreSQL database): a backup taken while another process
writes restores with every attempt committed before it started and a verifying chain; concurrent
writers never fork the chain (PostgreSQL advisory lock, SQLite BEGIN IMMEDIATE)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from tests.attempts.audit_helpers import fast_passwords  # noqa: F401
from tests.conftest import PYTHON, REPO

ON_POSTGRES = bool(os.environ.get("DATABASE_URL"))


def _pg_url(name: str) -> str:
    db = settings.DATABASES["default"]
    return (
        f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        f"/{name}"
    )


@pytest.fixture
def scratch(tmp_path):
    """Environment for subprocesses that use a fresh, migrated ledger with tenant acme."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="ledgerweb.settings", PYTHONPATH=str(REPO))
    env["LEDGERWEB_DATA_DIR"] = str(tmp_path / "data")
    admin = name = None
    if ON_POSTGRES:
        import psycopg

        name = f"{settings.DATABASES['default']['TEST']['NAME']}_s{uuid.uuid4().hex[:8]}"
        admin = psycopg.connect(_pg_url("postgres"), autocommit=True)
        admin.execute(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = _pg_url(name)
    else:
        env["LEDGERWEB_SQLITE_PATH"] = str(tmp_path / "ledger.sqlite3")
    try:
        for command in (
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
            [
                PYTHON,
                "-m",
                "tests.attempts.ledger_writer",
                "--setup",
                "--count",
                "0",
                "--log",
                os.devnull,
                "--prefix",
                "setup",
            ],
        ):
            done = subprocess.run(
                command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, done.stdout + done.stderr
        yield env
    finally:
        if admin is not None:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.close()


def start_writer(env: dict, log: Path, prefix: str, count: int | None = None) -> subprocess.Popen:
    command = [PYTHON, "-m", "tests.attempts.ledger_writer", "--log", str(log), "--prefix", prefix]
    if count is not None:
        command += ["--count", str(count)]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def logged(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if len(line) == 30]


def wait_for_lines(log: Path, n: int, writer: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(logged(log)) < n:
        if writer.poll() is not None:
            raise AssertionError(f"writer exited early: {writer.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, "writer too slow"
        time.sleep(0.05)


def manage(env: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=REPO,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.skipif(ON_POSTGRES, reason="backup_ledger copies SQLite; PostgreSQL uses pg_dump")
def test_backup_while_another_process_writes_restores_everything_committed(scratch, tmp_path):
    log = tmp_path / "committed.log"
    writer = start_writer(scratch, log, "bk")
    try:
        wait_for_lines(log, 30, writer)
        committed_before = set(logged(log))
        backup = tmp_path / "backups" / "ledger.sqlite3"
        backup.parent.mkdir()
        result = manage(scratch, "backup_ledger", "--out", str(backup))
        assert result.returncode == 0, result.stdout + result.stderr
        # The writer kept going during and after the copy.
        wait_for_lines(log, len(logged(log)) + 10, writer)
    finally:
        writer.terminate()
        writer.wait(timeout=30)
    assert "integrity ok" in result.stdout and "events verify" in result.stdout
    assert backup.is_file() and not list(backup.parent.glob(".*partial"))

    # Restore: the backup file becomes a ledger database again.
    restored = tmp_path / "restored" / "ledger.sqlite3"
    restored.parent.mkdir()
    shutil.copyfile(backup, restored)
    conn = sqlite3.connect(restored)
    try:
        in_backup = {row[0] for row in conn.execute("SELECT attempt_id FROM attempts_attempt")}
    finally:
        conn.close()
    missing = committed_before - in_backup
    assert not missing, f"{len(missing)} committed attempts are missing from the backup"
    assert len(set(logged(log))) > len(in_backup), "the backup was not taken mid-stream"

    # verify_audit on the restored copy: as a file, and as the configured database.
    as_file = manage(scratch, "verify_audit", "--sqlite", str(restored))
    assert as_file.returncode == 0 and as_file.stdout.startswith("OK:"), as_file.stderr
    as_live = manage(scratch, "verify_audit", LEDGERWEB_SQLITE_PATH=str(restored))
    assert as_live.returncode == 0 and as_live.stdout.startswith("OK:"), as_live.stderr
    # And the live ledger, which went on growing, verifies too.
    live = manage(scratch, "verify_audit")
    assert live.returncode == 0, live.stderr


@pytest.mark.skipif(ON_POSTGRES, reason="SQLite backup")
def test_a_tampered_ledger_is_not_backed_up_as_good(scratch, tmp_path):
    writer = start_writer(scratch, tmp_path / "w.log", "t", count=3)
    assert writer.wait(timeout=120) == 0
    conn = sqlite3.connect(scratch["LEDGERWEB_SQLITE_PATH"])
    conn.execute("DROP TRIGGER attemptevent_no_update")
    conn.execute("UPDATE attempts_attemptevent SET reason = 'x' WHERE id = 2")
    conn.commit()
    conn.close()
    target = tmp_path / "bad.sqlite3"
    result = manage(scratch, "backup_ledger", "--out", str(target))
    assert result.returncode == 1
    assert "does not verify" in result.stderr and "event 2" in result.stderr
    assert not target.exists() and (tmp_path / "bad.sqlite3.unverified").exists()


def test_backup_refuses_to_overwrite_and_names_bad_targets(db, tmp_path):
    if ON_POSTGRES:
        with pytest.raises(CommandError, match="pg_dump"):
            call_command("backup_ledger", "--out", str(tmp_path / "x.sqlite3"))
        return
    target = tmp_path / "one.sqlite3"
    call_command("backup_ledger", "--out", str(target), stdout=open(os.devnull, "w"))
    assert target.is_file()
    with pytest.raises(CommandError, match="exists"):
        call_command("backup_ledger", "--out", str(target))
    with pytest.raises(CommandError, match="not a directory"):
        call_command("backup_ledger", "--out", str(tmp_path / "nope" / "x.sqlite3"))


@pytest.mark.slow
def test_concurrent_writers_do_not_fork_the_chain(scratch, tmp_path):
    writers = [start_writer(scratch, tmp_path / f"w{i}.log", f"cw{i}", count=20) for i in range(3)]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err.decode()[-2000:]
    result = manage(scratch, "verify_audit")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{3 * 20 * 3} events verify" in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(not ON_POSTGRES, reason="the PostgreSQL backup path (docs/backup.md)")
@pytest.mark.skipif(not shutil.which("pg_dump"), reason="needs pg_dump and pg_restore")
def test_postgres_dump_restores_and_verifies(scratch, tmp_path):
    import psycopg

    writer = start_writer(scratch, tmp_path / "w.log", "pg", count=5)
    assert writer.wait(timeout=120) == 0
    dump = tmp_path / "ledger.dump"
    subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", f"--file={dump}", scratch["DATABASE_URL"]],
        check=True,
        timeout=120,
    )
    restored = f"{scratch['DATABASE_URL'].rsplit('/', 1)[1]}_r"
    with psycopg.connect(_pg_url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{restored}"')
    try:
        subprocess.run(
            ["pg_restore", "--no-owner", f"--dbname={_pg_url(restored)}", str(dump)],
            check=True,
            timeout=120,
        )
        result = manage(scratch, "verify_audit", DATABASE_URL=_pg_url(restored))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "15 events verify" in result.stdout
        with psycopg.connect(_pg_url(restored)) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE attempts_attemptevent SET reason = 'x'")
    finally:
        with psycopg.connect(_pg_url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{restored}" WITH (FORCE)')
