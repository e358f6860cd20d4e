"""Named crash points and mutation switches: failure injection for ``manage.py crashtest``.

Everything here is inert unless fault injection is enabled *for this process* by its
environment, and only where ``settings.LEDGER["FAULTS_ALLOWED"]`` is true: off by default, on
only when a test process sets ``LEDGERWEB_FAULTS_ALLOWED=1`` (crashtest does for its children),
and refused with production settings (``LEDGERWEB_HTTPS=1``). Asking for faults where they are
not allowed makes the process refuse to start (see ``check_environment``).

- ``LEDGERWEB_CRASH_AT=point[,point...]`` with optional ``LEDGERWEB_CRASH_AFTER=N``: the process
  kills itself with SIGKILL at the N-th hit (default the first) of any listed crash point.
- ``LEDGERWEB_CRASH_TIMER_MS=M``: after ``arm_kill_timer()`` is called, the process is killed
  M milliseconds later, wherever it is (between any two statements, inside a system call).
- ``LEDGERWEB_MUTATION=name``: a deliberately broken behaviour, so that crashtest can show it is
  able to fail (``claim_after_send`` in the write path; ``blind_retry`` in the reconciler).

This module lives in ``attempts`` because the write path calls it and ``attempts`` never imports
``reconciliation``; ``reconciliation.faults`` re-exports it and registers the reconciler's points.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ENV_CRASH_AT = "LEDGERWEB_CRASH_AT"
ENV_CRASH_AFTER = "LEDGERWEB_CRASH_AFTER"
ENV_CRASH_TIMER_MS = "LEDGERWEB_CRASH_TIMER_MS"
ENV_MUTATION = "LEDGERWEB_MUTATION"
FAULT_ENV = (ENV_CRASH_AT, ENV_CRASH_AFTER, ENV_CRASH_TIMER_MS, ENV_MUTATION)

# Every crash point by name, with where it is. Other apps add theirs with ``register_point``.
POINTS: dict[str, str] = {
    "intent_committed": "write path: the intent is committed; nothing claimed or sent (case A)",
    "dispatch_claimed": "write path: the dispatch claim is committed; nothing sent yet",
    "response_received": "write path: the provider answered; nothing of it is committed (case C)",
    "request_id_attached": "write path: the provider request id is committed, not confirmed",
    "notify_claimed": "notifications: a notice's lease is committed, nothing sent",
    "notify_sent": "notifications: the notice was accepted, not yet recorded as sent",
}
MUTATIONS: dict[str, str] = {
    "claim_after_send": "write path sends first and claims the dispatch afterwards",
}

log = logging.getLogger("ledgerweb.faults")
_lock = threading.Lock()
_hits = 0
_timer_armed = False


def register_point(name: str, where: str) -> None:
    """Add a crash point to the catalogue (used by ``reconciliation.faults``)."""
    POINTS.setdefault(name, where)


def register_mutation(name: str, what: str) -> None:
    MUTATIONS.setdefault(name, what)


def requested() -> dict[str, str]:
    """The fault variables set in this process's environment."""
    return {name: os.environ[name] for name in FAULT_ENV if os.environ.get(name, "").strip()}


def check_environment() -> None:
    """Refuse loudly to run with fault injection asked for where it is not allowed."""
    wanted = requested()
    if wanted and not settings.LEDGER["FAULTS_ALLOWED"]:
        raise ImproperlyConfigured(
            "fault injection was requested ("
            + ", ".join(sorted(wanted))
            + ") but this deployment does not allow it: LEDGER['FAULTS_ALLOWED'] is off. "
            "Remove these variables, or (in a test process only, never with production "
            "settings) set LEDGERWEB_FAULTS_ALLOWED=1."
        )
    for name, minimum in ((ENV_CRASH_AFTER, 1), (ENV_CRASH_TIMER_MS, 0)):
        if name in wanted:
            try:
                ok = int(wanted[name]) >= minimum
            except ValueError:
                ok = False
            if not ok:
                raise ImproperlyConfigured(f"{name} must be a whole number >= {minimum}")


def _enabled() -> bool:
    if not settings.LEDGER["FAULTS_ALLOWED"]:
        return False
    return bool(requested())


def _die(why: str) -> None:
    """Say why, flush what this process has written, then SIGKILL it: no cleanup, no atexit."""
    try:
        sys.stderr.write(f"ledgerweb-fault: {why}: SIGKILL pid {os.getpid()}\n")
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def crash_point(name: str) -> None:
    """Die here if this process was told to (``LEDGERWEB_CRASH_AT``); otherwise do nothing."""
    global _hits
    raw = os.environ.get(ENV_CRASH_AT)
    if not raw or not _enabled():
        return
    if name not in {p.strip() for p in raw.split(",")}:
        return
    after = int(os.environ.get(ENV_CRASH_AFTER, "1") or "1")
    with _lock:
        _hits += 1
        hit = _hits
    if hit >= after:
        _die(f"crash point {name} (hit {hit})")


def mutation(name: str) -> bool:
    """Whether the named deliberate breakage is switched on for this process."""
    raw = os.environ.get(ENV_MUTATION)
    if not raw or not _enabled():
        return False
    return name in {m.strip() for m in raw.split(",")}


def arm_kill_timer() -> float | None:
    """Start the random-kill timer if ``LEDGERWEB_CRASH_TIMER_MS`` asks for one (once per
    process; the agent arms it before its first call, the reconciler at the start of a pass).

    A daemon thread sleeps that long and then SIGKILLs the process, wherever its main thread is.
    Returns the delay in seconds, or None when no timer was asked for.
    """
    global _timer_armed
    raw = os.environ.get(ENV_CRASH_TIMER_MS)
    if not raw or not _enabled():
        return None
    with _lock:
        if _timer_armed:
            return None
        _timer_armed = True
    delay = int(raw) / 1000

    def fire() -> None:
        time.sleep(delay)
        _die(f"kill timer after {int(raw)} ms")

    threading.Thread(target=fire, name="ledgerweb-kill-timer", daemon=True).start()
    return delay
