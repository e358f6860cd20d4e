"""The worker waits for a SQLite database it cannot open yet, as it does for an unreachable
PostgreSQL: it says so and tries again, with no traceback, and starts working as soon as the
database opens (issue 40). A real ``manage.py reconcile`` process."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from tests.conftest import PYTHON, REPO, start_manage


def _env(path: Path) -> dict[str, str]:
    # Its own SQLite ledger, whatever database this test run uses.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGERWEB_", "DATABASE_"))}
    env.update(
        LEDGERWEB_DATA_DIR=str(path.parent.parent / "data"),
        LEDGERWEB_SQLITE_PATH=str(path),
        DJANGO_SETTINGS_MODULE="ledgerweb.settings",
        PYTHONPATH=str(REPO),
    )
    return env


def test_the_worker_waits_at_start_for_a_sqlite_folder_it_cannot_open(tmp_path: Path) -> None:
    folder = tmp_path / "ledger-folder"
    folder.write_text("not a folder: the database file cannot be created under it")
    database = folder / "ledger.sqlite3"
    env = _env(database)
    errors = tmp_path / "worker.err"
    with open(errors, "w") as err_file:
        worker = start_manage(
            ["reconcile", "--interval", "0.3", "--worker-id", "waits"],
            env=env,
            stderr=err_file,
        )
    try:
        deadline = time.monotonic() + 60
        while "the database cannot be opened yet, retrying" not in errors.read_text():
            assert worker.poll() is None, errors.read_text()
            assert time.monotonic() < deadline, errors.read_text()
            time.sleep(0.2)
        time.sleep(1.0)  # a few more tries
        assert worker.poll() is None, errors.read_text()
        # The folder becomes usable (a volume mounted, permissions fixed) and is migrated.
        folder.unlink()
        folder.mkdir()
        migrated = subprocess.run(
            [PYTHON, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, capture_output=True
        )
        assert migrated.returncode == 0, migrated.stderr
        deadline = time.monotonic() + 30
        while True:
            assert worker.poll() is None, errors.read_text()
            with sqlite3.connect(database) as db:
                beats = db.execute(
                    "SELECT count(*) FROM reconciliation_workerheartbeat WHERE worker_id = 'waits'"
                ).fetchone()[0]
            if beats:
                break
            assert time.monotonic() < deadline, "the worker never started once it could"
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    err = errors.read_text()
    assert worker.returncode == 0, err
    assert "the database cannot be opened yet, retrying" in err
    assert "Traceback" not in err and "Traceback" not in out
