"""``manage.py ledger_log``: the transparency log's keys, signatures and witnesses."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from attempts import log
from attempts.verify_export import NoteError
from ledgerweb.cli import command_line


class Command(BaseCommand):
    help = (
        "The transparency log (docs/audit-chain.md). `key` prints the verifier key to give "
        "auditors, witnesses and agents (NAME+KEYID+BASE64); `genkey --out FILE` makes a "
        "signing key file (mode 0600); `sign` signs checkpoints still unsigned; `publish` "
        "submits the newest signed checkpoint to the witnesses; `status` shows the log."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        commands.add_parser("key", help="print the log's verifier key (and old ones kept)")
        genkey = commands.add_parser("genkey", help="write a new signing key file (mode 0600)")
        genkey.add_argument("--out", type=Path, required=True, metavar="FILE")
        genkey.add_argument(
            "--name",
            default="",
            help="the key's name (default: LEDGERWEB_TLOG_ORIGIN, the log's origin line)",
        )
        genkey.add_argument(
            "--if-missing",
            action="store_true",
            help="do nothing when FILE exists (for scripts that make a key once)",
        )
        commands.add_parser("sign", help="sign the checkpoints the current key has not signed")
        commands.add_parser("publish", help="submit the newest signed checkpoint to witnesses")
        status = commands.add_parser("status", help="the log's size, signatures and witnesses")
        status.add_argument("--json", action="store_true", help="as JSON")

    def handle(self, *args, **options) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except (log.LogKeyError, NoteError) as exc:
            raise CommandError(str(exc)) from None

    def _key(self, options) -> None:
        current = log.signer()
        if current is None:
            raise CommandError(
                "no signing key is configured: set LEDGERWEB_TLOG_KEY_FILE (make one with "
                f"`{command_line('ledger_log genkey --out FILE')}`) or LEDGERWEB_TLOG_SIGN_COMMAND"
            )
        self.stdout.write(str(current.verifier))
        for old in settings.TLOG["OLD_VERIFIER_KEYS"]:
            self.stdout.write(f"{old}  (old key, still trusted)")

    def _genkey(self, options) -> None:
        path: Path = options["out"]
        if path.exists():
            if options["if_missing"]:
                return
            raise CommandError(f"{path} exists; a signing key is never overwritten")
        if not path.parent.is_dir():
            raise CommandError(f"no such directory: {path.parent}")
        verifier = log.write_key_file(path, options["name"] or settings.TLOG["ORIGIN"])
        self.stdout.write(f"wrote {path} (mode 0600); its verifier key:\n{verifier}")

    def _sign(self, options) -> None:
        if log.signer() is None:
            raise CommandError(
                f"no signing key is configured (see `{command_line('ledger_log key')}`)"
            )
        self.stdout.write(f"signed {log.sign_pending(limit=100_000)} checkpoints")

    def _publish(self, options) -> None:
        results = log.publish()
        if not results:
            self.stdout.write("nothing to publish (no witness configured, or nothing signed)")
        for name, outcome in results.items():
            self.stdout.write(f"{name}: {outcome}")

    def _status(self, options) -> None:
        current = log.status()
        if options["json"]:
            self.stdout.write(json.dumps(current, cls=DjangoJSONEncoder, indent=2))
            return
        self.stdout.write(
            f"log: {current['size']} leaves, newest checkpoint {current['checkpoint']}; "
            f"newest signed: {current['signed_checkpoint']} ({current['signed_size']} leaves); "
            f"{current['unsigned']} unsigned"
        )
        for row in current["witnesses"]:
            self.stdout.write(
                f"witness {row['name']}: {row['status']}, at {row['size']} "
                f"({row['behind']} behind) {row['message']}"
            )
        if current["quorum"]:
            self.stdout.write(
                f"quorum {current['quorum']}: "
                + ("witnessed" if current["witnessed"] else "NOT witnessed")
            )
