"""``manage.py reconcile``: the recovery worker (protocol section 6)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from types import UnionType
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections

from attempts import chain, counts, locking
from attempts import log as tlog
from attempts.locking import LedgerBusy
from attempts.notify import NotifyStep
from ledgerweb import logs
from reconciliation.reconciler import Reconciler, Summary, tune_worker_process

log = logging.getLogger("ledgerweb.reconciler")


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("must be positive")
    return number


class Command(BaseCommand):
    help = (
        "Reconcile interrupted attempts with their providers: claim stale intents and dispatches "
        "and due UNKNOWN attempts, look them up, and settle them by the decision table; seal "
        "new history into audit checkpoints every LEDGERWEB_SEAL_EVERY seconds; escalate SLA "
        "breaches and deliver notifications from the outbox. Runs in a loop until SIGTERM (or "
        "once with --once). Safe to run on many machines at once."
    )

    # The system checks run in handle(), where a database that cannot be opened yet (an
    # unwritable SQLite folder, as an unreachable PostgreSQL) is waited for, not a traceback:
    # on SQLite the model checks open the database.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once", action="store_true", help="Run one pass over what is due now, then exit."
        )
        parser.add_argument(
            "--concurrency",
            type=_positive_int,
            default=16,
            help=(
                "Provider lookups and sends in flight at once in this process (default 16); "
                "half as many more only for providers using less than half of it while "
                "another fills it."
            ),
        )
        parser.add_argument(
            "--batch-size",
            type=_positive_int,
            default=200,
            help="Most attempts claimed in one claim transaction (default 200).",
        )
        parser.add_argument(
            "--interval",
            type=_positive_float,
            default=5.0,
            help="How often, in seconds, an idle worker looks for due work (default 5).",
        )
        parser.add_argument(
            "--lease-seconds",
            type=_positive_float,
            default=None,
            help="How long a claim lasts (default: long enough for a claimed batch to time out "
            "across the worker's concurrency, at least 60 s).",
        )
        parser.add_argument(
            "--worker-id", default=None, help="Name of this worker (default host:pid:random)."
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the final summary as one JSON object."
        )
        parser.add_argument(
            "--restarts",
            type=int,
            default=0,
            help="Set by a supervisor: how many times it restarted this worker (shown by /healthz).",
        )
        parser.add_argument(
            "--last-exit",
            default="",
            help="Set by a supervisor: how the previous worker process ended (shown by /healthz).",
        )
        parser.add_argument(
            "--no-notify",
            action="store_true",
            help="Do not escalate SLAs or deliver notifications in this process.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        worker_id = options["worker_id"]
        if worker_id is not None and not (0 < len(worker_id) <= 100):
            raise CommandError("--worker-id must be 1 to 100 characters")
        reconciler = Reconciler(
            worker_id=worker_id,
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            lease_seconds=options["lease_seconds"],
            restarts=max(0, options["restarts"]),
            last_exit=options["last_exit"],
        )
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stop.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        started = time.monotonic()
        try:
            # The checks that read the database (an owner for attention work, reconcilable
            # tools) matter here, where attempts are moved to people: warnings are printed,
            # not fatal. A database that cannot be opened yet is waited for.
            self._checks_when_the_database_opens(stop, options["interval"], once=options["once"])
            tune_worker_process()
            logs.skip_unused_record_fields()  # this process logs a line per settled attempt
            logs.warnings_as_log_lines()
            self.notify = None if options["no_notify"] else NotifyStep()
            if stop.is_set():
                total = Summary()
            elif options["once"]:
                try:
                    try:
                        total = reconciler.run_once(stop=stop)
                    finally:
                        reconciler.stop()
                    self._notify()
                except Exception as exc:
                    log.exception("reconcile pass failed")
                    raise CommandError(
                        f"reconcile pass failed: {type(exc).__name__}: {exc}"
                    ) from exc
                self._seal()
                self._count()
            else:
                try:
                    total = self._loop(reconciler, stop, options["interval"], options["verbosity"])
                finally:
                    # Calls still in flight end within their deadlines; nothing outlives us.
                    reconciler.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        elapsed = time.monotonic() - started
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "worker_id": reconciler.worker_id,
                        "seconds": round(elapsed, 3),
                        **total.as_dict(),
                    }
                )
            )
        else:
            self._say(
                f"reconcile {reconciler.worker_id}: {total} in {elapsed:.2f}s"
                + (" (stopped)" if stop.is_set() else ""),
                event="worker.finished",
                worker_id=reconciler.worker_id,
                seconds=round(elapsed, 3),
                stopped=stop.is_set(),
                **total.as_dict(),
            )

    def _loop(
        self, reconciler: Reconciler, stop: threading.Event, interval: float, verbosity: int
    ) -> Summary:
        total = Summary()
        self._say(
            f"reconcile {reconciler.worker_id}: running; SIGTERM stops it cleanly",
            event="worker.started",
            worker_id=reconciler.worker_id,
        )
        seal_every = settings.LEDGER["SEAL_EVERY"]
        next_seal = next_count = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= next_seal:
                self._seal()
                next_seal = time.monotonic() + seal_every
            if time.monotonic() >= next_count:
                self._count()
                next_count = time.monotonic() + counts.COUNT_EVERY
            try:
                # Calls to a slow provider carry over to the next pass (each bounded by its
                # deadline), so sealing, notifications and the heartbeat never wait for one.
                summary = reconciler.run_once(stop=stop, carry=True)
            except Exception as exc:
                # The database went away, or something outside any one attempt broke (one
                # attempt's errors are quarantined inside the pass): say so, wait, and try
                # again with a fresh connection. The worker never exits on its own.
                if not isinstance(exc, DatabaseError):
                    log.exception("reconcile pass failed")
                self._say(
                    f"reconcile pass failed, retrying in {interval}s: {type(exc).__name__}: {exc}",
                    event="worker.pass_failed",
                    level=logging.ERROR,
                    error=type(exc).__name__,
                )
                self._reconnect()
                stop.wait(interval)
                continue
            total.add(summary)
            if summary.claimed and verbosity >= 1:
                self._say(
                    f"pass: {summary}",
                    event="worker.pass",
                    worker_id=reconciler.worker_id,
                    **summary.as_dict(),
                )
            try:
                notified = self._notify()
            except Exception as exc:  # notifications must not stop recovery either
                self._step_failed(
                    exc,
                    "notification step",
                    event="worker.notify_failed",
                    expected=DatabaseError,
                    retry="retrying",
                )
                notified = {}
            if notified.get("sent") and verbosity >= 1:
                self._say(f"notify: {notified}", event="worker.notify", **notified)
            if summary.claimed == 0:
                # Look again ``interval`` after the last look, however long this pass took
                # (waiting a moment on a slow provider's call, writing its answers).
                look_again = interval - reconciler.seconds_since_claim()
                reconciler.wait_for_work(
                    stop, max(0.0, min(look_again, next_seal - time.monotonic()))
                )
        return total

    def _json(self) -> bool:
        return settings.LOGGING["handlers"]["console"]["formatter"] == "json"

    def _checks_when_the_database_opens(
        self, stop: threading.Event, interval: float, *, once: bool
    ) -> None:
        """The system checks, once the database can be opened: until then (an unwritable
        SQLite folder, an unreachable server) say so and try again every ``interval`` seconds,
        as the loop does when the database goes away later (``--once`` fails at once)."""
        while not stop.is_set():
            try:
                self._startup_checks()
                return
            except (OperationalError, InterfaceError) as exc:
                if once:
                    raise CommandError(f"the database cannot be opened: {exc}") from exc
                self._say(
                    f"the database cannot be opened yet, retrying in {interval}s: "
                    f"{type(exc).__name__}: {exc}",
                    event="worker.database_away",
                    level=logging.ERROR,
                    error=type(exc).__name__,
                )
                self._reconnect()
                stop.wait(interval)

    def _startup_checks(self) -> None:
        if not self._json():
            self.check(databases=["default"], display_num_errors=False)
            return
        found = [m for m in checks.run_checks(databases=["default"]) if not m.is_silenced()]
        for message in found:
            self._say(
                f"{message.id}: {message.msg}",
                event="worker.check",
                level=message.level,
                check_id=message.id,
                hint=message.hint or "",
            )
        serious = [m for m in found if m.is_serious()]
        if serious:
            raise CommandError(f"system checks failed: {', '.join(m.id for m in serious)}")

    def _say(self, text: str, *, event: str, level: int = logging.INFO, **fields: Any) -> None:
        """A line of the worker's own (a pass, a retry): plain text, or with
        LEDGERWEB_LOG_FORMAT=json one JSON object with the figures as fields. Errors go to
        standard error."""
        out = self.stderr if level >= logging.WARNING else self.stdout
        if self._json():
            text = logs.json_line(text, logger=log.name, level=level, event=event, **fields)
            out.write(text, style_func=lambda x: x)
        else:
            out.write(text)

    def _step_failed(
        self,
        exc: Exception,
        what: str,
        *,
        event: str,
        expected: type[Exception] | UnionType,
        retry: str = "retrying later",
    ) -> None:
        """Report a step of the worker that failed and is tried again: its traceback in the log
        unless the failure is of an ``expected`` kind (the database away, the ledger busy), one
        line of the worker's own, and fresh database connections for the next try."""
        if not isinstance(exc, expected):
            log.exception(f"{what} failed")
        self._say(f"{what} failed, {retry}: {exc}", event=event, level=logging.ERROR)
        self._reconnect()

    def _reconnect(self) -> None:
        """After a failed step: connections that are broken, or reach a server that no longer
        takes writes (after a failover), are closed; the next step connects to the primary."""
        close_old_connections()
        locking.forget_connections()

    def _notify(self) -> dict[str, int]:
        """One notification step (SLA escalation, enqueue, delivery) unless --no-notify."""
        return self.notify.run() if self.notify is not None else {}

    def _count(self) -> None:
        """One pass of the overview's terminal counts (attempts/counts.py). A failure is
        reported and retried at the next turn: the overview shows how old its counts are."""
        try:
            counts.refresh()
        except Exception as exc:
            self._step_failed(
                exc,
                "counting terminal work",
                event="worker.count_failed",
                expected=DatabaseError | LedgerBusy,
            )

    def _seal(self) -> None:
        """Seal everything written so far into checkpoints (attempts/chain.py). A failure is
        reported and retried at the next turn: sealing late widens the unsealed window, which
        verify_audit and /metrics show, and loses nothing."""
        try:
            while chain.seal() is not None:
                pass
        except Exception as exc:
            self._step_failed(
                exc,
                "sealing the audit history",
                event="worker.seal_failed",
                expected=DatabaseError | LedgerBusy,
            )
        self._publish()

    def _publish(self) -> None:
        """Sign what the sealer left unsigned and submit the newest signed checkpoint to the
        witnesses (attempts/log.py), each under its own deadline. Off the write path: a slow or
        failing witness is reported (/healthz, /metrics) and retried at the next turn."""
        try:
            tlog.sign_pending()
            tlog.publish()
        except Exception as exc:
            if not isinstance(exc, DatabaseError | tlog.LogKeyError):
                log.exception("signing or publishing checkpoints failed")
            self.stderr.write(f"signing or publishing checkpoints failed, retrying later: {exc}")
            self._reconnect()
