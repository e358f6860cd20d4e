"""``[archive]``: the attempts a checkpoint sealed and that were moved out to archives
(reconciliation/archive), checked against the history and, given the folder, read."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attempts.audit_verify.chains import Verifier
from attempts.audit_verify.digests import load_json
from attempts.verify_export import (
    Report,
)

ARCHIVE_SQL = "SELECT id, name, manifest_sha256, checkpoint_seq FROM attempts_archive ORDER BY id"
ARCHIVE_HISTORY_SQL = """
SELECT subject, after FROM attempts_configevent
WHERE action = 'archived' AND subject LIKE 'archive:%' ORDER BY seq
"""
ARCHIVED_ROWS_SQL = """
SELECT x.attempt_id, x.chain_length, x.chain_head, l.length, l.head
FROM attempts_archivedattempt x
LEFT JOIN attempts_checkpointleaf l ON l.attempt_id = x.attempt_id
     AND l.checkpoint_id = (SELECT MAX(l2.checkpoint_id) FROM attempts_checkpointleaf l2
                            WHERE l2.attempt_id = x.attempt_id)
WHERE x.archive_id = {archive} ORDER BY x.attempt_id
"""
ARCHIVE_NOTE_SQL = "SELECT note FROM attempts_checkpoint WHERE seq = {seq}"


def archive_checks(
    verifier: Verifier,
    report: Report,
    *,
    archive_dir: Path | None,
    log_keys: Iterable[Any] = (),
) -> None:
    """``[archive]``: every archive is recorded in the configuration history with its manifest's
    SHA-256, and every removed attempt was sealed as its archive says. With ``archive_dir``
    (the folder holding the archive folders), each archive is read: the manifest is the one the
    history recorded, each file is whole, each attempt's history recomputes to the chain head a
    checkpoint sealed (its newest leaf here) and its receipt proves it into the archive's
    checkpoint, which is this ledger's checkpoint of that number. A tampered or missing file is
    named."""
    from attempts.verify_export import LogTrust, check_archive, read_folder, split_note

    recorded: dict[str, str] = {}
    for subject, after in verifier.stream(ARCHIVE_HISTORY_SQL):
        recorded[subject.removeprefix("archive:")] = str(
            (load_json(after) or {}).get("manifest_sha256", "")
        )
    archives = list(verifier.stream(ARCHIVE_SQL))
    removed = 0
    for pk, name, manifest_sha256, seq in archives:
        if recorded.get(name) != manifest_sha256:
            verifier.bad(
                "archive",
                f"{name}: the history does not record this archive with manifest SHA-256 "
                f"{manifest_sha256[:16]}…: its record was added or changed outside the history",
            )
        rows = list(verifier.stream(ARCHIVED_ROWS_SQL.format(archive=int(pk))))
        removed += len(rows)
        for attempt_id, length, head, leaf_length, leaf_head in rows:
            if (leaf_length, leaf_head) != (length, head):
                verifier.bad(
                    "archive",
                    f"{name}: the archived attempt's chain head is not the one its newest "
                    "checkpoint leaf sealed",
                    attempt_id=attempt_id,
                )
        if archive_dir is None:
            continue
        check = check_archive(
            read_folder(Path(archive_dir) / name),
            name=name,
            expect_sha256=recorded.get(name) or manifest_sha256,
            trust=LogTrust(log_keys=list(log_keys)),
        )
        for problem in check.problems:
            verifier.checker.problem(problem)
        if not check.ok and not check.leaves:
            continue
        notes = [row[0] for row in verifier.stream(ARCHIVE_NOTE_SQL.format(seq=int(seq)))]
        if (
            check.manifest
            and notes
            and split_note(check.manifest["checkpoint"]["note"])[0] != (notes[0])
        ):
            verifier.bad(
                "archive",
                f"{name}: the archive's checkpoint is not this ledger's checkpoint {seq}",
            )
        for attempt_id, length, head, _leaf_length, _leaf_head in rows:
            if check.leaves.get(attempt_id) != (length, head):
                if any(p.attempt_id == attempt_id for p in check.problems):
                    continue
                verifier.bad(
                    "archive",
                    f"{name}: the attempt is not in the archive as it was sealed",
                    attempt_id=attempt_id,
                )
    if archives:
        report.notes.append(
            f"{removed} removed attempts are archived in {len(archives)} archives"
            + (
                f", read from {archive_dir}"
                if archive_dir is not None
                else " (not read: give --archive FOLDER to check their histories and receipts)"
            )
        )
