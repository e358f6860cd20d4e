"""``manage.py backup_ledger``: a consistent online copy of the SQLite ledger, verified."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from attempts import audit_verify
from ledgerweb.cli import command_line


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Command(BaseCommand):
    help = (
        "Copy the SQLite ledger while agents keep writing, using SQLite's online backup API (one "
        "consistent snapshot; writers are not blocked in WAL mode), then verify the copy: "
        "PRAGMA integrity_check and the whole audit chain, each attempt against its history. "
        "The copy is renamed into place only when both pass. Prints the head hash to keep "
        "elsewhere. On PostgreSQL use pg_dump (see docs/backup.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--out",
            type=Path,
            help="backup file, or a directory to put a timestamped file in "
            "(default: LEDGERWEB_DATA_DIR/backups/)",
        )

    def handle(self, *args, **options) -> None:
        if connection.vendor != "sqlite":
            raise CommandError(
                "backup_ledger copies the embedded SQLite ledger; this deployment uses "
                f"{connection.vendor}. Use pg_dump --format=custom and verify the restored copy "
                f"with {command_line('verify_audit')} (docs/backup.md)."
            )
        source = Path(settings.DATABASES["default"]["NAME"]).resolve()
        if not source.is_file():
            raise CommandError(f"no ledger database at {source}")
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        out: Path = options["out"] or Path(settings.DATA_DIR) / "backups"
        if out.is_dir() or (options["out"] is None):
            out.mkdir(parents=True, exist_ok=True)
            out = out / f"ledger-{stamp}.sqlite3"
        if not out.parent.is_dir():
            raise CommandError(f"cannot write {out}: {out.parent} is not a directory")
        if out.exists():
            raise CommandError(f"{out} exists; choose another name (backups are never overwritten)")
        if out.resolve() == source:
            raise CommandError("the backup cannot be the live database")
        temp = out.with_name(f".{out.name}.{os.getpid()}.partial")
        started = time.monotonic()
        try:
            self._copy(source, temp)
            self._check_integrity(temp)
            report = audit_verify.verify_sqlite_file(str(temp))
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if not report.ok:
            kept = out.with_name(out.name + ".unverified")
            os.replace(temp, kept)
            raise CommandError(
                f"the copy does not verify; kept for inspection at {kept}\n{report.render()}"
            )
        os.replace(temp, out)
        _fsync_dir(out.parent)
        seconds = time.monotonic() - started
        self.stdout.write(
            f"backup {out}: {out.stat().st_size} bytes in {seconds:.2f}s; integrity ok; "
            f"{report.events} events verify; head {report.head_hash} (event {report.head_id})"
        )

    def _copy(self, source: Path, temp: Path) -> None:
        busy_ms = int(settings.DATABASES["default"].get("OPTIONS", {}).get("timeout", 30) * 1000)
        src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=busy_ms / 1000)
        dst = sqlite3.connect(temp)
        try:
            # One step (pages=-1): the whole copy comes from one read snapshot, so it is
            # consistent; in WAL mode writers carry on meanwhile.
            src.backup(dst)
            # A backup is one self-contained file: no -wal beside it.
            dst.execute("PRAGMA journal_mode=DELETE")
            dst.commit()
        finally:
            dst.close()
            src.close()
        with temp.open("rb+") as handle:
            os.fsync(handle.fileno())

    def _check_integrity(self, path: Path) -> None:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = [row[0] for row in conn.execute("PRAGMA integrity_check")]
            foreign = conn.execute("PRAGMA foreign_key_check").fetchall()
        finally:
            conn.close()
        if rows != ["ok"]:
            raise CommandError("integrity_check failed on the copy: " + "; ".join(rows[:10]))
        if foreign:
            raise CommandError(f"foreign_key_check found {len(foreign)} dangling references")
