"""``manage.py crashtest_review``: the person crashtest starts to approve held work."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts import review
from attempts.ledger import LedgerError
from attempts.models import Attempt, State


class Command(BaseCommand):
    help = (
        "Approve attempts an approval policy holds (AWAITING_APPROVAL), as the named person, "
        "through the same review.approve_held the approvals inbox calls. Used by crashtest's "
        "cases G-I; prints one line per attempt."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("keys", nargs="*", help="idempotency keys (default: every held one)")
        parser.add_argument("--as", dest="username", required=True, help="the approver")
        parser.add_argument("--comment", default="crashtest", help="the approval's comment")

    def handle(self, *args, **options) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        held = Attempt.objects.filter(state=State.AWAITING_APPROVAL).order_by("id")
        if options["keys"]:
            held = held.filter(idempotency_key__in=options["keys"])
        for attempt in held:
            try:
                after = review.approve_held(attempt, user=user, comment=options["comment"])
            except LedgerError as exc:
                self.stdout.write(f"{attempt.idempotency_key} refused {exc.code}")
                continue
            self.stdout.write(f"{attempt.idempotency_key} {after.state}")
