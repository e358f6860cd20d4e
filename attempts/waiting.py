"""Why an attempt is not moving, and what happens next, in words (issue 40).

One home for the sentence the attempt page and the queue's WHY column show for UNKNOWN, stale,
approved-but-not-sent and held (deferred) work. It reads only the attempt and its latest event:
recovery writes why it holds work into that event (``provider_deferred`` or
``recovery_blocked`` details, once per cause), so nothing here knows the worker's internals.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from attempts.models import State

DEFERRED = "provider_deferred"
BLOCKED = "recovery_blocked"


def _when(value: Any, now: dt.datetime) -> str:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            return ""
    if not isinstance(value, dt.datetime):
        return ""
    value = value.astimezone(dt.UTC)
    seconds = (value - now).total_seconds()
    if seconds <= 0:
        return f"{value:%H:%M:%S} UTC (due)"
    if seconds < 120:
        return f"{value:%H:%M:%S} UTC (in {seconds:.0f} s)"
    return f"{value:%H:%M:%S} UTC (in {seconds / 60:.0f} min)"


def held(details: dict[str, Any] | None) -> dict[str, Any] | None:
    """The hold recorded in an event's details (a deferral or a blocked tool), if any."""
    for name in (DEFERRED, BLOCKED):
        value = (details or {}).get(name)
        if isinstance(value, dict):
            return {"kind": name, **value}
    return None


def why_waiting(
    *,
    state: str,
    updated_at: dt.datetime,
    next_check_at: dt.datetime | None,
    approval_policy: bool,
    latest_details: dict[str, Any] | None,
    now: dt.datetime,
) -> str:
    """What happens next to a live attempt and why, in one or two sentences ('' when nothing
    needs saying: a terminal state, or work a person holds)."""
    hold = held(latest_details)
    if hold is not None and state in (
        State.UNKNOWN,
        State.INTENT_RECORDED,
        State.DISPATCHED,
        State.FAILED_RETRYABLE,
    ):
        if hold["kind"] == BLOCKED:
            return (
                f"Held: recovery cannot use this tool as configured ({hold.get('why', '')}). "
                "It is taken up at the first pass after the configuration is fixed."
            )
        since = _when(hold.get("since"), now).replace(" (due)", "")
        probe = _when(hold.get("next_probe"), now)
        return (
            f"Held by the provider: {hold.get('why', '')}"
            + (f", since {since}" if since else "")
            + ". Nothing is sent or guessed meanwhile; "
            + (f"the next probe is at {probe}; " if probe else "")
            + "this attempt is taken up in its turn as soon as that call may be made again."
        )
    stale_after = settings.LEDGER["STALE_AFTER"]
    quiet = (now - updated_at).total_seconds()
    if state == State.UNKNOWN:
        when = _when(next_check_at, now) if next_check_at else ""
        return (
            "The outcome is not known: recovery looks it up at the provider"
            + (f" at {when}" if when else "")
            + ", and a person decides when it cannot."
        )
    if state == State.INTENT_RECORDED and approval_policy:
        grace = settings.LEDGER["APPROVAL_GRACE"]
        return (
            f"Approved: the agent may send it now; if it has not within {grace:g} s, the "
            "recovery worker sends it at its next pass."
        )
    if state in (State.INTENT_RECORDED, State.DISPATCHED) and quiet >= stale_after:
        action = "sends it" if state == State.INTENT_RECORDED else "looks it up, then decides"
        return (
            f"Stale: no word from its agent for {quiet:.0f} s (the threshold is "
            f"{stale_after:g} s); recovery {action} at its next pass."
        )
    if state == State.FAILED_RETRYABLE:
        when = _when(next_check_at, now) if next_check_at else ""
        return "The provider refused for now: recovery sends it again" + (
            f" at {when}." if when else "."
        )
    return ""
