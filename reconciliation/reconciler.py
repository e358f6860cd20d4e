"""Recovery as reconciliation with the outside world (protocol sections 5 and 6).

One pass claims due attempts with a lease and a fencing version, then runs a small pipeline:

1. *prepare* (one write transaction for the whole claimed batch): stale DISPATCHED claims become
   UNKNOWN, stale or approved intents are claimed for sending under the authority that holds now
   (or superseded by a linked attempt when it changed), manual-class UNKNOWNs go to a person;
2. *I/O* in a thread pool: provider lookups and sends. Threads never touch the database: they get
   a frozen ``Call`` and return the provider's answer;
3. *apply* (one write transaction per group of finished answers): the decision table. A decision
   to send again commits DISPATCHED first, then the send goes back into the pool.

Every write goes through ``attempts.states.move``, a compare-and-set on the version the claim
took, so a worker whose lease was overtaken changes nothing (``StaleAttempt``). The main thread
is the only writer, which keeps SQLite's single writer busy with few, larger commits.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from attempts import authority, ledger, linked, locking, states, tracing
from attempts.locking import write_transaction
from attempts.models import Attempt, AttemptEvent, EffectClass, State
from attempts.states import Actor, TransitionError
from reconciliation.bulkhead import LOOKUP, SEND, Bulkhead, Bulkheads, Deferral
from reconciliation.faults import arm_kill_timer, crash_point, mutation
from reconciliation.models import WorkerHeartbeat
from reconciliation.providers import base
from reconciliation.providers.answers import evidence_of, id_problem
from reconciliation.providers.registry import Registry
from reconciliation.providers.registry import close_shared as registry_close_shared

log = logging.getLogger("ledgerweb.reconciler")

# How long a claim lasts at least; longer when a tool's timeout asks for it.
MIN_LEASE_SECONDS = 60.0


# Lookups and sends run in pool threads that mostly wait on sockets, and the main thread is the
# only database writer. Under CPython's default 5 ms switch interval each SQL statement of the
# writer can wait that long for the GIL behind a thread parsing an HTTP answer, so a worker process
# asks for a shorter one.
WORKER_SWITCH_INTERVAL = 0.0005


def tune_worker_process() -> None:
    """Process-wide settings for a dedicated reconcile worker process (see above)."""
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)


def new_worker_id() -> str:
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def backoff_delay(checks_so_far: int, *, rng: random.Random | None = None) -> float:
    """Seconds until the next lookup: full jitter over ``first * 2**n``, capped."""
    first = settings.LEDGER["BACKOFF_BASE"]
    cap = settings.LEDGER["BACKOFF_CAP"]
    ceiling = min(float(cap), first * 2.0 ** min(checks_so_far, 32))
    return (rng or random).uniform(0.0, ceiling)


def max_sends_for(adapter: base.Adapter) -> int:
    return adapter.tool.max_sends or settings.LEDGER["MAX_SENDS"]


# States an attempt may be handed to a person from when handling it fails.
QUARANTINABLE = frozenset(
    {State.INTENT_RECORDED, State.DISPATCHED, State.UNKNOWN, State.FAILED_RETRYABLE}
)

# Outcomes after which the attempt is still recovery's work.
UNSETTLED = frozenset(
    {"still_unknown", "blocked", "failed_retryable", "errors", "quarantined", "deferred"}
)

# The states whose next call is a lookup (a stale DISPATCHED claim becomes UNKNOWN first) or
# a send: what a bulkhead of that operation holds.
OPERATION_STATES = {
    LOOKUP: (State.UNKNOWN, State.DISPATCHED),
    SEND: (State.INTENT_RECORDED, State.FAILED_RETRYABLE),
}
DEFERRED_ACTION = "attempt.provider_deferred"
BLOCKED_ACTION = "attempt.recovery_blocked"
# How often a worker looks for held work that has not been told why it waits yet.
TELL_EVERY = 2.0


def operation_of(attempt: Attempt) -> str:
    """The call recovery makes next for this attempt: a lookup or a send."""
    return LOOKUP if attempt.state in OPERATION_STATES[LOOKUP] else SEND


@dataclass(frozen=True, slots=True)
class _Hold:
    """Work recovery may not call out for now: one bulkhead (breaker open, Retry-After) or one
    tool it cannot use as configured. Each held attempt is told once per ``cause`` (an event),
    then left due, so it is taken up in time order as soon as the hold ends."""

    action: str
    tools: frozenset[str]
    states: tuple[str, ...]
    cause: str
    why: str
    seconds: float
    details: dict[str, Any]


# A pass that lasts beats this often, so /healthz sees the worker alive whatever a provider does.
BEAT_EVERY = 5.0
# A worker that keeps calls in flight across passes (the loop) writes its heartbeat at most
# this often.
CARRY_BEAT_EVERY = 1.0


@dataclass
class Summary:
    """What one pass (or a whole run) did. ``outcomes`` counts where attempts ended up."""

    claimed: int = 0
    lookups: int = 0
    sends: int = 0
    lost: int = 0  # changed by someone else after our claim: left alone
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def settled(self) -> int:
        """Attempts that left recovery's hands: confirmed, failed, linked, or given to a person."""
        return sum(n for name, n in self.outcomes.items() if name not in UNSETTLED)

    def add(self, other: Summary) -> None:
        self.claimed += other.claimed
        self.lookups += other.lookups
        self.sends += other.sends
        self.lost += other.lost
        self.outcomes.update(other.outcomes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "lookups": self.lookups,
            "sends": self.sends,
            "lost": self.lost,
            "settled": self.settled,
            **{name: self.outcomes[name] for name in sorted(self.outcomes)},
        }

    def __str__(self) -> str:
        parts = [f"{name}={value}" for name, value in self.as_dict().items()]
        return " ".join(parts)


@dataclass
class _Job:
    """One attempt's trip to the provider."""

    kind: str  # "lookup" or "send"
    attempt: Attempt
    adapter: base.Adapter
    call: base.Call
    pass_id: int = 0  # the pass that started its call
    bulkhead: Bulkhead | None = None  # its adapter's for its kind, once looked up


@dataclass(frozen=True, slots=True)
class _SendResult:
    send: base.SendAnswer
    confirmation: base.LookupAnswer | None


@dataclass(frozen=True, slots=True)
class _JobError:
    """An adapter raised instead of answering: the attempt goes to a person, the pass goes on."""

    error: BaseException


class _NeedsSavepoints(Exception):
    """A step run without a savepoint failed unexpectedly: the group is written again, each
    attempt in its own savepoint (PostgreSQL cannot go on in a transaction after an error)."""


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")[:300]


def _outcome(future: Future) -> base.LookupAnswer | _SendResult | _JobError:
    try:
        return future.result()
    except Exception as exc:
        return _JobError(exc)


def _run_job(job: _Job) -> base.LookupAnswer | _SendResult:
    """Runs in a pool thread: provider I/O only, no database."""
    if job.kind == "lookup":
        return _traced_lookup(job)
    with tracing.span("ledger.resend", job.attempt) as s:
        answer = job.adapter.send(job.call)
        if s is not None:
            s.set_attribute("ledger.send_status", str(answer.status))
    confirmation = None
    if answer.status == base.SendStatus.ACCEPTED and job.adapter.can_look_up:
        # A 2xx alone is not confirmation: look the effect up right away.
        confirmation = _traced_lookup(job)
    return _SendResult(answer, confirmation)


def _traced_lookup(job: _Job) -> base.LookupAnswer:
    with tracing.span("ledger.lookup", job.attempt) as s:
        answer = job.adapter.lookup(job.call)
        if s is not None:
            s.set_attribute("ledger.lookup_status", str(answer.status))
        return answer


class Reconciler:
    """Claims due attempts and settles them by the decision table of protocol section 6."""

    # Finished answers are written together: at most this many, or after this many seconds,
    # or as soon as no other call finished within FLUSH_GAP of the last one, or at once when
    # the only calls left in flight go to failing providers. A group stays open only while
    # answers keep coming: a slow provider's call (a trickle, a black hole, each up to its
    # deadline) does not hold back the answers of the others.
    FLUSH_SIZE = 100
    FLUSH_AFTER = 0.05
    FLUSH_GAP = 0.005

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 16,
        batch_size: int = 200,
        lease_seconds: float | None = None,
        rng: random.Random | None = None,
        restarts: int = 0,
        last_exit: str = "",
    ) -> None:
        if concurrency < 1 or batch_size < 1:
            raise ValueError("concurrency and batch_size must be at least 1")
        self.worker_id = worker_id or new_worker_id()
        self.actor = Actor.worker(self.worker_id[:150])
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        self.rng = rng or random.Random()
        self.restarts = restarts
        self.last_exit = last_exit[:200]
        self.bulkheads = Bulkheads(concurrency=concurrency)
        # Provider calls outlive a pass only in the worker's loop (``carry``): started in this
        # pool, bounded by their deadlines, and waited for by ``close``.
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: dict[Future, _Job] = {}
        self._waiting: deque[_Job] = deque()  # waiting for room under their provider's cap
        self._last_beat = time.monotonic()
        self._claimed_at = time.monotonic()
        self._unbeaten = Summary()
        self._passes = 0
        self._tool_holds: list[_Hold] = []
        self._told_at = -TELL_EVERY
        self._told_causes: frozenset[str] = frozenset()

    # -----------------------------------------------------------------------------------------
    # Claiming

    def _lease_for(self, registry: Registry, tool_names: list[str]) -> dt.timedelta:
        if self.lease_seconds is not None:
            return dt.timedelta(seconds=self.lease_seconds)
        timeouts = [t.timeout_seconds for name in tool_names if (t := registry.tool(name))]
        # A lookup, a send and its confirming lookup, after waiting behind a claimed batch that
        # may all time out. Not sized for a batch queued behind one provider's cap: a dead
        # worker's claims must come free within minutes; an attempt still queued when its lease
        # ends may be claimed by another worker, and the fencing version keeps that harmless.
        rounds = 3 + self.batch_size / self.concurrency
        return dt.timedelta(seconds=max(MIN_LEASE_SECONDS, rounds * max(timeouts, default=0)))

    def claim(self, *, cutoff: dt.datetime, limit: int, lease: dt.timedelta) -> list[Attempt]:
        """Claim up to ``limit`` attempts due at ``cutoff`` whose lease is free.

        Each claim is a compare-and-set on (id, version, lease free) that bumps the version
        (``states.claim_lease``, many rows a statement): the fencing token every later move
        compares against. On PostgreSQL candidates are read ``FOR UPDATE SKIP LOCKED`` so
        workers do not queue on each other's rows.
        """
        self._claimed_at = time.monotonic()
        now = timezone.now()
        free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
        with write_transaction():
            # Scheduled checks, and in-flight work stale by today's LEDGERWEB_STALE_AFTER
            # (not the value in force when the attempt was recorded).
            scheduled = Attempt.objects.due(cutoff).filter(free).order_by("next_check_at", "id")
            stale = (
                Attempt.objects.stale_in_flight(cutoff).filter(free).order_by("updated_at", "id")
            )
            # Work that may not be called out for now (a bulkhead's breaker open or holding for
            # Retry-After, a tool unusable as configured): not claimed, so it stays due in
            # its order; it is told why once (``_tell``). A bulkhead due for its probe gets one
            # attempt (below), the oldest, not all of them.
            probing = self.bulkheads.probes_due()
            held = Q()
            for operation, tools in self.bulkheads.blocked().items():
                if tools:
                    held |= Q(tool_name__in=sorted(tools), state__in=OPERATION_STATES[operation])
            for operation, tools in probing.values():
                held |= Q(tool_name__in=sorted(tools), state__in=OPERATION_STATES[operation])
            for hold in self._tool_holds:
                held |= Q(tool_name__in=sorted(hold.tools))
            candidates = (scheduled, stale)
            if held:
                scheduled = scheduled.exclude(held)
                stale = stale.exclude(held)
            if connection.vendor == "postgresql":
                scheduled = scheduled.select_for_update(skip_locked=True)
                stale = stale.select_for_update(skip_locked=True)
            # In time order: the scheduled by their due time, then the stale by their age, so
            # work a hold kept due is taken up oldest first when the hold ends.
            found = dict(scheduled.values_list("pk", "version")[:limit])
            found.update(stale.values_list("pk", "version")[:limit])
            probes: dict[int, int] = {}
            for operation, tools in probing.values():
                for queryset in candidates:
                    one = queryset.filter(
                        tool_name__in=sorted(tools), state__in=OPERATION_STATES[operation]
                    )
                    if connection.vendor == "postgresql":
                        one = one.select_for_update(skip_locked=True)
                    probe = list(one.values_list("pk", "version")[:1])
                    if probe:
                        probes.update(probe)
                        break
            # Probes first, so a full batch never starves them; then the oldest work. The
            # leases are taken in id order.
            ordered = list(probes.items()) + [i for i in found.items() if i[0] not in probes]
            rows = sorted(ordered[:limit])
            if not rows:
                return []
            claimed = states.claim_lease(rows, owner=self.worker_id, until=now + lease, now=now)
            return list(
                Attempt.objects.filter(pk__in=claimed, lease_owner=self.worker_id).order_by(
                    "next_check_at", "id"
                )
            )

    # -----------------------------------------------------------------------------------------
    # One pass

    def run_pass(self, *, stop: threading.Event | None = None, carry: bool = False) -> Summary:
        """Settle everything due now (once each), then return what was done.

        Claimed attempts go to the pool at once, each provider's calls up to its cap (the
        rest wait their turn; a provider whose breaker is open or that asked to wait is not
        called: its attempts are deferred). Finished answers are written in groups (up to
        ``FLUSH_SIZE`` answers, or whatever finished within ``FLUSH_AFTER`` seconds while
        answers keep coming: see ``FLUSH_GAP``), so a slow commit is paid once per group rather
        than once per attempt, and a slow provider's call in flight holds no group open.

        With ``carry`` (the worker's loop) the pass returns as soon as nothing more is due and
        nothing finished within ``FLUSH_AFTER``: calls still in flight (a slow provider, within
        its deadline) carry over to the next pass, so the heartbeat, the sealer and the
        notifications never wait for a provider. Without it the pass waits for every call.
        """
        stop = stop or threading.Event()
        arm_kill_timer()  # crashtest's random kill; inert unless fault injection is on
        summary = Summary()
        cutoff, registry, lease = self._begin_pass(summary)
        finished: list[tuple[_Job, Any]] = []
        first_finished_at = 0.0
        exhausted = False
        pool = self._executor()
        self._passes += 1
        pass_id = self._passes
        try:
            while True:
                load = len(self._in_flight) + len(self._waiting)
                if not exhausted and not stop.is_set() and load <= self.batch_size // 2:
                    batch = self.claim(cutoff=cutoff, limit=self.batch_size, lease=lease)
                    if batch:
                        crash_point("reconcile_claimed")
                    summary.claimed += len(batch)
                    exhausted = not batch
                    self._waiting.extend(self._prepare(batch, registry, summary))
                self._start_waiting(pool, summary)
                if not self._in_flight and not finished:
                    if exhausted or stop.is_set():
                        break
                    continue
                got = False
                if self._in_flight:
                    timeout = self._wait_for(
                        bool(finished), first_finished_at, carry=carry, pass_id=pass_id
                    )
                    done, _ = wait(
                        list(self._in_flight), timeout=timeout, return_when=FIRST_COMPLETED
                    )
                    if done and not finished:
                        first_finished_at = time.monotonic()
                    got = bool(done)
                    finished += [self._finished(future) for future in done]
                if finished and (
                    not got
                    or not self._answers_coming()
                    or len(finished) >= self.FLUSH_SIZE
                    or time.monotonic() - first_finished_at >= self.FLUSH_AFTER
                ):
                    # The answers freed their places: the calls waiting for them start before
                    # the group is written, so providers work while the ledger commits.
                    self._start_waiting(pool, summary)
                    self._waiting.extend(self._apply(finished, summary))
                    finished = []
                    continue
                if not finished and not got and time.monotonic() - self._last_beat >= BEAT_EVERY:
                    # A long pass still says the worker is alive.
                    self.heartbeat()
                if carry and not finished and not got:
                    break
        finally:
            if not carry:
                self.close()
        return summary

    def _begin_pass(self, summary: Summary) -> tuple[dt.datetime, Registry, dt.timedelta]:
        """What a pass starts from: its cutoff (after expiring the approvals waited out), the
        providers' registry and the lease; the tools that cannot be called now, the shared
        provider state, and what to tell people."""
        cutoff = timezone.now()
        if expired := ledger.expire_waits(actor=self.actor, now=cutoff):
            summary.outcomes["approval_expired"] += expired
        registry = Registry.load()
        lease = self._lease_for(registry, registry.tool_names)
        self._tool_holds = self._unusable_tools(registry)
        self._adopt_shared(registry)
        self._tell(cutoff, lease, summary)
        return cutoff, registry, lease

    def _wait_for(
        self, finished: bool, first_finished_at: float, *, carry: bool, pass_id: int
    ) -> float:
        """How long the pass waits for calls in flight before it looks again."""
        if finished:
            window = self.FLUSH_AFTER - (time.monotonic() - first_finished_at)
            coming = self._answers_coming()
            return max(0.0, min(self.FLUSH_GAP, window)) if coming else 0.0
        if carry:
            # Never block on a slow provider: wait a moment for calls this pass started to
            # providers that answer, not at all for calls carried over from earlier passes
            # (the loop's wait_for_work wakes when one of those finishes) or made to a failing
            # provider (a probe).
            fresh = self._answers_coming(pass_id=pass_id)
            return self.FLUSH_AFTER if fresh else 0.0
        return BEAT_EVERY

    def _answers_coming(self, *, pass_id: int | None = None) -> bool:
        """Whether a call in flight (started by that pass, when given) goes to a provider
        whose last call did not fail: an answer worth waiting a moment for."""
        return any(
            (pass_id is None or job.pass_id == pass_id)
            and not self.bulkheads.failing(job.adapter, job.kind)
            for job in self._in_flight.values()
        )

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            # The worker's concurrency, and a reserve for the bulkheads that use little of it
            # while another fills it (``Bulkheads.may_start``).
            self._pool = ThreadPoolExecutor(self.bulkheads.threads, thread_name_prefix="reconcile")
        return self._pool

    def _finished(self, future: Future) -> tuple[_Job, Any]:
        job = self._in_flight.pop(future)
        outcome = _outcome(future)
        if isinstance(outcome, _JobError):
            self.bulkheads.errored(job.adapter, job.kind, outcome.error)
        elif isinstance(outcome, _SendResult):
            # The send counts for the send bulkhead; its confirming lookup for the lookup's.
            self.bulkheads.finished(job.adapter, SEND, [outcome.send])
            if outcome.confirmation is not None:
                self.bulkheads.record(job.adapter, LOOKUP, [outcome.confirmation])
        else:
            self.bulkheads.finished(job.adapter, LOOKUP, [outcome])
        return job, outcome

    def _start_waiting(self, pool: ThreadPoolExecutor, summary: Summary) -> None:
        """Start the waiting calls that have room (under the worker's concurrency and their
        bulkhead's limit); defer the lookups of a provider that may not be called now."""
        waiting, self._waiting = self._waiting, deque()
        deferred: list[tuple[_Job, Deferral]] = []
        # Bulkheads found without room: nothing frees a place before this round ends, so
        # their other calls keep waiting without being asked again (a backlog of a batch
        # waits behind a full bulkhead, and this runs twice per group of answers).
        full: set[int] = set()
        while waiting:
            job = waiting.popleft()
            if job.bulkhead is None:
                job.bulkhead = self.bulkheads.of(job.adapter, job.kind)
            bulkhead = id(job.bulkhead)
            if bulkhead in full:
                self._waiting.append(job)
                continue
            refusal = self.bulkheads.refusal(job.adapter, job.kind)
            if refusal is not None:
                deferred.append((job, refusal))
                continue
            if not self.bulkheads.may_start(job.adapter, job.kind, len(self._in_flight)):
                full.add(bulkhead)
                self._waiting.append(job)
                continue
            self.bulkheads.started(job.adapter, job.kind)
            job.pass_id = self._passes
            self._in_flight[pool.submit(_run_job, job)] = job
        if deferred:
            with write_transaction():
                for job, deferral in deferred:
                    self._guarded(summary, self._defer_job, job.attempt, job, deferral, summary)

    def close(self) -> None:
        """Wait for the calls in flight (each bounded by its deadline), write their answers,
        and stop the pool: nothing this worker started outlives it. Calls that were waiting
        for room are left to their lease (another pass or worker takes them up)."""
        try:
            if self._in_flight:
                summary = Summary()
                done, _ = wait(list(self._in_flight))
                finished = [self._finished(future) for future in done]
                self._apply(finished, summary)
                self._unbeaten.add(summary)
            if self._unbeaten.claimed or self._unbeaten.lookups or self._unbeaten.outcomes:
                self.heartbeat(self._unbeaten)
                self._unbeaten = Summary()
        finally:
            self._waiting.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def stop(self) -> None:
        """The worker stops: close its calls (``close``) and what adapters share (pooled
        upstream sessions)."""
        try:
            self.close()
        finally:
            registry_close_shared()

    def seconds_since_claim(self) -> float:
        """Seconds since this worker last looked for due work (its last claim)."""
        return time.monotonic() - self._claimed_at

    def wait_for_work(self, stop: threading.Event, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a call in flight finishes or
        ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._in_flight:
                done, _ = wait(
                    list(self._in_flight), timeout=min(left, 0.2), return_when=FIRST_COMPLETED
                )
                if done:
                    return
            else:
                stop.wait(min(left, 0.2))

    def run_once(self, *, stop: threading.Event | None = None, carry: bool = False) -> Summary:
        """One pass, then record the heartbeat (with ``carry``, at most every
        ``CARRY_BEAT_EVERY`` seconds)."""
        summary = self.run_pass(stop=stop, carry=carry)
        self._unbeaten.add(summary)
        if not carry or time.monotonic() - self._last_beat >= CARRY_BEAT_EVERY:
            self.heartbeat(self._unbeaten)
            self._unbeaten = Summary()
        return summary

    def heartbeat(
        self, summary: Summary | None = None, *, started_at: dt.datetime | None = None
    ) -> None:
        """Record that this worker is alive (``/healthz`` reads the freshest heartbeat)."""
        now = timezone.now()
        summary = summary or Summary()
        self._last_beat = time.monotonic()
        providers = self.bulkheads.snapshot()
        with transaction.atomic():
            updated = WorkerHeartbeat.objects.filter(worker_id=self.worker_id).update(
                last_seen=now,
                providers=providers,
                settled_total=F("settled_total") + summary.settled,
                lookups_total=F("lookups_total") + summary.lookups,
            )
            if not updated:
                WorkerHeartbeat.objects.create(
                    worker_id=self.worker_id,
                    hostname=socket.gethostname()[:200],
                    pid=os.getpid(),
                    started_at=started_at or now,
                    last_seen=now,
                    settled_total=summary.settled,
                    lookups_total=summary.lookups,
                    restarts=self.restarts,
                    last_exit=self.last_exit,
                    providers=providers,
                )

    # -----------------------------------------------------------------------------------------
    # Step 1: before any I/O

    def _prepare(self, batch: list[Attempt], registry: Registry, summary: Summary) -> list[_Job]:
        jobs: list[_Job] = []
        needs_write = []
        deferred: list[tuple[Attempt, Deferral]] = []
        for attempt in batch:
            adapter, problems = registry.usable(attempt.tool_name)
            if adapter is not None and not problems:
                refusal = self.bulkheads.refusal(adapter, operation_of(attempt))
                if refusal is not None:
                    # Its bulkhead's breaker is open or it asked to wait: not called now.
                    deferred.append((attempt, refusal))
                    continue
            if attempt.state == State.UNKNOWN and adapter is not None and not problems:
                if adapter.can_look_up:
                    # The common case writes nothing before its lookup.
                    jobs.append(_Job("lookup", attempt, adapter, base.Call.of(attempt)))
                    continue
            needs_write.append(attempt)
        if needs_write or deferred:
            with write_transaction():
                for attempt, deferral in deferred:
                    self._guarded(summary, self._defer, attempt, deferral, summary)
                for attempt in needs_write:
                    job = self._guarded(summary, self._prepare_one, attempt, registry, summary)
                    if job is not None:
                        jobs.append(job)
        return jobs

    def _defer(
        self,
        attempt: Attempt,
        deferral: Deferral,
        summary: Summary,
        *,
        unsent: bool = False,
    ) -> None:
        """Its bulkhead may not be called now (breaker open, Retry-After): say so in the
        attempt's history, once per cause (the attempt page and the queue show it), and leave
        it due: the claim takes it up, in its turn, as soon as the bulkhead may be called.
        Nothing is sent and nothing is guessed."""
        details = {"provider_deferred": self._deferral_details(deferral)}
        if attempt.state == State.DISPATCHED:
            if unsent:
                # This worker committed the send but never made it: nothing left this machine.
                self._move(
                    attempt,
                    State.FAILED_RETRYABLE,
                    reason=f"not sent: {deferral.why}",
                    details=details,
                    next_check_at=self._still_due(attempt),
                )
                summary.outcomes["deferred"] += 1
                return
            self._move(
                attempt,
                State.UNKNOWN,
                reason="stale claim found by recovery: the send may have happened",
                keep_lease=True,
            )
        self._move(
            attempt,
            None,
            action=DEFERRED_ACTION,
            reason=f"recovery deferred: {deferral.why}",
            details=details,
            next_check_at=self._still_due(attempt),
        )
        summary.outcomes["deferred"] += 1

    def _deferral_details(self, deferral: Deferral) -> dict[str, Any]:
        next_probe = timezone.now() + dt.timedelta(seconds=max(0.0, deferral.seconds))
        return {
            "why": deferral.why[:300],
            "bulkhead": deferral.key[:200],
            "cause": deferral.cause[:260],
            "since": deferral.since.isoformat() if deferral.since else None,
            "next_probe": next_probe.isoformat(),
            "seconds": round(deferral.seconds, 1),
        }

    @staticmethod
    def _still_due(attempt: Attempt) -> dt.datetime:
        """A held attempt keeps its place: due as it was (or now), never pushed back."""
        now = timezone.now()
        if attempt.next_check_at is not None and attempt.next_check_at <= now:
            return attempt.next_check_at
        return now

    def _defer_job(self, attempt: Attempt, job: _Job, deferral: Deferral, summary: Summary) -> None:
        self._defer(attempt, deferral, summary, unsent=job.kind == "send")

    # -----------------------------------------------------------------------------------------
    # Held work: told why, once per cause

    def _unusable_tools(self, registry: Registry) -> list[_Hold]:
        """Tools recovery cannot use as configured (a missing key, no URL): their work is held
        until the configuration is fixed, and used at the first pass after it is."""
        holds = []
        for name in registry.tool_names:
            adapter, problems = registry.usable(name)
            if adapter is not None and not problems:
                continue
            why = "; ".join(problems)[:300]
            holds.append(
                _Hold(
                    BLOCKED_ACTION,
                    frozenset({name}),
                    tuple(OPERATION_STATES[LOOKUP] + OPERATION_STATES[SEND]),
                    f"tool {name}: {why}"[:260],
                    why,
                    0.0,
                    {},
                )
            )
        return holds

    def _bulkhead_holds(self) -> list[_Hold]:
        holds = []
        for state in self.bulkheads.holding():
            deferral = self.bulkheads.deferral_of(state)
            holds.append(
                _Hold(
                    DEFERRED_ACTION,
                    frozenset(state.tools),
                    OPERATION_STATES[state.operation],
                    deferral.cause,
                    deferral.why,
                    deferral.seconds,
                    {"deferral": deferral},
                )
            )
        return holds

    def _tell(self, cutoff: dt.datetime, lease: dt.timedelta, summary: Summary) -> None:
        """Every held attempt that is due gets one event that says why it waits (which
        bulkhead or configuration problem, since when, the next probe), once per cause, not
        once per pass. Bounded: at most a batch per pass, looked for every ``TELL_EVERY``
        seconds or when a cause appears."""
        holds = self._tool_holds + self._bulkhead_holds()
        causes = frozenset(hold.cause for hold in holds)
        if not holds or (
            causes <= self._told_causes and time.monotonic() - self._told_at < TELL_EVERY
        ):
            return
        self._told_at = time.monotonic()
        self._told_causes = causes
        now = timezone.now()
        free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
        waiting = Attempt.objects.due(cutoff) | Attempt.objects.stale_in_flight(cutoff)
        left = self.batch_size
        for hold in holds:
            if left <= 0:
                break
            # Told: an event of this attempt carries this cause (whichever move wrote it).
            told = AttemptEvent.objects.filter(
                attempt=OuterRef("pk"),
                **{f"details__{hold.action.removeprefix('attempt.')}__cause": hold.cause},
            )
            candidates = (
                waiting.filter(free, tool_name__in=sorted(hold.tools), state__in=hold.states)
                .exclude(Exists(told))
                .order_by("next_check_at", "id")
            )
            with write_transaction():
                if connection.vendor == "postgresql":
                    candidates = candidates.select_for_update(skip_locked=True)
                rows = list(candidates.values_list("pk", "version")[:left])
                if not rows:
                    continue
                claimed = states.claim_lease(rows, owner=self.worker_id, until=now + lease, now=now)
                left -= len(claimed)
                for attempt in Attempt.objects.filter(pk__in=claimed, lease_owner=self.worker_id):
                    if hold.action == DEFERRED_ACTION:
                        self._guarded(
                            summary, self._defer, attempt, hold.details["deferral"], summary
                        )
                    else:
                        self._guarded(
                            summary, self._blocked, attempt, hold.why, summary, hold.cause
                        )

    def _adopt_shared(self, registry: Registry) -> None:
        """Open here what the deployment's other workers found open (their heartbeats)."""
        since = timezone.now() - dt.timedelta(seconds=settings.OPS["HEARTBEAT_MAX_AGE"])
        others = dict(
            WorkerHeartbeat.objects.filter(last_seen__gte=since)
            .exclude(worker_id=self.worker_id)
            .exclude(providers={})
            .values_list("worker_id", "providers")[:50]
        )
        if not others:
            return
        names = {
            name
            for snapshot in others.values()
            for info in (snapshot or {}).values()
            if isinstance(info, dict)
            for name in info.get("tools") or []
        }
        adapters = {}
        for name in names:
            adapter, problems = registry.usable(name)
            if adapter is not None and not problems:
                adapters[name] = adapter
        self.bulkheads.adopt(others, adapters)

    def _guarded(
        self,
        summary: Summary,
        step: Callable[..., Any],
        attempt: Attempt,
        *args: Any,
        savepoint: bool = True,
    ) -> Any:
        """Run one attempt's step so that a lost race leaves that attempt alone.

        Steps of several writes run in a savepoint. A step that is a single ``states.move`` may
        skip it: a lost compare-and-set raises before anything is written.
        """
        try:
            if not savepoint:
                return step(attempt, *args)
            with transaction.atomic():
                return step(attempt, *args)
        except (TransitionError, ledger.StateConflict) as exc:
            summary.lost += 1
            log.info("attempt %s changed under us: %s", attempt.attempt_id, exc)
            return None
        except Exception as exc:
            # The database went away (or turned read-only: a failover), not this attempt: the
            # pass stops and the worker's loop tries again later; nothing is quarantined.
            if locking.is_database_away(exc):
                raise
            if not savepoint:
                raise _NeedsSavepoints from exc
            self._quarantine(attempt, exc, summary, during=getattr(step, "__name__", "step"))
            return None

    def _quarantine(
        self, attempt: Attempt, exc: BaseException, summary: Summary, *, during: str
    ) -> None:
        """Handling this attempt raised: it goes to a person (MANUAL_REVIEW with the error, an
        owner and an event) and the pass goes on (protocol section 6, last row)."""
        log.error(
            "attempt %s: unexpected error in %s, quarantined for review",
            attempt.attempt_id,
            during,
            exc_info=exc,
        )
        try:
            with transaction.atomic():
                # The failed step's writes were rolled back; its in-memory changes were not.
                current = Attempt.objects.get(pk=attempt.pk)
                if current.lease_owner != self.worker_id or current.state not in QUARANTINABLE:
                    summary.lost += 1
                    return
                summary.outcomes["quarantined"] += 1
                self._to_review(
                    current,
                    "worker_error",
                    f"recovery failed on this attempt ({during}): {_error_text(exc)}",
                    summary,
                    {"error": {"type": type(exc).__name__, "message": str(exc)[:300]}},
                )
        except Exception as exc:
            if locking.is_database_away(exc):
                raise
            summary.outcomes["errors"] += 1
            log.exception("attempt %s could not be quarantined", attempt.attempt_id)

    def _prepare_one(self, attempt: Attempt, registry: Registry, summary: Summary) -> _Job | None:
        adapter, problems = registry.usable(attempt.tool_name)
        if adapter is None or problems:
            return self._blocked(attempt, "; ".join(problems), summary)
        if attempt.state in (State.INTENT_RECORDED, State.FAILED_RETRYABLE):
            if not self._approvals_hold(attempt, summary):
                return None
            return self._prepare_send(attempt, adapter, summary)
        if attempt.state == State.DISPATCHED:
            self._move(
                attempt,
                State.UNKNOWN,
                reason="stale claim found by recovery: the send may have happened",
                keep_lease=True,
            )
        if attempt.state != State.UNKNOWN:
            return None
        if mutation("blind_retry"):  # crashtest's self-test: resend without a lookup, on purpose
            return self._prepare_send(attempt, adapter, summary)
        if not adapter.can_look_up:
            self._to_review(
                attempt, "manual_class", "manual class: no lookup, a person must decide", summary
            )
            return None
        return _Job("lookup", attempt, adapter, base.Call.of(attempt))

    def _approvals_hold(self, attempt: Attempt, summary: Summary) -> bool:
        """An approved intent an approval policy held is sent by recovery only while enough
        of its approvals are valid (the claim checks again, in the same transaction); when
        they are not, they are void and it waits again (protocol section 11)."""
        if attempt.approval_policy_id is None or attempt.state != State.INTENT_RECORDED:
            return True
        try:
            states.check_approvals(attempt, timezone.now())
        except states.ApprovalsNotValid as exc:
            ledger.void_approvals(
                attempt,
                exc.verdict,
                actor=self.actor,
                fields={"lease_owner": "", "lease_until": None},
            )
            summary.outcomes["approval_void"] += 1
            return False
        return True

    def _blocked(self, attempt: Attempt, why: str, summary: Summary, cause: str = "") -> None:
        """The tool cannot be reached as configured: wait, due as it was, until the
        configuration is fixed (the claim holds the tool's work meanwhile and tells each attempt
        once; UNKNOWN past its maximum age goes to a person); nothing is sent and nothing is
        guessed."""
        if attempt.state == State.DISPATCHED:
            self._move(
                attempt, State.UNKNOWN, reason="stale claim found by recovery", keep_lease=True
            )
        if attempt.state == State.UNKNOWN and self._too_old(attempt):
            self._to_review(
                attempt, "max_age", f"maximum age passed; tool unusable: {why}", summary
            )
            return None
        self._move(
            attempt,
            None,
            action=BLOCKED_ACTION,
            reason=f"tool is not usable for recovery: {why}",
            details={
                "recovery_blocked": {
                    "why": why[:300],
                    "cause": (cause or f"tool {attempt.tool_name}: {why}")[:260],
                }
            },
            # A configuration problem waits for a person (reconciliation.W001 reports it); the
            # claim holds the tool's work meanwhile (no history every few seconds) and takes it
            # up, in its turn, at the first pass after the configuration is fixed.
            next_check_at=self._still_due(attempt),
        )
        summary.outcomes["blocked"] += 1
        return None

    def _prepare_send(
        self, attempt: Attempt, adapter: base.Adapter, summary: Summary
    ) -> _Job | None:
        """A stale or approved intent, or a retryable failure: send under today's authority."""
        holds, why = authority.authority_holds(attempt)
        if attempt.state == State.FAILED_RETRYABLE:
            # The provider definitively did not perform it (or the connection never opened):
            # sending again is safe in any class. When it may not be sent, a person decides;
            # it is never dropped silently (protocol section 6).
            refusal = self._send_refusal(attempt, adapter, holds, why)
            if refusal:
                self._to_review(attempt, refusal[0], refusal[1], summary)
                return None
        elif not holds:
            # Nothing was sent under the old authority; today's may send it after approval.
            self._supersede(attempt, why, summary)
            return None
        return self._send_again(
            attempt,
            adapter,
            summary,
            reason="recovery sends with the same key",
            exhausted="sends exhausted before recovery",
        )

    def _send_again(
        self,
        attempt: Attempt,
        adapter: base.Adapter,
        summary: Summary,
        *,
        reason: str,
        exhausted: str,
        details: dict[str, Any] | None = None,
        increments: dict[str, int] | None = None,
    ) -> _Job | None:
        """Send again with the same key (DISPATCHED, one more send), or FAILED when the tool's
        sends are used up."""
        if attempt.send_count >= max_sends_for(adapter):
            self._move(
                attempt, State.FAILED, reason=exhausted, details=details, increments=increments
            )
            summary.outcomes["failed"] += 1
            return None
        self._move(
            attempt,
            State.DISPATCHED,
            reason=reason,
            details=details,
            increments={**(increments or {}), "send_count": 1},
            keep_lease=True,
        )
        summary.sends += 1
        return _Job("send", attempt, adapter, base.Call.of(attempt))

    def _send_refusal(
        self, attempt: Attempt, adapter: base.Adapter, holds: bool, why: str
    ) -> tuple[str, str] | None:
        """Why a FAILED_RETRYABLE attempt must not be sent again automatically, as (review
        reason, explanation); None when it may be."""
        if not holds:
            return "authority_changed", f"not sent; authority changed since: {why}"
        if attempt.send_count >= max_sends_for(adapter):
            return (
                "sends_exhausted",
                f"not sent; sends exhausted ({attempt.send_count} of {max_sends_for(adapter)})",
            )
        if self._too_old(attempt):
            return "max_age", "not sent; the maximum age passed while retrying"
        return None

    # -----------------------------------------------------------------------------------------
    # Step 3: the provider answered

    def _apply(self, finished: list[tuple[_Job, Any]], summary: Summary) -> list[_Job]:
        for job, _ in finished:
            crash_point("reconcile_looked_up" if job.kind == "lookup" else "reconcile_resent")
        group = Summary()
        try:
            jobs = self._apply_group(finished, group, savepoints=False)
        except _NeedsSavepoints:
            # Nothing of the group was written: start again from the rows as they are.
            for job, _ in finished:
                job.attempt.refresh_from_db()
            group = Summary()
            jobs = self._apply_group(finished, group, savepoints=True)
        summary.add(group)
        return jobs

    def _apply_group(
        self, finished: list[tuple[_Job, Any]], summary: Summary, *, savepoints: bool
    ) -> list[_Job]:
        jobs: list[_Job] = []
        with write_transaction():
            for job, result in finished:
                if isinstance(result, _JobError):
                    self._quarantine(job.attempt, result.error, summary, during=job.kind)
                    continue
                if job.kind == "lookup":
                    summary.lookups += 1
                    step = self._after_lookup
                else:
                    if result.confirmation is not None:
                        summary.lookups += 1
                    step = self._after_send
                # Answers settled by one move need no savepoint (see _guarded).
                single_move = job.kind == "lookup" and result.status != base.LookupStatus.NOT_FOUND
                with tracing.span("ledger.settle", job.attempt, after=job.kind) as s:
                    follow_up = self._guarded(
                        summary,
                        step,
                        job.attempt,
                        job,
                        result,
                        summary,
                        savepoint=savepoints or not single_move,
                    )
                    tracing.describe(s, job.attempt)
                if follow_up is not None:
                    jobs.append(follow_up)
        return jobs

    def _after_lookup(
        self, attempt: Attempt, job: _Job, answer: base.LookupAnswer, summary: Summary
    ) -> _Job | None:
        """The decision table for an UNKNOWN attempt, given the provider's answer."""
        details = {"lookup": answer.as_details()}
        adapter = job.adapter
        if answer.invalid:
            self._invalid_answer(attempt, answer.invalid, summary, details)
            return None
        if answer.status == base.LookupStatus.FOUND:
            return self._found(attempt, answer, details, summary, from_send=False)
        if answer.status == base.LookupStatus.NOT_FOUND:
            if adapter.effect_class != EffectClass.IDEMPOTENT:
                self._to_review(
                    attempt,
                    "not_found",
                    f"not found; the {adapter.effect_class} class is never resent automatically",
                    summary,
                    details,
                )
                return None
            if adapter.critical:
                self._to_review(
                    attempt,
                    "not_found_critical",
                    "not found; a critical effect is never retried without a person",
                    summary,
                    details,
                )
                return None
            holds, why = authority.authority_holds(attempt)
            if not holds:
                self._supersede(attempt, why, summary, details)
                return None
            return self._send_again(
                attempt,
                adapter,
                summary,
                reason="not found: idempotent class, authority holds, sending again with the same key",
                exhausted=f"not found and sends exhausted ({attempt.send_count})",
                details=details,
                increments={"lookup_count": 1},
            )
        # Unavailable, timeout or ambiguous: nothing is known; wait and ask again.
        if self._too_old(attempt):
            self._to_review(
                attempt,
                "max_age",
                f"still unknown after the maximum age ({answer.status})",
                summary,
                details,
            )
            return None
        self._move(
            attempt,
            None,
            action="attempt.lookup",
            reason=f"lookup {answer.status}: staying UNKNOWN",
            details=details,
            increments={"lookup_count": 1},
            next_check_at=self._next_check(attempt.lookup_count),
        )
        summary.outcomes["still_unknown"] += 1
        return None

    def _found(
        self,
        attempt: Attempt,
        answer: base.LookupAnswer,
        details: dict[str, Any],
        summary: Summary,
        *,
        from_send: bool,
    ) -> None:
        """The provider holds an effect under this key: confirm it, or hand it to a person."""
        lookup_increment = {"lookup_count": 1}
        # Whatever adapter answered, nothing it says is stored unchecked.
        problem = id_problem("provider_request_id", answer.provider_request_id)
        if not problem and answer.result_ref:
            problem = id_problem("result_ref", answer.result_ref)
        if problem:
            details = {**details, "invalid": problem}
            details["lookup"] = {
                k: v
                for k, v in details.get("lookup", {}).items()
                if k not in ("provider_request_id",)
            }
            details["lookup"]["evidence"] = evidence_of(
                {"id": answer.provider_request_id, "result_ref": answer.result_ref}
            )
            self._invalid_answer(attempt, problem, summary, details, increments=lookup_increment)
            return
        if answer.args_hash != attempt.args_hash:
            self._to_review(
                attempt,
                "payload_mismatch",
                "the provider holds an effect under this key with a different payload hash",
                summary,
                details,
                increments=lookup_increment,
            )
            return
        if answer.count > 1:
            self._to_review(
                attempt,
                "duplicate_effects",
                f"the provider holds {answer.count} effects under this key",
                summary,
                details,
                increments=lookup_increment,
            )
            return
        recorded = attempt.provider_request_id
        if recorded and recorded != answer.provider_request_id:
            self._to_review(
                attempt,
                "provider_request_mismatch",
                f"lookup found {answer.provider_request_id!r}, the ledger recorded {recorded!r}",
                summary,
                details,
                increments=lookup_increment,
            )
            return
        try:
            self._move(
                attempt,
                State.OUTCOME_CONFIRMED,
                reason="sent and confirmed by lookup"
                if from_send
                else "found by lookup, payload matches",
                details=details,
                fields={
                    "provider_request_id": answer.provider_request_id,
                    "result_ref": answer.result_ref or f"lookup:{answer.provider_request_id}",
                    "review_reason": "",
                },
                increments=lookup_increment,
                next_check_at=None,
            )
        except states.EffectClaimed as claim:
            # The answer names an effect another attempt claimed: never a second confirmation.
            self._effect_claimed(claim, summary, details, increments=lookup_increment)
            return
        summary.outcomes["confirmed"] += 1

    def _after_send(
        self, attempt: Attempt, job: _Job, result: _SendResult, summary: Summary
    ) -> None:
        answer = result.send
        details: dict[str, Any] = {"send": _send_details(answer)}
        max_sends = max_sends_for(job.adapter)
        if answer.invalid or (result.confirmation is not None and result.confirmation.invalid):
            if result.confirmation is not None:
                details["lookup"] = result.confirmation.as_details()
            self._invalid_answer(
                attempt,
                answer.invalid or result.confirmation.invalid,  # type: ignore[union-attr]
                summary,
                details,
                increments={"lookup_count": 1} if result.confirmation is not None else None,
            )
            return
        if answer.status == base.SendStatus.REFUSED:
            if answer.retryable and attempt.send_count < max_sends:
                self._move(
                    attempt,
                    State.FAILED_RETRYABLE,
                    reason=f"provider refused, may be asked again: {answer.detail}",
                    details=details,
                    next_check_at=self._next_check(attempt.send_count),
                )
                summary.outcomes["failed_retryable"] += 1
            elif answer.retryable:
                # Nothing happened, but recovery may not ask again: a person decides.
                self._to_review(
                    attempt,
                    "sends_exhausted",
                    f"not sent; sends exhausted ({attempt.send_count} of {max_sends}): "
                    f"{answer.detail}",
                    summary,
                    details,
                )
            else:
                self._move(
                    attempt,
                    State.FAILED,
                    reason=f"provider refused for good: {answer.detail}",
                    details=details,
                )
                summary.outcomes["failed"] += 1
            return
        if answer.status == base.SendStatus.ACCEPTED and answer.provider_request_id:
            if not attempt.provider_request_id:
                try:
                    self._move(
                        attempt,
                        None,
                        action="attempt.provider_request_attached",
                        fields={"provider_request_id": answer.provider_request_id},
                        keep_lease=True,
                    )
                except states.EffectClaimed as claim:
                    self._effect_claimed(claim, summary, details)
                    return
        confirmation = result.confirmation
        if confirmation is not None:
            details["lookup"] = confirmation.as_details()
            if confirmation.status == base.LookupStatus.FOUND:
                self._found(attempt, confirmation, details, summary, from_send=True)
                return
        if answer.status == base.SendStatus.ACCEPTED:
            reason = "sent; the provider accepted it but no lookup confirmed it yet"
        else:
            reason = f"send outcome unknown: {answer.detail or answer.status}"
        self._move(
            attempt,
            State.UNKNOWN,
            reason=reason,
            details=details,
            increments={"lookup_count": 1} if confirmation is not None else None,
            next_check_at=self._next_check(attempt.lookup_count),
        )
        summary.outcomes["still_unknown"] += 1

    # -----------------------------------------------------------------------------------------
    # Small helpers: every write is a fenced states.move

    def _move(
        self,
        attempt: Attempt,
        to_state: str | None,
        *,
        reason: str = "",
        action: str | None = None,
        details: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        increments: dict[str, int] | None = None,
        next_check_at: dt.datetime | None | type[Ellipsis] = ...,
        keep_lease: bool = False,
    ) -> Attempt:
        fields = dict(fields or {})
        if not keep_lease:
            fields.update(lease_owner="", lease_until=None)
        return states.move(
            attempt,
            to_state,
            actor=self.actor,
            action=action,
            reason=reason,
            details=details,
            fields=fields,
            increments=increments,
            next_check_at=next_check_at,
        )

    def _to_review(
        self,
        attempt: Attempt,
        review_reason: str,
        reason: str,
        summary: Summary,
        details: dict[str, Any] | None = None,
        *,
        increments: dict[str, int] | None = None,
    ) -> None:
        if details and "lookup" in details and increments is None:
            increments = {"lookup_count": 1}
        self._move(
            attempt,
            State.MANUAL_REVIEW,
            reason=reason,
            details=details,
            fields={"review_reason": review_reason},
            increments=increments,
            next_check_at=None,
        )
        summary.outcomes["manual_review"] += 1

    def _effect_claimed(
        self,
        claim: states.EffectClaimed,
        summary: Summary,
        details: dict[str, Any],
        *,
        increments: dict[str, int] | None = None,
    ) -> None:
        """The provider's answer names an effect another attempt claimed: the ledger's one
        decision for that (``ledger.effect_claimed``), with this worker's lease released."""
        ledger.effect_claimed(
            claim,
            actor=self.actor,
            details=details,
            fields={"lease_owner": "", "lease_until": None},
            increments=increments,
        )
        summary.outcomes["manual_review"] += 1

    def _invalid_answer(
        self,
        attempt: Attempt,
        problem: str,
        summary: Summary,
        details: dict[str, Any],
        *,
        increments: dict[str, int] | None = None,
    ) -> None:
        """The provider's answer failed validation: a person decides, with the raw answer as
        evidence in the event; nothing of it is stored as the attempt's id or reference."""
        self._to_review(
            attempt,
            "invalid_provider_answer",
            f"the provider's answer failed validation: {problem}"[:500],
            summary,
            details,
            increments=increments,
        )

    def _supersede(
        self, attempt: Attempt, why: str, summary: Summary, details: dict[str, Any] | None = None
    ) -> None:
        """Authority changed: never send under the old one. A linked attempt under today's
        authority waits for approval; with no grant left at all, a person decides."""
        if details:
            # Record the lookup that led here before the attempt is superseded.
            self._move(
                attempt,
                None,
                action="attempt.lookup",
                reason="lookup not found",
                details=details,
                increments={"lookup_count": 1},
                keep_lease=True,
            )
        try:
            linked.create_linked_attempt(
                attempt, actor=self.actor, reason=f"authority changed since the intent: {why}"
            )
        except ledger.NotGranted as exc:
            if attempt.state == State.UNKNOWN:
                self._to_review(attempt, "authority_revoked", f"{why}; {exc}", summary)
            else:
                self._move(
                    attempt,
                    State.FAILED,
                    reason=f"nothing was sent and no authority is left: {exc}",
                )
                summary.outcomes["failed"] += 1
            return
        summary.outcomes["linked"] += 1

    def _next_check(self, checks_so_far: int) -> dt.datetime:
        return timezone.now() + dt.timedelta(seconds=backoff_delay(checks_so_far, rng=self.rng))

    def _too_old(self, attempt: Attempt) -> bool:
        age = timezone.now() - attempt.created_at
        return age.total_seconds() > settings.LEDGER["UNKNOWN_MAX_AGE"]


def _send_details(answer: base.SendAnswer) -> dict[str, Any]:
    details: dict[str, Any] = {"answer": str(answer.status), "latency_ms": int(answer.latency_ms)}
    if answer.invalid:
        details["invalid"] = answer.invalid[:300]
        details["evidence"] = answer.evidence
    if answer.retry_after is not None:
        details["retry_after"] = round(answer.retry_after, 3)
    if answer.http_status is not None:
        details["http_status"] = answer.http_status
    if answer.provider_request_id:
        details["provider_request_id"] = answer.provider_request_id
    if answer.status == base.SendStatus.REFUSED:
        details["retryable"] = answer.retryable
    if answer.detail:
        details["detail"] = answer.detail[:300]
    return details
