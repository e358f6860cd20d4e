"""``manage.py verify_audit``: check the audit chain of the live ledger, a SQLite copy, or an
exported file, and name the first broken link."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts import audit_verify, log, verify_export


class Command(BaseCommand):
    help = (
        "Verify the tamper-evident history. Without options, checks the configured database: "
        "every event's hash, every attempt's chain of prev_hash links, every checkpoint (Merkle "
        "roots, the checkpoint chain, sealed heads), the config chain, and every attempt row "
        "against its history; it prints the newest checkpoint hash, to keep elsewhere, and what "
        "is not sealed yet. --export FILE checks an exported .jsonl/.csv file on its own (the same check "
        "an auditor runs with attempts/verify_export.py, no database needed). --sqlite PATH "
        "checks a SQLite ledger file such as a backup or a restored copy. Exits 1 when anything "
        "does not verify."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--export", type=Path, metavar="FILE", help="an exported audit file")
        where.add_argument("--sqlite", type=Path, metavar="PATH", help="a SQLite ledger file")
        parser.add_argument(
            "--manifest", type=Path, help="the CSV export's manifest (default FILE.manifest.json)"
        )
        parser.add_argument(
            "--expect-head",
            action="append",
            default=[],
            metavar="HASH",
            help="a checkpoint hash kept elsewhere (or, for history written before "
            "checkpoints, a head hash) that must still be in the ledger (repeatable)",
        )
        parser.add_argument(
            "--max-unsealed-seconds",
            type=float,
            metavar="S",
            help="fail when history has stayed unsealed longer than S seconds (is the sealer "
            "running?); by default the unsealed window is only reported",
        )
        parser.add_argument(
            "--max-problems", type=int, default=20, help="list at most this many problems"
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=os.cpu_count() or 1,
            metavar="N",
            help="verify the attempts' chains in N processes (default: the CPU count, %(default)s)",
        )
        parser.add_argument(
            "--archive",
            type=Path,
            metavar="FOLDER",
            help="the folder holding the ledger's archives (ledgerweb archive run --to): each "
            "archive's manifest, files, histories and receipts are checked against the ledger",
        )
        parser.add_argument(
            "--require-signed",
            action="store_true",
            help="fail when no log key is configured (checkpoints unsigned); by default that is "
            "a note. With a key configured, the newest checkpoint must always verify on its own: "
            "signed by the configured key (or a listed old one), where the signer's memory "
            "says, and cosigned by the quorum of the configured witnesses",
        )
        parser.add_argument(
            "--restored",
            action="store_true",
            help="the configured database is a restored copy (a restore drill, a backup being "
            "checked): the log's signer may since have signed a larger tree than it holds, "
            "which is then a note instead of a rollback",
        )
        parser.add_argument(
            "--since",
            metavar="SEQ:HASH",
            help="incremental: check only what changed after checkpoint SEQ, whose hash a "
            "previous run printed (its last note says what to pass); the config chain is always "
            "checked whole. A full run (without --since) also re-checks older sealed history",
        )

    def handle(self, *args, **options) -> None:
        anchors = [h.strip().lower() for h in options["expect_head"]]
        for anchor in anchors:
            if len(anchor) != 64 or any(c not in "0123456789abcdef" for c in anchor):
                raise CommandError(f"--expect-head {anchor!r} is not a 64-digit hex SHA-256")
        if options["max_unsealed_seconds"] is not None and options["max_unsealed_seconds"] < 0:
            raise CommandError("--max-unsealed-seconds must not be negative")
        if options["max_problems"] < 1:
            raise CommandError("--max-problems must be at least 1")
        if not 1 <= options["jobs"] <= 256:
            raise CommandError("--jobs must be between 1 and 256")
        since = _since(options["since"]) if options["since"] else None
        if options["archive"] is not None and not options["archive"].is_dir():
            raise CommandError(f"--archive {options['archive']}: no such folder")
        if since and options["export"]:
            raise CommandError("--since applies to a database, not to an export file")
        began = time.perf_counter()
        try:
            if options["export"]:
                path = options["export"]
                if not path.is_file():
                    raise CommandError(f"no such file: {path}")
                report = verify_export.verify_file(
                    path, manifest_path=options["manifest"], anchors=anchors
                )
            elif options["sqlite"]:
                path = options["sqlite"]
                if not path.is_file():
                    raise CommandError(f"no such file: {path}")
                report = audit_verify.verify_sqlite_file(
                    str(path),
                    anchors=anchors,
                    max_problems=options["max_problems"],
                    max_unsealed_seconds=options["max_unsealed_seconds"],
                    jobs=options["jobs"],
                    since=since,
                    archive_dir=options["archive"],
                )
            else:
                try:
                    log_keys = log.verifier_keys()
                    witness_keys = [w.key for w in log.witnesses()]
                    trust = audit_verify.configured_trust(
                        require_signed=options["require_signed"], restored=options["restored"]
                    )
                except (log.LogKeyError, verify_export.NoteError) as exc:
                    raise CommandError(f"the transparency log's keys: {exc}") from None
                report = audit_verify.verify_django_database(
                    anchors=anchors,
                    max_problems=options["max_problems"],
                    max_unsealed_seconds=options["max_unsealed_seconds"],
                    jobs=options["jobs"],
                    since=since,
                    log_keys=log_keys,
                    witness_keys=witness_keys,
                    archive_dir=options["archive"],
                    trust=trust,
                )
                for problem in log.witness_problems():
                    report.problems.append(problem)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"could not read what was to be verified: {exc}") from None
        except Exception as exc:  # a database that is not a ledger, or unreachable
            from django.db import DatabaseError

            if isinstance(exc, DatabaseError) or type(exc).__module__.startswith("sqlite3"):
                raise CommandError(f"could not read the ledger: {exc}") from None
            raise
        seconds = time.perf_counter() - began
        report.notes.append(
            f"checked in {seconds:.2f}s ({report.events / max(seconds, 1e-9):,.0f} events/s)"
        )
        if not report.ok:
            raise CommandError(report.render(), returncode=1)
        self.stdout.write(report.render())


def _since(value: str) -> tuple[int, str]:
    seq, _, digest = value.strip().partition(":")
    digest = digest.strip().lower()
    if (
        not seq.isdigit()
        or int(seq) < 1
        or len(digest) != 64
        or any(c not in "0123456789abcdef" for c in digest)
    ):
        raise CommandError(
            f"--since {value!r} is not SEQ:HASH (a checkpoint number and its 64-digit hex hash, "
            "as a previous run's last note prints them)"
        )
    return int(seq), digest
