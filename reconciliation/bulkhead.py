"""Each provider endpoint and operation behind its own bulkhead, so one slow, failing or
rate-limiting provider holds up nobody else: a cap on its calls in flight, a circuit breaker,
and its ``Retry-After``.

A bulkhead is keyed by *what fails together*: the endpoint a call goes to (for the generic
HTTP provider, the URL's host, port and path up to its first placeholder; for Stripe or an MCP
upstream, the provider) **and** the operation (``send`` or ``lookup``). Tools on one host share
nothing unless they share the endpoint: a lookup URL answering 503 defers no send of another
tool on that host, and a breaker opened by lookups does not stop sends that succeed.

The breaker of one bulkhead:

- *closed*: calls go through; ``BREAKER_FAILURES`` failures in a row (no answer within the
  deadline, a refused connection, a 5xx, a 429) open it;
- *open*: no call is made; attempts due for it are deferred until it may be probed again
  (``BREAKER_OPEN_SECONDS``, doubling while probes keep failing, at most the backoff cap);
- *half-open*: one call, the probe, goes through; its success closes the breaker, its failure
  opens it again.

A 429 or 503 with ``Retry-After`` holds that bulkhead (only that one) for as long as it asked,
whatever the breaker says.

The workers of one deployment share what they find: each publishes its degraded bulkheads in
its heartbeat (``snapshot``), and each adopts the open breakers and holds of the others
(``adopt``), so a second worker does not hammer a provider the first found down; it probes it
when the first one's window ends.

How many calls a bulkhead may have in flight adapts to its provider (``AdaptiveLimit``, in the
spirit of additive-increase/multiplicative-decrease congestion control): it starts at
``START_LIMIT`` (at most half of the worker's ``--concurrency``), grows by one for each sound
answer that came back within ``TOLERANCE`` times the provider's usual latency while the limit
was in use, shrinks by ``LATENCY_BACKOFF`` for an answer slower than that and by
``FAILURE_BACKOFF`` for a failure (no answer within the deadline, a refused connection, a 5xx,
a 429), never below one and never above its ceiling: what the operator allows
(``PROVIDER_CONCURRENCY`` and its per-key overrides), at most the worker's ``--concurrency``. A
healthy provider's backlog so drains at the worker's full concurrency and a struggling one is
sent fewer calls at once, then more again as it recovers. Each worker learns its own limits
(the ceiling is per worker); what workers share is the breaker and holds above.

A bulkhead may fill the worker's whole ``--concurrency``; the pool keeps ``reserve`` more
threads (half of it) that only a bulkhead using less than half of it may take, so a provider
that turns slow while it holds the pool holds up nobody else (``Bulkheads.may_start``).

The reconciler's main thread is the only caller: no lock needed.
"""

from __future__ import annotations

import datetime as dt
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

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

SEND = "send"
LOOKUP = "lookup"
OPERATIONS = (SEND, LOOKUP)

# Statuses after which a provider is asking us to slow down.
BACKOFF_STATUSES = frozenset({429, 503})
# A 429/503 without Retry-After still holds the bulkhead this long.
DEFAULT_RETRY_AFTER = 5.0
# A bulkhead whose call was cut at its deadline within this many seconds is named by /healthz.
SLOW_WINDOW = 300.0


def failure_of(answer: Any) -> str:
    """Why this answer counts against its bulkhead ('' when the provider answered soundly)."""
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


def cut_at_deadline(answer: Any) -> bool:
    """The call ran to its deadline and was cut (the transport says "timeout")."""
    return getattr(answer, "detail", "").startswith("timeout")


def key_of(endpoint: str, operation: str) -> str:
    return f"{operation} {endpoint}"


class Limit(Protocol):
    """How many calls one bulkhead may have in flight."""

    def allows(self, in_flight: int) -> bool: ...

    def record(self, latency_ms: int, *, failed: bool, in_flight: int = 0) -> None: ...

    @property
    def cap(self) -> int: ...

    @property
    def ceiling(self) -> int: ...


@dataclass
class FixedLimit:
    """A cap that does not move (kept for callers that want one)."""

    cap: int

    @property
    def ceiling(self) -> int:
        return self.cap

    def allows(self, in_flight: int) -> bool:
        return in_flight < self.cap

    def record(self, latency_ms: int, *, failed: bool, in_flight: int = 0) -> None:
        pass


# The adaptive limit's constants (see the module's docstring).
START_LIMIT = 4
TOLERANCE = 2.0  # an answer slower than this many times the usual latency is "rising latency"
LATENCY_SLACK_MS = 10.0  # ... and slower by at least this much (a 2 ms provider's jitter is not)
LATENCY_BACKOFF = 0.9
FAILURE_BACKOFF = 0.5
BASELINE_UP = 0.02  # how fast the usual latency follows answers slower than it (a new normal)
BASELINE_DOWN = 0.2  # ... and answers faster than it


@dataclass
class AdaptiveLimit:
    """Calls in flight one bulkhead may have now, learnt from its answers (AIMD on latency
    and failures, between 1 and ``ceiling``)."""

    ceiling: int
    limit: float = float(START_LIMIT)
    baseline_ms: float = 0.0  # the provider's usual latency (0: no answer yet)
    grown: int = 0  # times the limit grew (for tests and the bench)
    shrunk: int = 0

    def __post_init__(self) -> None:
        self.ceiling = max(1, self.ceiling)
        self.limit = float(max(1, min(self.limit, self.ceiling)))

    @property
    def cap(self) -> int:
        return max(1, min(self.ceiling, int(self.limit)))

    def allows(self, in_flight: int) -> bool:
        return in_flight < self.cap

    def record(self, latency_ms: int, *, failed: bool, in_flight: int = 0) -> None:
        """One answer (or failure) of a call that had ``in_flight`` calls of its bulkhead in
        flight with it, itself included."""
        if failed:
            self._shrink(FAILURE_BACKOFF)
            return
        latency = float(max(0, latency_ms))
        if not self.baseline_ms:
            self.baseline_ms = latency
        slow = latency > max(self.baseline_ms * TOLERANCE, self.baseline_ms + LATENCY_SLACK_MS)
        rate = BASELINE_UP if latency > self.baseline_ms else BASELINE_DOWN
        self.baseline_ms += (latency - self.baseline_ms) * rate
        if slow:
            self._shrink(LATENCY_BACKOFF)
        elif 2 * in_flight >= self.cap and self.limit < self.ceiling:
            # Grow only while the limit is in use: an idle provider earns no room it never
            # showed it can take.
            self.limit = min(float(self.ceiling), self.limit + 1.0)
            self.grown += 1

    def _shrink(self, factor: float) -> None:
        smaller = max(1.0, self.limit * factor)
        if smaller < self.limit:
            self.shrunk += 1
        self.limit = smaller


@dataclass
class Bulkhead:
    key: str
    endpoint: str
    operation: str
    limit: Limit
    state: str = CLOSED
    failures: int = 0  # in a row
    opened: int = 0  # times opened in a row without a successful probe
    open_until: float = 0.0  # monotonic
    hold_until: float = 0.0  # Retry-After, monotonic
    since: dt.datetime | None = None  # when it left closed (or began holding): the cause
    in_flight: int = 0
    probing: bool = False
    last_error: str = ""
    last_cut: float = 0.0  # monotonic: the last call cut at its deadline
    cut_calls: int = 0
    shared_from: str = ""  # another worker's, adopted from its heartbeat
    tools: set[str] = field(default_factory=set)

    @property
    def cap(self) -> int:
        return self.limit.cap

    def degraded(self, now: float) -> bool:
        return self.state != CLOSED or self.hold_until > now

    def blocked(self, now: float) -> bool:
        return (
            self.hold_until > now
            or (self.state == OPEN and self.open_until > now)
            or (self.state == HALF_OPEN and self.probing)
        )

    def next_probe(self, now: float) -> float:
        """Monotonic time from which a call may be made again."""
        until = self.hold_until
        if self.state == OPEN:
            until = max(until, self.open_until)
        return max(until, now)

    def cause(self) -> str:
        """What holds this bulkhead, as one stable string for as long as the trouble lasts."""
        since = self.since.isoformat() if self.since else ""
        return f"{self.key}@{since}"


# Kept for callers that name the old class.
ProviderState = Bulkhead


class Bulkheads:
    """The bulkheads of every endpoint and operation this worker has called."""

    def __init__(self, *, concurrency: int) -> None:
        ledger = settings.LEDGER
        self.default_cap = ledger["PROVIDER_CONCURRENCY"]
        self.caps: dict[str, int] = dict(ledger["PROVIDER_CONCURRENCY_BY_KEY"])
        self.failures_to_open = ledger["PROVIDER_BREAKER_FAILURES"]
        self.open_seconds = float(ledger["PROVIDER_BREAKER_OPEN_SECONDS"])
        self.open_cap = float(ledger["BACKOFF_CAP"])
        # A bulkhead may take the worker's whole concurrency; the pool keeps ``reserve``
        # threads more for the bulkheads that use less than half of it (``may_start``).
        self.concurrency = max(1, concurrency)
        self.max_cap = self.concurrency
        self.reserve = self.concurrency // 2
        self.providers: dict[str, Bulkhead] = {}
        # Each adapter's bulkhead by operation, found once per adapter (a registry's adapter
        # lives for a pass or its carried calls): the main thread asks for it several times
        # per call, and an endpoint may parse a URL.
        self._of: weakref.WeakKeyDictionary[Adapter, dict[str, Bulkhead]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def threads(self) -> int:
        """The pool's size: the worker's concurrency and the reserve."""
        return self.concurrency + self.reserve

    def limit_for(self, adapter: Adapter, endpoint: str, operation: str) -> Limit:
        """The limit of a new bulkhead, whose ceiling is configured by the bulkhead's key
        (``lookup host:port/path``), its endpoint, its provider (``host:port``) or its tool,
        else the default; never above the worker's concurrency."""
        for name in (
            key_of(endpoint, operation),
            endpoint,
            adapter.provider_key,
            adapter.tool.name,
        ):
            if name in self.caps:
                cap = self.caps[name]
                break
        else:
            cap = self.default_cap
        # A provider not heard from yet gets what the fixed cap gave it: at most START_LIMIT,
        # at most half of the worker's concurrency.
        start = max(1, min(START_LIMIT, self.concurrency // 2))
        return AdaptiveLimit(max(1, min(cap, self.max_cap)), limit=float(start))

    def of(self, adapter: Adapter, operation: str) -> Bulkhead:
        """The bulkhead of this adapter's calls of ``operation`` (made on first use)."""
        known = self._of.get(adapter)
        if known is None:
            known = self._of[adapter] = {}
        state = known.get(operation)
        if state is None:
            state = known[operation] = self._find(adapter, operation)
        return state

    def _find(self, adapter: Adapter, operation: str) -> Bulkhead:
        endpoint = adapter.endpoint(operation)
        key = key_of(endpoint, operation)
        state = self.providers.get(key)
        if state is None:
            limit = self.limit_for(adapter, endpoint, operation)
            state = self.providers[key] = Bulkhead(key, endpoint, operation, limit)
        state.tools.add(adapter.tool.name)
        return state

    def refusal(
        self, adapter: Adapter, operation: str, *, now: float | None = None
    ) -> Deferral | None:
        """Why no call may be started for this bulkhead now (a ``Deferral``); None when one
        may (given room under its cap). Moves an open breaker to half-open when its time has
        come."""
        state = self.of(adapter, operation)
        now = time.monotonic() if now is None else now
        if state.hold_until > now:
            return self._deferral(state, now, self._asked_to_wait(state))
        if state.state == OPEN:
            if state.open_until > now:
                return self._deferral(
                    state,
                    now,
                    f"circuit open after {state.failures} failures ({state.last_error[:120]})",
                )
            state.state = HALF_OPEN
            state.probing = False
        if state.state == HALF_OPEN and state.probing:
            return Deferral(
                state.key,
                max(1.0, self.open_seconds / 2),
                f"{state.operation} at {state.endpoint}: circuit half-open, waiting for its probe",
                state.cause(),
                state.since,
            )
        return None

    def deferral_of(self, state: Bulkhead, *, now: float | None = None) -> Deferral:
        """Why this (holding) bulkhead makes no call now, as ``refusal`` says it."""
        now = time.monotonic() if now is None else now
        if state.hold_until > now:
            return self._deferral(state, now, self._asked_to_wait(state))
        if state.state == HALF_OPEN:
            return self._deferral(state, now, "circuit half-open, waiting for its probe")
        return self._deferral(
            state,
            now,
            f"circuit open after {state.failures} failures ({state.last_error[:120]})",
        )

    @staticmethod
    def _asked_to_wait(state: Bulkhead) -> str:
        said = f" ({state.last_error[:120]})" if state.last_error else ""
        return f"asked to wait (Retry-After){said}"

    def _deferral(self, state: Bulkhead, now: float, what: str) -> Deferral:
        seconds = state.next_probe(now) - now
        return Deferral(
            state.key,
            seconds,
            f"{state.operation} at {state.endpoint}: {what}",
            state.cause(),
            state.since,
        )

    def blocked(self, *, now: float | None = None) -> dict[str, set[str]]:
        """Tools whose calls of an operation may not be made now (breaker open, probe in
        flight, holding for Retry-After), by operation: the claim leaves their attempts alone
        until they may."""
        now = time.monotonic() if now is None else now
        out: dict[str, set[str]] = {operation: set() for operation in OPERATIONS}
        for state in self.providers.values():
            if state.blocked(now):
                out[state.operation] |= state.tools
        return out

    def holding(self, *, now: float | None = None) -> list[Bulkhead]:
        """The bulkheads that hold work now (see ``blocked``)."""
        now = time.monotonic() if now is None else now
        return [state for state in self.providers.values() if state.blocked(now)]

    def probes_due(self, *, now: float | None = None) -> dict[str, tuple[str, set[str]]]:
        """Bulkheads due for their probe (breaker open past its window, or half-open with no
        probe in flight), with their operation and tools: the claim takes one attempt for each."""
        now = time.monotonic() if now is None else now
        return {
            key: (state.operation, set(state.tools))
            for key, state in self.providers.items()
            if state.hold_until <= now
            and (
                (state.state == OPEN and state.open_until <= now)
                or (state.state == HALF_OPEN and not state.probing)
            )
        }

    def failing(self, adapter: Adapter, operation: str) -> bool:
        """Its last call failed (or its breaker is not closed): a call in flight to it is
        expected to take its whole deadline, so nobody waits for it to group answers."""
        state = self.of(adapter, operation)
        return state.failures > 0 or state.state != CLOSED

    def has_room(self, adapter: Adapter, operation: str) -> bool:
        state = self.of(adapter, operation)
        if state.state == HALF_OPEN:
            return not state.probing
        return state.limit.allows(state.in_flight)

    def may_start(self, adapter: Adapter, operation: str, in_flight: int) -> bool:
        """Whether a call of this bulkhead may start now, with ``in_flight`` calls of all
        bulkheads in flight: room under its limit, and a thread of the worker's concurrency,
        or of the reserve when this bulkhead uses less than half of that concurrency."""
        if not self.has_room(adapter, operation):
            return False
        if in_flight < self.concurrency:
            return True
        state = self.of(adapter, operation)
        return in_flight < self.threads and 2 * state.in_flight < self.concurrency

    def started(self, adapter: Adapter, operation: str) -> None:
        state = self.of(adapter, operation)
        state.in_flight += 1
        if state.state == HALF_OPEN:
            state.probing = True

    def finished(
        self,
        adapter: Adapter,
        operation: str,
        answers: list[Any],
        *,
        now: float | None = None,
    ) -> None:
        """Record a call's answers and free its place under the cap."""
        state = self.of(adapter, operation)
        in_flight = state.in_flight
        state.in_flight = max(0, state.in_flight - 1)
        self.record(adapter, operation, answers, now=now, in_flight=in_flight)

    def record(
        self,
        adapter: Adapter,
        operation: str,
        answers: list[Any],
        *,
        now: float | None = None,
        in_flight: int | None = None,
    ) -> None:
        """What the provider answered to calls of this bulkhead (a send's confirming lookup is
        recorded against the lookup's bulkhead this way, with no place under its cap), with
        ``in_flight`` calls of it in flight when the answer came (this one included)."""
        state = self.of(adapter, operation)
        now = time.monotonic() if now is None else now
        retry_after = [a.retry_after for a in answers if getattr(a, "retry_after", None)]
        statuses = {getattr(a, "http_status", None) for a in answers}
        if retry_after or statuses & BACKOFF_STATUSES:
            wait = max(retry_after, default=DEFAULT_RETRY_AFTER)
            if state.hold_until <= now and state.state == CLOSED:
                state.since = timezone.now()
            state.hold_until = max(state.hold_until, now + min(wait, self.open_cap))
        failure = next((why for a in answers if (why := failure_of(a))), "")
        busy = state.in_flight + 1 if in_flight is None else in_flight
        for answer in answers:
            state.limit.record(
                int(getattr(answer, "latency_ms", 0) or 0), failed=bool(failure), in_flight=busy
            )
            if cut_at_deadline(answer):
                state.last_cut = now
                state.cut_calls += 1
        if not failure:
            state.failures = 0
            state.opened = 0
            state.state = CLOSED
            state.probing = False
            state.shared_from = ""
            if state.hold_until <= now:
                state.since = None
            return
        state.failures += 1
        state.last_error = failure[:300]
        if state.state == OPEN:
            # A call started before the breaker opened: its failure is no news, and only a
            # failed probe doubles the window.
            return
        if state.state == HALF_OPEN or state.failures >= self.failures_to_open:
            state.since = state.since or timezone.now()
            state.opened += 1
            state.state = OPEN
            state.probing = False
            wait = min(self.open_cap, self.open_seconds * 2 ** min(state.opened - 1, 16))
            state.open_until = now + wait

    def errored(self, adapter: Adapter, operation: str, error: BaseException) -> None:
        """The adapter raised: its call is over; the error is the attempt's, not the
        provider's, so the breaker does not count it."""
        state = self.of(adapter, operation)
        state.in_flight = max(0, state.in_flight - 1)
        if state.state == HALF_OPEN:
            state.probing = False

    # -----------------------------------------------------------------------------------------
    # Shared by the workers of a deployment, through their heartbeats

    def snapshot(self, *, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Degraded bulkheads (breaker not closed, holding for Retry-After, failing, or with a
        call cut at its deadline lately), for the heartbeat that /healthz, /metrics, the
        overview and the other workers read."""
        now = time.monotonic() if now is None else now
        wall = timezone.now()
        out: dict[str, dict[str, Any]] = {}
        for key, state in sorted(self.providers.items()):
            cut_lately = state.last_cut and now - state.last_cut <= SLOW_WINDOW
            if not state.degraded(now) and not state.failures and not cut_lately:
                continue
            until = state.next_probe(now) if state.degraded(now) else now

            def wall_at(mono: float) -> str:
                return (wall + dt.timedelta(seconds=mono - now)).isoformat()

            out[key[:200]] = {
                "state": state.state,
                "endpoint": state.endpoint[:200],
                "operation": state.operation,
                "failures": state.failures,
                "retry_after": state.hold_until > now,
                "since": state.since.isoformat() if state.since else None,
                "until": wall_at(until) if until > now else None,
                "last_error": state.last_error[:200],
                "past_deadline": wall_at(state.last_cut) if cut_lately else None,
                "cut_calls": state.cut_calls,
                "shared_from": state.shared_from,
                "tools": sorted(state.tools)[:20],
            }
        return out

    def adopt(
        self,
        others: dict[str, dict[str, dict[str, Any]]],
        adapters: dict[str, Adapter],
        *,
        now: float | None = None,
    ) -> None:
        """Take on what other workers found (their heartbeats' snapshots, by worker id): an
        open breaker or a hold this worker does not know yet is opened here until the same
        moment, so this worker makes no call to it before the other's window ends."""
        now = time.monotonic() if now is None else now
        wall = timezone.now()
        for worker, snapshot in others.items():
            for info in (snapshot or {}).values():
                if not isinstance(info, dict) or info.get("shared_from"):
                    continue  # adopted there: the worker that found it speaks for it
                operation, endpoint = info.get("operation"), info.get("endpoint")
                until = _parse(info.get("until"))
                if operation not in OPERATIONS or not endpoint or until is None:
                    continue
                left = (until - wall).total_seconds()
                if left <= 0:
                    continue
                tools = [
                    adapters[name]
                    for name in info.get("tools") or []
                    if name in adapters and adapters[name].endpoint(operation) == endpoint
                ]
                if not tools:
                    continue
                state = self.of(tools[0], operation)
                for adapter in tools[1:]:
                    state.tools.add(adapter.tool.name)
                if state.in_flight or state.next_probe(now) >= now + left:
                    continue  # this worker knows as much already, or is calling it now
                state.shared_from = worker[:100]
                state.since = _parse(info.get("since")) or state.since or wall
                state.last_error = str(info.get("last_error") or "")[:300]
                if info.get("retry_after"):
                    state.hold_until = max(state.hold_until, now + left)
                if info.get("state") in (OPEN, HALF_OPEN):
                    state.state = OPEN
                    state.probing = False
                    state.failures = max(state.failures, int(info.get("failures") or 0))
                    state.opened = max(state.opened, 1)
                    state.open_until = max(state.open_until, now + left)


@dataclass(frozen=True, slots=True)
class Deferral:
    """Why a bulkhead makes no call now, and for how long (seconds)."""

    key: str
    seconds: float
    why: str
    cause: str
    since: dt.datetime | None

    def __iter__(self):  # (seconds, why), as callers unpacked it before
        return iter((self.seconds, self.why))


def _parse(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None
