"""``manage.py simulate``: run seeded histories of the whole ledger and check the invariants."""

from __future__ import annotations

import argparse
import random

from django.core.management.base import BaseCommand, CommandError, CommandParser

from attempts.models import Attempt, Tenant
from ledgerweb.cli import command_line
from reconciliation.simulate.driver import OPEN_BREAKS, TAMPER_RATE, Simulation, parse_steps


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number, not {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be 1 or more")
        return value

    parse.__name__ = name
    return parse


class Command(BaseCommand):
    help = (
        "Run seeded histories of the whole ledger (record, claim, send to a simulated provider "
        "with faults, crashes, two reconcile workers, approvals, reviews, erasure, archive, "
        "authority changes, key rotation, sealing, a witness, tampering) and check the "
        "invariants after every step. Each history runs in a transaction that is rolled back; "
        "run it on a scratch database (it refuses a database that holds attempts). Exits 1 "
        "with the seed and the shortest failing history when an invariant breaks."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--histories", type=_positive("--histories"), default=20)
        parser.add_argument("--steps", type=_positive("--steps"), default=40, help="per history")
        parser.add_argument(
            "--seed", type=int, default=None, help="history n uses seed+n (default: random)"
        )
        parser.add_argument(
            "--verify-every",
            type=_positive("--verify-every"),
            default=20,
            help="run verify_audit, the export verifier and the receipts every N steps",
        )
        parser.add_argument(
            "--tamper-rate",
            type=float,
            default=TAMPER_RATE,
            help="share of steps that are tampering steps, each undone after the verifiers "
            f"have seen it (0 to 1; default {TAMPER_RATE})",
        )
        parser.add_argument(
            "--include-open-breaks",
            action="store_true",
            help=f"also draw and check what is known broken: {', '.join(sorted(OPEN_BREAKS))}",
        )
        parser.add_argument(
            "--include",
            action="append",
            default=[],
            metavar="NAME",
            help="draw and check this one known-broken tampering or check (repeatable)",
        )
        parser.add_argument(
            "--replay",
            default="",
            help="run these steps (as a failure prints them: 'op(choice), ...') as one history",
        )
        parser.add_argument("--no-shrink", action="store_true", help="do not shrink a failure")

    def handle(self, *args, **options) -> None:
        if not 0 <= options["tamper_rate"] <= 1:
            raise CommandError("--tamper-rate must be between 0 and 1")
        if Attempt.objects.exists() or Tenant.objects.exists():
            raise CommandError(
                "this database holds tenants or attempts: run the simulator on a scratch "
                f"database (e.g. LEDGERWEB_SQLITE_PATH=/tmp/sim.db, after {command_line('migrate')}); "
                "its histories take table locks while they run"
            )
        unknown = sorted(set(options["include"]) - OPEN_BREAKS)
        if unknown:
            raise CommandError(
                f"--include takes one of {', '.join(sorted(OPEN_BREAKS))}; not {', '.join(unknown)}"
            )
        open_breaks = frozenset() if options["include_open_breaks"] else OPEN_BREAKS
        open_breaks -= set(options["include"])
        say = self.stdout.write
        with Simulation(
            open_breaks=open_breaks, verify_every=options["verify_every"], say=say
        ) as simulation:
            if options["replay"]:
                try:
                    steps = parse_steps(options["replay"])
                except ValueError as exc:
                    raise CommandError(str(exc)) from None
                outcome = simulation.run(steps)
                if outcome.failed:
                    for violation in outcome.violations:
                        say(f"  {violation}")
                    raise CommandError("the replayed history breaks an invariant")
                say(f"OK: the replayed history of {len(steps)} steps keeps every invariant")
                return
            seed = options["seed"]
            if seed is None:
                seed = random.SystemRandom().randrange(1 << 31)
            say(f"seed {seed}: {options['histories']} histories of {options['steps']} steps")
            summary = simulation.many(
                seed=seed,
                histories=options["histories"],
                steps=options["steps"],
                tamper_rate=options["tamper_rate"],
                shrink=not options["no_shrink"],
            )
        say(
            f"{summary.histories} histories, {summary.steps} steps in {summary.seconds:.1f} s: "
            f"{summary.per_minute:.0f} histories per minute"
        )
        if summary.tampered:
            say(
                "tampering steps run: "
                + ", ".join(f"{k} {v}" for k, v in sorted(summary.tampered.items()))
            )
        if options["verbosity"] > 1:
            say("steps by outcome:")
            for (op, result), count in sorted(summary.stats.items()):
                say(f"  {op:28} {result:40} {count}")
            say(
                "attempt states at the end of histories: "
                + ", ".join(f"{k} {v}" for k, v in sorted(summary.states.items()))
            )
        if summary.failure is None:
            say("OK: every invariant held")
            return
        failure = summary.shrunk or summary.failure
        shortest = failure.steps[: failure.ran] if failure.ran else failure.steps
        say(f"FAILED in history seed {summary.failure.seed} (history {summary.found_after}):")
        for violation in failure.violations:
            say(f"  {violation}")
        say(f"shortest history ({len(shortest)} steps):")
        say("  " + ", ".join(str(s) for s in shortest))
        say(
            f"replay: {command_line('simulate')} --seed {summary.failure.seed} --histories 1 "
            f"--steps {options['steps']}"
            + (" --include-open-breaks" if options["include_open_breaks"] else "")
            + f"  or  --replay '{', '.join(str(s) for s in shortest)}'"
        )
        raise CommandError("an invariant broke", returncode=1)
