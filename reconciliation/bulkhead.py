"""Each provider behind its own bulkhead, so one slow, failing or rate-limiting provider holds
up nobody else: a cap on its calls in flight, a circuit breaker, and its ``Retry-After``.

The breaker (one per provider, per worker process):

- *closed*: calls go through; ``BREAKER_FAILURES`` failures in a row (no answer within the
  deadline, a refused connection, a 5xx, a 429) open it;
- *open*: no call is made; attempts due for that provider are deferred until it may be probed
  again (``BREAKER_OPEN_SECONDS``, doubling while probes keep failing, at most the backoff cap);
- *half-open*: one call, the probe, goes through; its success closes the breaker, its failure
  opens it again.

A 429 or 503 with ``Retry-After`` holds that provider (only that one) for as long as it asked,
whatever the breaker says. The reconciler's main thread is the only caller: no lock needed.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from reconciliation.providers.base import (
    Adapter,
    LookupAnswer,
    LookupStatus,
    SendAnswer,
    SendStatus,
)

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

# Statuses after which a provider is asking us to slow down.
BACKOFF_STATUSES = frozenset({429, 503})
# A 429/503 without Retry-After still holds the provider this long.
DEFAULT_RETRY_AFTER = 5.0


def failure_of(answer: Any) -> str:
    """Why this answer counts against its provider ('' when the provider answered soundly)."""
    status = getattr(answer, "http_status", None)
    if isinstance(answer, LookupAnswer):
        if answer.status != LookupStatus.UNAVAILABLE:
            return ""
    elif isinstance(answer, SendAnswer):
        if answer.status == SendStatus.ACCEPTED:
            return ""
        if answer.status == SendStatus.REFUSED and status not in BACKOFF_STATUSES:
            # A definite refusal is an answer; "not sent" (no connection) is a failure.
            return answer.detail if answer.detail.startswith("not sent") else ""
    else:
        return ""
    if status is not None and status < 500 and status not in BACKOFF_STATUSES:
        return ""
    return answer.detail or (f"HTTP {status}" if status else "no answer")


@dataclass
class ProviderState:
    key: str
    cap: int
    state: str = CLOSED
    failures: int = 0  # in a row
    opened: int = 0  # times opened in a row without a successful probe
    open_until: float = 0.0  # monotonic
    hold_until: float = 0.0  # Retry-After, monotonic
    in_flight: int = 0
    probing: bool = False
    last_error: str = ""
    tools: set[str] = field(default_factory=set)

    def degraded(self, now: float) -> bool:
        return self.state != CLOSED or self.hold_until > now


class Bulkheads:
    """The bulkheads of every provider this worker has called."""

    def __init__(self, *, concurrency: int) -> None:
        ledger = settings.LEDGER
        self.default_cap = ledger["PROVIDER_CONCURRENCY"]
        self.caps: dict[str, int] = dict(ledger["PROVIDER_CONCURRENCY_BY_KEY"])
        self.failures_to_open = ledger["PROVIDER_BREAKER_FAILURES"]
        self.open_seconds = float(ledger["PROVIDER_BREAKER_OPEN_SECONDS"])
        self.open_cap = float(ledger["BACKOFF_CAP"])
        # However a provider is configured, it may not take the whole pool: the others must
        # always find a thread.
        self.max_cap = max(1, concurrency // 2)
        self.providers: dict[str, ProviderState] = {}

    def of(self, adapter: Adapter) -> ProviderState:
        key = adapter.provider_key
        state = self.providers.get(key)
        if state is None:
            cap = self.caps.get(key, self.caps.get(adapter.tool.name, self.default_cap))
            state = self.providers[key] = ProviderState(key, max(1, min(cap, self.max_cap)))
        state.tools.add(adapter.tool.name)
        return state

    def refusal(self, adapter: Adapter, *, now: float | None = None) -> tuple[float, str] | None:
        """(seconds to wait, why) when no call may be started for this provider now; None
        when one may (given room under its cap). Moves an open breaker to half-open when its
        time has come."""
        state = self.of(adapter)
        now = time.monotonic() if now is None else now
        if state.hold_until > now:
            return state.hold_until - now, (
                f"provider {state.key} asked to wait (Retry-After) {state.hold_until - now:.0f}s"
            )
        if state.state == OPEN:
            if state.open_until > now:
                return state.open_until - now, (
                    f"provider {state.key} circuit open after {state.failures} failures "
                    f"({state.last_error[:120]})"
                )
            state.state = HALF_OPEN
            state.probing = False
        if state.state == HALF_OPEN and state.probing:
            return max(1.0, self.open_seconds / 2), (
                f"provider {state.key} circuit half-open: waiting for its probe"
            )
        return None

    def blocked_tools(self, *, now: float | None = None) -> set[str]:
        """Tools whose provider may not be called now (breaker open, probe in flight, holding
        for Retry-After): the claim leaves their attempts alone until it may."""
        now = time.monotonic() if now is None else now
        blocked: set[str] = set()
        for state in self.providers.values():
            if (
                state.hold_until > now
                or (state.state == OPEN and state.open_until > now)
                or (state.state == HALF_OPEN and state.probing)
            ):
                blocked |= state.tools
        return blocked

    def probe_tools(self, *, now: float | None = None) -> dict[str, set[str]]:
        """Providers due for their probe (breaker open past its window, or half-open with no
        probe in flight), with their tools: the claim takes one attempt for each."""
        now = time.monotonic() if now is None else now
        return {
            key: set(state.tools)
            for key, state in self.providers.items()
            if state.hold_until <= now
            and (
                (state.state == OPEN and state.open_until <= now)
                or (state.state == HALF_OPEN and not state.probing)
            )
        }

    def failing(self, adapter: Adapter) -> bool:
        """Its last call failed (or its breaker is not closed): a call in flight to it is
        expected to take its whole deadline, so nobody waits for it to group answers."""
        state = self.of(adapter)
        return state.failures > 0 or state.state != CLOSED

    def has_room(self, adapter: Adapter) -> bool:
        state = self.of(adapter)
        if state.state == HALF_OPEN:
            return not state.probing
        return state.in_flight < state.cap

    def started(self, adapter: Adapter) -> None:
        state = self.of(adapter)
        state.in_flight += 1
        if state.state == HALF_OPEN:
            state.probing = True

    def finished(self, adapter: Adapter, answers: list[Any], *, now: float | None = None) -> None:
        """Record a call's answers (a send and its confirming lookup are one call)."""
        state = self.of(adapter)
        now = time.monotonic() if now is None else now
        state.in_flight = max(0, state.in_flight - 1)
        retry_after = [a.retry_after for a in answers if getattr(a, "retry_after", None)]
        statuses = {getattr(a, "http_status", None) for a in answers}
        if retry_after or statuses & BACKOFF_STATUSES:
            wait = max(retry_after, default=DEFAULT_RETRY_AFTER)
            state.hold_until = max(state.hold_until, now + min(wait, self.open_cap))
        failure = next((why for a in answers if (why := failure_of(a))), "")
        if not failure:
            state.failures = 0
            state.opened = 0
            state.state = CLOSED
            state.probing = False
            return
        state.failures += 1
        state.last_error = failure[:300]
        if state.state == HALF_OPEN or state.failures >= self.failures_to_open:
            state.opened += 1
            state.state = OPEN
            state.probing = False
            wait = min(self.open_cap, self.open_seconds * 2 ** min(state.opened - 1, 16))
            state.open_until = now + wait

    def errored(self, adapter: Adapter, error: BaseException) -> None:
        """The adapter raised: its call is over; the error is the attempt's, not the
        provider's, so the breaker does not count it."""
        state = self.of(adapter)
        state.in_flight = max(0, state.in_flight - 1)
        if state.state == HALF_OPEN:
            state.probing = False

    def snapshot(self, *, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Degraded providers (breaker not closed, or holding for Retry-After), for the
        heartbeat that /healthz and /metrics read."""
        now = time.monotonic() if now is None else now
        wall = timezone.now()
        out: dict[str, dict[str, Any]] = {}
        for key, state in sorted(self.providers.items()):
            if not state.degraded(now) and not state.failures:
                continue
            until = max(state.open_until if state.state == OPEN else 0.0, state.hold_until)
            out[key[:200]] = {
                "state": state.state,
                "failures": state.failures,
                "retry_after": state.hold_until > now,
                "until": (wall + dt.timedelta(seconds=max(0.0, until - now))).isoformat()
                if until > now
                else None,
                "last_error": state.last_error[:200],
                "tools": sorted(state.tools)[:20],
            }
        return out
