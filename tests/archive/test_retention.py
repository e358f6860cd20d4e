"""Retention moves exactly what the rules say; archive, prune, verify and restore round trip;
the events' append-only trigger allows exactly the archived deletion."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from attempts import audit_verify, verify_export
from attempts.actors import Actor
from attempts.models import Archive, ArchivedAttempt, Attempt, AttemptEvent, ConfigEvent
from reconciliation.archive import archive
from reconciliation.archive.store import FolderStore
from tests.attempts.audit_helpers import seal_all
from tests.conftest import REPO

pytestmark = pytest.mark.django_db

OPERATOR = Actor.system("test-archivist")


def _run(tmp_path, **kwargs) -> archive.RunResult:
    return archive.run(store=FolderStore(tmp_path / "archives"), actor=OPERATOR, **kwargs)


def test_retention_moves_exactly_what_the_rules_say(ledger_with_rules, tmp_path):
    due = {a.attempt_id for a in ledger_with_rules.due}
    result = _run(tmp_path, batch_size=2)
    assert result.attempts == len(due) and result.removed == len(due)
    assert set(ArchivedAttempt.objects.values_list("attempt_id", flat=True)) == due
    assert not Attempt.objects.filter(attempt_id__in=due).exists()
    assert not AttemptEvent.objects.filter(attempt__attempt_id__in=due).exists()
    for why, attempt in ledger_with_rules.stays.items():
        assert Attempt.objects.filter(pk=attempt.pk).exists(), why
    # Batches of two: three files, counted and hashed in the manifest.
    folder = tmp_path / "archives" / result.name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [f["attempts"] for f in manifest["files"]] == [2, 2, 1]
    assert manifest["attempts"] == len(due) and manifest["events"] == len(due) * 4
    # The archive is in the history with its manifest's hash.
    event = ConfigEvent.objects.get(subject=f"archive:{result.name}")
    assert event.action == "archived"
    assert event.after["manifest_sha256"] == result.manifest_sha256
    # A second run finds nothing more.
    assert _run(tmp_path).attempts == 0


def test_dry_run_counts_and_changes_nothing(ledger_with_rules, tmp_path):
    rows = {f"{r.tenant_id}/{r.tool_id}": n for r, n in archive.plan()}
    assert rows == {"acme/update_crm": 5, "globex/open_ticket": 0}
    before = Attempt.objects.count()
    call_command("archive", "run", "--to", str(tmp_path / "a"), "--dry-run")
    assert Attempt.objects.count() == before
    assert not (tmp_path / "a").exists()


def test_no_signed_checkpoint_no_archive(world, tmp_path, settings):
    from attempts.models import RetentionRule
    from tests.archive.conftest import age, make

    attempt = make("acme", "update_crm", "unsigned:1")
    age([attempt], 40)
    seal_all()
    RetentionRule.objects.create(tenant_id="acme", tool_id="update_crm", archive_after_days=30)
    with pytest.raises(archive.ArchiveError, match="no signed checkpoint"):
        _run(tmp_path)
    assert Attempt.objects.filter(pk=attempt.pk).exists()


def _raw_delete_events(attempt: Attempt) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM attempts_attemptevent WHERE attempt_id = %s", [attempt.pk])


def test_a_stray_delete_of_history_is_still_refused(ledger_with_rules, tmp_path):
    keep = ledger_with_rules.stays["other tenant"]
    with pytest.raises(DatabaseError, match="append-only"):
        _raw_delete_events(keep)
    _run(tmp_path)
    # Still refused after an archive run, for every attempt not archived.
    with pytest.raises(DatabaseError, match="append-only"):
        _raw_delete_events(keep)
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE attempts_attemptevent SET reason = 'x' WHERE attempt_id = %s", [keep.pk]
            )
    # The list of archived attempts (what the trigger trusts) is append-only itself.
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM attempts_archivedattempt")
    assert AttemptEvent.objects.filter(attempt=keep).count() == keep.chain_length


def test_archive_prune_verify_round_trip(ledger_with_rules, tmp_path, key_file):
    result = _run(tmp_path)
    seal_all()  # the history's record of the archive is sealed too
    root = tmp_path / "archives"
    # The database verifies: the removed attempts are accounted for by their archive...
    report = audit_verify.verify_django_database(log_keys=[key_file], archive_dir=root)
    assert report.ok, report.render()
    assert any("5 removed attempts are archived in 1 archives" in n for n in report.notes)
    # ...and without the archive at hand it says so, still verifying what it has.
    report = audit_verify.verify_django_database(log_keys=[key_file])
    assert report.ok, report.render()
    assert any("give --archive FOLDER" in n for n in report.notes)
    # The command line, as an operator runs it.
    call_command("verify_audit", "--archive", str(root), "--jobs", "1")
    # The standalone verifier, with the log's key only.
    status = verify_export.main(["--archive", str(root / result.name), "--log-key", str(key_file)])
    assert status == 0
    other = __import__("attempts.log", fromlist=["x"]).generate_key("example.test/ledger")[1]
    assert verify_export.main(["--archive", str(root / result.name), "--log-key", str(other)]) == 1


def test_a_deleted_attempt_that_no_archive_holds_is_missing(ledger_with_rules, tmp_path):
    from tests.attempts.audit_helpers import drop_triggers, sql

    _run(tmp_path)
    keep = ledger_with_rules.stays["other tenant"]
    drop_triggers()
    sql("DELETE FROM attempts_attemptevent WHERE attempt_id = %s", [keep.pk])
    sql("DELETE FROM attempts_attempt WHERE id = %s", [keep.pk])
    report = audit_verify.verify_django_database()
    assert [p.kind for p in report.problems] == ["missing"], report.render()


@pytest.mark.parametrize("damage", ["file", "missing file", "manifest", "missing manifest"])
def test_a_tampered_or_missing_archive_file_is_caught(ledger_with_rules, tmp_path, damage):
    result = _run(tmp_path)
    root = tmp_path / "archives"
    folder = root / result.name
    first = folder / "attempts-00001.jsonl.gz"
    if damage == "file":
        lines = gzip.decompress(first.read_bytes()).decode().splitlines()
        record = json.loads(lines[0])
        record["attempt"]["args"]["email"] = "someone-else@example.test"
        lines[0] = json.dumps(record)
        first.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        expected = "attempts-00001.jsonl.gz has SHA-256"
    elif damage == "missing file":
        first.unlink()
        expected = "file attempts-00001.jsonl.gz is missing"
    elif damage == "manifest":
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["attempts"] = 4
        (folder / "manifest.json").write_text(json.dumps(manifest))
        expected = "manifest.json has SHA-256"
    else:
        (folder / "manifest.json").unlink()
        expected = "manifest.json is missing"
    report = audit_verify.verify_django_database(archive_dir=root)
    assert not report.ok
    assert report.problems[0].kind == "archive"
    assert expected in report.render(), report.render()
    assert result.name in report.render()


def test_an_edited_archive_with_a_recomputed_manifest_is_caught(ledger_with_rules, tmp_path):
    """Someone rewrites a file and its manifest entry: the manifest's hash no longer matches the
    history; and the standalone verifier, given no history, still sees the broken receipt."""
    import hashlib

    result = _run(tmp_path)
    folder = tmp_path / "archives" / result.name
    first = folder / "attempts-00001.jsonl.gz"
    lines = gzip.decompress(first.read_bytes()).decode().splitlines()
    record = json.loads(lines[0])
    record["events"][-1]["reason"] = "edited"
    lines[0] = json.dumps(record)
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    first.write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = verify_export.verify_archives([folder])
    assert not report.ok
    # Chain format 3 commits to the reason through its salted text digest.
    assert "not the text its hash committed to: they were edited" in report.render()


def test_restore_loads_archives_into_a_scratch_database(ledger_with_rules, tmp_path):
    result = _run(tmp_path)
    root = tmp_path / "archives"
    scratch = tmp_path / "scratch.sqlite3"
    call_command("archive", "restore", "--from", str(root), "--into-sqlite", str(scratch))
    env_python = [sys.executable, str(REPO / "manage.py")]
    from reconciliation.archive.restore import scratch_env

    env = scratch_env(sqlite=str(scratch))
    shown = subprocess.run(
        [
            *env_python,
            "shell",
            "-c",
            "from attempts.models import Attempt; "
            "print(sorted(Attempt.objects.values_list('idempotency_key', flat=True)))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert shown.stdout.strip().splitlines()[-1] == str(
        sorted(a.idempotency_key for a in ledger_with_rules.due)
    )
    # The restored histories verify in the scratch database.
    report = audit_verify.verify_sqlite_file(str(scratch))
    assert report.ok, report.render()
    assert f"{len(ledger_with_rules.due) * 4} events verify" in report.render()
    # Restoring twice loads nothing new; a tampered archive loads nothing.
    call_command("archive", "restore", "--from", str(root), "--into-sqlite", str(scratch))
    first = root / result.name / "attempts-00001.jsonl.gz"
    first.write_bytes(first.read_bytes()[:-8] + b"\0" * 8)
    other = tmp_path / "other.sqlite3"
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="has SHA-256"):
        call_command("archive", "restore", "--from", str(root), "--into-sqlite", str(other))


def test_restore_refuses_the_ledgers_own_database(ledger_with_rules, tmp_path):
    from django.core.management.base import CommandError

    from tests.conftest import child_env

    _run(tmp_path)
    if connection.vendor == "sqlite":
        into = ["--into-sqlite", str(connection.settings_dict["NAME"])]
    else:
        into = ["--into-database-url", child_env()["DATABASE_URL"]]
    with pytest.raises(CommandError, match="the ledger's own database"):
        call_command("archive", "restore", "--from", str(tmp_path / "archives"), *into)


def test_a_whole_ledger_export_after_archiving_verifies_offline(ledger_with_rules, tmp_path):
    """The export still carries every log leaf (the tree keeps them); the removed attempts'
    histories are in the archive, checked beside it."""
    import io

    result = _run(tmp_path)
    seal_all()
    out = tmp_path / "audit.jsonl"
    call_command("export_audit", "--format", "jsonl", "--out", str(out), stdout=io.StringIO())
    # The removed attempts' seals are there, each with the archive that holds it: archived,
    # not deleted (a seal with neither events nor an archive is [missing]).
    assert out.read_text().count('"type": "archived"') == ArchivedAttempt.objects.count() > 0
    assert verify_export.main([str(out)]) == 0
    assert (
        verify_export.main([str(out), "--archive", str(tmp_path / "archives" / result.name)]) == 0
    )


def test_archive_rows_record_where_each_attempt_went(ledger_with_rules, tmp_path):
    result = _run(tmp_path)
    archived = Archive.objects.get(name=result.name)
    assert archived.location == str((tmp_path / "archives" / result.name).resolve())
    gone = ArchivedAttempt.objects.get(idempotency_key="old:0")
    assert gone.archive == archived and gone.provider_request_id == "req-old:0"


def test_restore_into_a_scratch_postgresql_database(ledger_with_rules, tmp_path):
    """A separate DATABASE_URL: the scratch database is created for the investigation, the
    restore migrates it and loads the verified archive."""
    import psycopg

    from tests.conftest import child_env

    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL scratch database beside a PostgreSQL ledger")
    _run(tmp_path)
    ledger_url = child_env()["DATABASE_URL"]
    server = ledger_url.rsplit("/", 1)[0]
    name = f"{connection.settings_dict['NAME']}_scratch"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        call_command(
            "archive",
            "restore",
            "--from",
            str(tmp_path / "archives"),
            "--into-database-url",
            f"{server}/{name}",
        )
        with psycopg.connect(f"{server}/{name}") as scratch:
            keys = [
                row[0]
                for row in scratch.execute(
                    "SELECT idempotency_key FROM attempts_attempt ORDER BY idempotency_key"
                )
            ]
            events = scratch.execute("SELECT count(*) FROM attempts_attemptevent").fetchone()[0]
        assert keys == sorted(a.idempotency_key for a in ledger_with_rules.due)
        assert events == len(keys) * 4
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_archive_verify_names_an_archive_gone_from_its_folder(ledger_with_rules, tmp_path):
    import io
    import shutil

    from django.core.management.base import CommandError

    result = _run(tmp_path)
    out = io.StringIO()
    call_command("archive", "verify", "--from", str(tmp_path / "archives"), stdout=out)
    assert f"OK: {result.name}: 5 attempts verify" in out.getvalue()
    shutil.rmtree(tmp_path / "archives" / result.name)
    (tmp_path / "archives").mkdir(exist_ok=True)
    out = io.StringIO()
    with pytest.raises(CommandError, match="some archives do not verify"):
        call_command("archive", "verify", "--from", str(tmp_path / "archives"), stdout=out)
    assert f"[archive] {result.name}: manifest.json is missing" in out.getvalue()


def test_erased_attempts_are_archived_erased_and_pending_erasures_wait(world, key_file, tmp_path):
    """docs/privacy.md, "Archived attempts": an attempt erased before retention is archived
    with only the markers and still verifies with its receipt; one archived without erasure
    keeps its plaintext there; one whose erasure waits for approval stays in the database; the
    archive line carries the erasure requests, which leave the database with the attempt."""
    from attempts import erasure
    from attempts.models import ErasureRequest, RetentionRule
    from tests.archive.conftest import age
    from tests.attempts.test_erasure import (
        NOTE,
        REFUSAL,
        SECRET,
        erase,
        second_admin,
        settled_attempt,
    )

    admin2 = second_admin(world)
    erased = erase(world, settled_attempt(world, key="erase:acme:archived"), admin2)
    kept = settled_attempt(world, key="erase:acme:kept")
    withdrawn = settled_attempt(world, key="erase:acme:withdrawn")
    erasure.request_erasure(withdrawn, user=world.admin, reason="asked by mistake")
    erasure.cancel_erasure(withdrawn, user=admin2)
    waiting = settled_attempt(world, key="erase:acme:waiting")
    erasure.request_erasure(waiting, user=world.admin, reason="DSR-18")
    age([erased, kept, withdrawn, waiting], 40)
    RetentionRule.objects.create(tenant_id="acme", tool_id="update_crm", archive_after_days=30)
    seal_all()
    result = _run(tmp_path)
    assert (result.attempts, result.removed) == (3, 3)
    seal_all()
    root = tmp_path / "archives"
    lines = {
        json.loads(line)["attempt"]["attempt_id"]: line
        for path in sorted((root / result.name).glob("attempts-*.jsonl.gz"))
        for line in gzip.decompress(path.read_bytes()).decode().splitlines()
    }
    assert set(lines) == {erased.attempt_id, kept.attempt_id, withdrawn.attempt_id}
    for text in (SECRET, NOTE, REFUSAL):
        assert text not in lines[erased.attempt_id], text
        assert text in lines[kept.attempt_id], text
    assert '"attempt.erased"' in lines[erased.attempt_id]
    requests = {a: json.loads(lines[a])["erasures"] for a in lines}
    assert [r["status"] for r in requests[erased.attempt_id]] == ["erased"]
    assert requests[withdrawn.attempt_id] == [
        {
            "requested_by": "admin",
            "reason": "asked by mistake",
            "requested_at": requests[withdrawn.attempt_id][0]["requested_at"],
            "status": "cancelled",
            "decided_by": "admin2",
            "decided_at": requests[withdrawn.attempt_id][0]["decided_at"],
        }
    ]
    assert requests[kept.attempt_id] == []
    assert list(Attempt.objects.values_list("attempt_id", flat=True)) == [waiting.attempt_id]
    assert list(ErasureRequest.objects.values_list("attempt_id", flat=True)) == [waiting.pk]
    report = audit_verify.verify_django_database(log_keys=[key_file], archive_dir=root)
    assert report.ok, report.render()
    status = verify_export.main(["--archive", str(root / result.name), "--log-key", str(key_file)])
    assert status == 0


def test_an_erasure_asked_for_while_archiving_keeps_the_attempt(
    world, key_file, tmp_path, monkeypatch
):
    """A request made after the attempt's line was written, even one withdrawn at once, keeps
    the attempt in the database: its file does not hold the request (a later run archives
    it with it)."""
    from attempts import erasure
    from attempts.models import ErasureRequest, RetentionRule
    from tests.archive.conftest import age
    from tests.attempts.test_erasure import second_admin, settled_attempt

    admin2 = second_admin(world)
    attempt = settled_attempt(world, key="erase:acme:late")
    age([attempt], 40)
    RetentionRule.objects.create(tenant_id="acme", tool_id="update_crm", archive_after_days=30)
    seal_all()
    real_remove = archive._remove

    def ask_then_remove(*args, **kwargs):
        erasure.request_erasure(attempt, user=world.admin, reason="DSR-19")
        erasure.cancel_erasure(attempt, user=admin2)
        return real_remove(*args, **kwargs)

    monkeypatch.setattr(archive, "_remove", ask_then_remove)
    result = _run(tmp_path)
    assert (result.attempts, result.removed, result.kept) == (1, 0, 1)
    assert Attempt.objects.filter(pk=attempt.pk).exists()
    assert ErasureRequest.objects.filter(attempt_id=attempt.pk).count() == 1
