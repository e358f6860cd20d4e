"""Crash points and mutations of the reconciliation side, on top of ``attempts.faults``.

The mechanism (``crash_point``, ``mutation``, ``arm_kill_timer``, the environment variables and
the production refusal) lives in ``attempts.faults`` because the write path in ``attempts`` calls
it and ``attempts`` never imports ``reconciliation``. This module re-exports it and registers the
points that live in reconciliation code, so ``POINTS`` is the whole catalogue once it is imported.
"""

from __future__ import annotations

from attempts.faults import (
    ENV_CRASH_AFTER,
    ENV_CRASH_AT,
    ENV_CRASH_TIMER_MS,
    ENV_MUTATION,
    MUTATIONS,
    POINTS,
    arm_kill_timer,
    check_environment,
    crash_point,
    mutation,
    register_mutation,
    register_point,
)

__all__ = [
    "ENV_CRASH_AFTER",
    "ENV_CRASH_AT",
    "ENV_CRASH_TIMER_MS",
    "ENV_MUTATION",
    "MUTATIONS",
    "POINTS",
    "arm_kill_timer",
    "check_environment",
    "crash_point",
    "mutation",
]

register_point("request_sent", "HTTP send: the request is written, the answer not read (case B)")
register_point("reconcile_claimed", "reconciler: the lease on an attempt is committed")
register_point("reconcile_looked_up", "reconciler: the lookup answered; no decision committed")
register_point("reconcile_resent", "reconciler: a resend answered; its outcome not committed")
register_point("approval_waiting", "agent: its intent is held for approval; it waits (case G)")
register_mutation("blind_retry", "reconciler resends without looking the effect up first")
