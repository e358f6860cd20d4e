"""``ledgerweb archive run|restore|verify``: retention and archives (docs/archive.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts.management.options import add_actor_option, command_actor
from attempts.models import Archive
from attempts.verify_export import LogTrust, NoteError, VerifierKey, check_archive
from reconciliation.archive import archive, restore
from reconciliation.archive.store import StoreError, open_store


class Command(BaseCommand):
    help = (
        "Retention and archives. `run --to WHERE` writes the settled, sealed attempts older than "
        "their retention rule ([[retention_rules]] in the configuration) to an archive (a folder "
        "or s3://bucket/prefix: gzip JSON Lines with each attempt's events and receipt, and a "
        "manifest), records it in the history, then removes them from the database in small "
        "batches. `restore --from WHERE --into-sqlite PATH` (or --into-database-url URL) loads "
        "archives into a scratch database, verifying them. `verify --from WHERE` checks archives "
        "against the history. docs/archive.md."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="run|restore|verify")
        run = actions.add_parser("run", help="Archive and remove what the retention rules say.")
        run.add_argument(
            "--to", required=True, metavar="WHERE", help="a folder, or s3://bucket/prefix"
        )
        run.add_argument(
            "--dry-run",
            action="store_true",
            help="say how many attempts each rule would archive; write and remove nothing",
        )
        run.add_argument(
            "--batch-size",
            type=int,
            default=archive.DEFAULT_BATCH,
            help=f"attempts per file and per removal transaction (default {archive.DEFAULT_BATCH})",
        )
        run.add_argument(
            "--limit", type=int, default=None, help="archive at most this many attempts this run"
        )
        add_actor_option(run, "runs it")
        for name, text in (
            ("restore", "Load archives into a scratch database, verifying them."),
            ("load", "(internal) the loading step restore runs on the scratch database."),
            ("verify", "Check archives against the ledger's history."),
        ):
            sub = actions.add_parser(name, help=text)
            sub.add_argument("--from", dest="where", required=True, metavar="WHERE")
            sub.add_argument(
                "--name",
                action="append",
                default=[],
                help="an archive's name (repeat; default: every archive there)",
            )
            sub.add_argument(
                "--log-key",
                action="append",
                default=[],
                metavar="VKEY",
                help="the log's verifier key: receipts' checkpoints must be signed with it",
            )
            if name == "restore":
                into = sub.add_mutually_exclusive_group(required=True)
                into.add_argument("--into-sqlite", metavar="PATH", help="a scratch SQLite file")
                into.add_argument(
                    "--into-database-url", metavar="URL", help="a scratch PostgreSQL database"
                )
            if name == "load":
                sub.add_argument("--expect-sha256", action="append", default=[])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            if action == "run":
                self._run(options)
            elif action == "verify":
                self._verify(options)
            elif action == "restore":
                self._restore(options)
            else:
                self._load(options)
        except (archive.ArchiveError, restore.RestoreError, StoreError, NoteError) as exc:
            raise CommandError(str(exc)) from None

    def _run(self, options: dict[str, Any]) -> None:
        store = open_store(options["to"])
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be 1 or more")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be 1 or more")
        if options["dry_run"]:
            rows = archive.plan()
            if not rows:
                self.stdout.write("no retention rules: nothing would be archived")
            for rule, count in rows:
                self.stdout.write(
                    f"{rule.tenant_id}/{rule.tool_id} (after {rule.archive_after_days} days): "
                    f"{count} attempts would be archived"
                )
            self.stdout.write("dry run: nothing written, nothing removed")
            return
        result = archive.run(
            store=store,
            actor=command_actor(options["actor"]),
            batch_size=options["batch_size"],
            limit=options["limit"],
            say=self.stdout.write,
        )
        for line in result.lines:
            self.stdout.write(line)

    def _names(self, store, options: dict[str, Any]) -> list[str]:
        names = options["name"] or store.archives()
        if not names:
            raise CommandError(f"no archives in {options['where']}")
        return names

    def _verify(self, options: dict[str, Any]) -> None:
        store = open_store(options["where"])
        trust = LogTrust(log_keys=[VerifierKey.parse(k) for k in options["log_key"]])
        recorded = {}
        names = set(options["name"])
        for name, location, digest in Archive.objects.values_list(
            "name", "location", "manifest_sha256"
        ):
            recorded[name] = digest
            # An archive the history says was written here must be here.
            if not options["name"] and location == store.location(name):
                names.add(name)
        if not options["name"]:
            names |= set(store.archives())
        if not names:
            raise CommandError(f"no archives in {options['where']}")
        broken = False
        for name in sorted(names):
            check = check_archive(
                store.reader(name), name=name, expect_sha256=recorded.get(name), trust=trust
            )
            if name not in recorded:
                self.stdout.write(f"{name}: not an archive of this ledger (no history record)")
            for problem in check.problems:
                self.stdout.write(str(problem))
            broken = broken or not check.ok
            if check.ok:
                self.stdout.write(f"OK: {name}: {len(check.leaves)} attempts verify")
        if broken:
            raise CommandError("some archives do not verify")

    def _restore(self, options: dict[str, Any]) -> None:
        store = open_store(options["where"])
        names = self._names(store, options)
        expect = dict(Archive.objects.filter(name__in=names).values_list("name", "manifest_sha256"))
        done = restore.restore(
            where=options["where"],
            names=names,
            expect=expect,
            sqlite=options["into_sqlite"],
            database_url=options["into_database_url"],
            log_keys=options["log_key"],
        )
        self.stdout.write(done.stdout, ending="")
        if done.returncode:
            raise CommandError(done.stderr.strip() or "the restore failed")

    def _load(self, options: dict[str, Any]) -> None:
        from django.core.management import call_command

        store = open_store(options["where"])
        expect = {}
        for item in options["expect_sha256"]:
            name, _, digest = item.partition("=")
            expect[name] = digest
        call_command("migrate", verbosity=0, interactive=False)
        restore.load(
            store=store,
            names=self._names(store, options),
            expect=expect,
            log_keys=options["log_key"],
            say=self.stdout.write,
        )
