"""After erasure no plaintext remains in the database's own files: SQLite's database file and WAL
(erasure overwrites freed space and checkpoints the WAL), PostgreSQL's table, TOAST and index
pages after ``VACUUM FULL`` and ``CHECKPOINT`` (read through ``pageinspect``, which reads the same
pages the files hold, and the files themselves when the test may read the data directory).

Before erasure the same search finds the text: the search can fail."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.db import connection

from attempts import audit_verify, erasure
from attempts.models import Attempt
from tests.attempts.audit_helpers import seal_all
from tests.attempts.test_erasure import NOTE, SECRET, second_admin, settled_attempt
from tests.conftest import make_world

pytestmark = pytest.mark.django_db(transaction=True)

NEEDLES = (SECRET.encode(), NOTE.encode())


def _sqlite_files() -> dict[str, bytes]:
    name = Path(connection.settings_dict["NAME"])
    return {str(path): path.read_bytes() for path in (name, Path(f"{name}-wal")) if path.exists()}


def _pg_pages() -> dict[str, bytes]:
    """Every page of every relation with storage in the test database (tables, TOAST, indexes,
    the catalogs: statistics may keep sample values), read with pageinspect."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        cursor.execute(
            "SELECT c.oid::regclass::text, pg_relation_size(c.oid) / current_setting('block_size')::int "
            "FROM pg_class c WHERE c.relkind IN ('r', 't', 'i', 'm') AND c.relpersistence = 'p'"
        )
        relations = cursor.fetchall()
        pages: dict[str, bytes] = {}
        for name, blocks in relations:
            chunks = []
            for block in range(int(blocks)):
                cursor.execute("SELECT get_raw_page(%s, 'main', %s)", [name, block])
                chunks.append(bytes(cursor.fetchone()[0]))
            pages[name] = b"".join(chunks)
    return pages


def _pg_files() -> dict[str, bytes] | None:
    """The files of every relation under the data directory, or None when this process may not
    read them (the server runs as another user, its directory mode 0700)."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data = Path(cursor.fetchone()[0])
        if not os.access(data, os.R_OK | os.X_OK):
            return None
        cursor.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c "
            "WHERE c.relkind IN ('r', 't', 'i', 'm') AND c.relpersistence = 'p'"
        )
        files = {}
        for (relative,) in cursor.fetchall():
            if relative is None:
                continue
            for path in data.glob(f"{relative}*"):
                files[str(path)] = path.read_bytes()
        return files


def _found(blobs: dict[str, bytes]) -> list[str]:
    return sorted(name for name, blob in blobs.items() for needle in NEEDLES if needle in blob)


def _vacuum_and_checkpoint() -> None:
    with connection.cursor() as cursor:
        tables = ", ".join(
            f'"{t}"'
            for t in connection.introspection.table_names(cursor)
            if t.startswith("attempts_")
        )
        cursor.execute(f"VACUUM FULL {tables}")  # noqa: S608 -- names from the catalog
        cursor.execute("CHECKPOINT")


def _horizon() -> list[tuple]:
    """Who holds back what VACUUM may remove (for the failure message)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname, pid, backend_xmin, xact_start, left(query, 80) FROM pg_stat_activity "
            "WHERE backend_xmin IS NOT NULL ORDER BY xact_start"
        )
        return cursor.fetchall()


def test_no_plaintext_remains_in_the_database_files_after_erasure():
    world = make_world()
    attempt = settled_attempt(world)
    admin2 = second_admin(world)
    if connection.vendor == "sqlite":
        assert _found(_sqlite_files()), "the search should see the plaintext before erasure"
    else:
        assert _found(_pg_pages()), "the search should see the plaintext before erasure"

    erasure.request_erasure(attempt, user=world.admin, reason="DSR-30")
    erasure.approve_erasure(attempt, user=admin2)
    assert Attempt.objects.get(pk=attempt.pk).args["[erased]"] is True

    if connection.vendor == "sqlite":
        files = _sqlite_files()
        assert files, connection.settings_dict["NAME"]
        assert _found(files) == []
        wal = Path(f"{connection.settings_dict['NAME']}-wal")
        assert not wal.exists() or wal.stat().st_size == 0  # checkpointed and truncated
        return
    # PostgreSQL keeps an updated row's old version until VACUUM rewrites the table, and
    # keeps it through VACUUM FULL too while any transaction could still see it (another
    # session's snapshot on this busy server): try again for a while.
    for _ in range(30):
        _vacuum_and_checkpoint()
        found = _found(_pg_pages())
        if not found:
            break
        time.sleep(1)
    assert found == [], _horizon()
    files = _pg_files()
    # None: the server's data directory is not readable here (mode 0700, another user); the
    # same pages were read through pageinspect above.
    if files is not None:
        assert _found(files) == []


def test_verify_audit_in_several_processes_and_since_a_checkpoint_after_erasure():
    """The committed ledger, read by verify_audit's worker processes and incrementally."""
    world = make_world()
    attempt = settled_attempt(world)
    settled_attempt(world, key="erase:acme:2")
    seal_all()
    first = audit_verify.verify_django_database(jobs=2)
    assert first.ok, first.render()
    erasure.request_erasure(attempt, user=world.admin, reason="DSR-31")
    erasure.approve_erasure(attempt, user=second_admin(world))
    since = audit_verify.verify_django_database(jobs=2, since=first.checkpoint)
    assert since.ok, since.render()
    seal_all()
    full = audit_verify.verify_django_database(jobs=2, max_unsealed_seconds=0)
    assert full.ok, full.render()
