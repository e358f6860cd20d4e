"""Operations endpoints: ``/healthz`` for load balancers and ``/metrics`` for Prometheus.

Both are exempt from the session login. ``/healthz`` says whether the database answers and
the newest reconcile worker heartbeat is fresh (its status), and on PostgreSQL whether a failover
could lose an acknowledged write (said, not a status). ``/metrics`` is the Prometheus text format,
written by hand, from grouped counts and MIN() lookups that the attempt indexes answer; it is
readable from loopback or with ``LEDGERWEB_METRICS_TOKEN`` (see docs/operations.md).
"""

from __future__ import annotations

import datetime as dt
import hmac
import time
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError, connection
from django.db.models import Count, Max, Min, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts import chain, replication
from attempts import log as tlog
from attempts.models import TERMINAL_STATES, ActorKind, Attempt, AttemptEvent, State
from reconciliation.models import WorkerHeartbeat

LOOPBACK = {"127.0.0.1", "::1"}
# An IN list (not NOT IN) so the database searches the state index instead of scanning.
LOOKUP_WINDOW_SECONDS = 3600
LOOKUP_WINDOW_EVENTS = 20_000
OPEN_STATES = [state for state in State.values if state not in TERMINAL_STATES]


@login_not_required
@require_GET
def livez(request: HttpRequest) -> JsonResponse:
    """Liveness: 200 while this process answers requests. Reads nothing, so a restart is never
    caused by the database or by the reconcile worker."""
    return JsonResponse({"status": "ok"}, headers=_no_store())


@login_not_required
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness, for a load balancer: 200 when this process can serve, i.e. the database
    answers. A stale reconcile worker does not take the web tier out of service (it is an
    alert: /healthz and /metrics say so); 503 without the database."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        return JsonResponse(
            {"status": "unready", "database": "unreachable"}, status=503, headers=_no_store()
        )
    return JsonResponse({"status": "ok", "database": "ok"}, headers=_no_store())


@login_not_required
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database answers and a reconcile worker beat recently; 503 otherwise."""
    ops = settings.OPS
    body: dict[str, object] = {"status": "ok"}
    healthy = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        body["database"] = "ok"
    except DatabaseError:
        return JsonResponse(
            {"status": "unhealthy", "database": "unreachable"}, status=503, headers=_no_store()
        )
    latest = (
        WorkerHeartbeat.objects.order_by("-last_seen")
        .values("last_seen", "started_at", "restarts", "last_exit")
        .first()
    )
    if latest is None:
        body["worker"] = "missing"
        healthy = not ops["HEALTHZ_REQUIRE_WORKER"]
    else:
        newest = latest["last_seen"]
        # A supervisor (scripts/run) restarted a worker that died: say so, and how it ended.
        body["worker_restarts"] = latest["restarts"]
        if latest["restarts"]:
            body["worker_restarted_at"] = latest["started_at"].isoformat()
            body["worker_last_exit"] = latest["last_exit"]
        age = max(0.0, (timezone.now() - newest).total_seconds())
        body["worker_heartbeat_age_seconds"] = round(age, 3)
        fresh = age <= ops["HEARTBEAT_MAX_AGE"]
        body["worker"] = "ok" if fresh else "stale"
        healthy = fresh or not ops["HEALTHZ_REQUIRE_WORKER"]
    _failover_health(body)
    degraded = degraded_providers()
    if degraded:
        # A provider in trouble is not the ledger's: the status stays, the providers are named.
        body["providers_degraded"] = {key: info["state"] for key, info in degraded.items()}
    slow = providers_past_deadline()
    if slow:
        # Every bulkhead whose calls were cut at their deadline lately, with when and the tools.
        body["providers_past_deadline"] = slow
    _log_health(body)
    if not healthy:
        body["status"] = "unhealthy"
    return JsonResponse(body, status=200 if healthy else 503, headers=_no_store())


def _provider_reports() -> list[tuple[str, dict]]:
    """What the reconcile workers with a fresh heartbeat say of their bulkheads (key, info)."""
    since = timezone.now() - dt.timedelta(seconds=settings.OPS["HEARTBEAT_MAX_AGE"])
    return [
        (key, info)
        for providers in WorkerHeartbeat.objects.filter(last_seen__gte=since).values_list(
            "providers", flat=True
        )[:100]
        for key, info in (providers or {}).items()
        if isinstance(info, dict)
    ]


def providers_past_deadline() -> dict[str, dict]:
    """Bulkheads (provider endpoint and operation) whose calls a worker cut at their deadline
    lately: when it last did, how many, and the tools they serve."""
    found: dict[str, dict] = {}
    for key, info in _provider_reports():
        when = info.get("past_deadline")
        if not when or info.get("shared_from"):
            continue
        seen = found.get(key)
        if seen is None or str(when) > seen["last"]:
            found[key] = {
                "last": str(when),
                "cut_calls": int(info.get("cut_calls") or 0),
                "tools": list(info.get("tools") or [])[:20],
            }
    return found


def degraded_providers() -> dict[str, dict]:
    """Bulkheads that the reconcile workers with a fresh heartbeat find degraded (breaker open
    or half-open, holding for Retry-After), by key; the worst state when they differ."""
    rank = {"open": 3, "half_open": 2, "retry_after": 1, "closed": 0}
    found: dict[str, dict] = {}
    for key, info in _provider_reports():
        state = info.get("state", "closed")
        if state == "closed" and info.get("retry_after"):
            state = "retry_after"
        if state == "closed":
            continue
        if rank.get(state, 0) > rank.get(found.get(key, {}).get("state", ""), -1):
            found[key] = {**info, "state": state}
    return found


def _failover_health(body: dict[str, object]) -> None:
    """PostgreSQL: whether a write acknowledged now can be lost if the database fails over
    (attempts/replication.py). Said, never a reason for 503: the ledger still works."""
    try:
        found = replication.durability()
    except DatabaseError as exc:
        body["replication"] = {"failover_loss": f"unknown: {exc}"}
        return
    if found is not None:
        body["replication"] = found.as_dict()


def _log_health(body: dict[str, object]) -> None:
    """The transparency log's witnesses: "degraded" (still 200) when a configured witness is
    behind, refused or unreachable, or the newest signed checkpoint lacks the quorum. A witness
    never makes the ledger unhealthy: writes do not wait for it."""
    if not settings.TLOG["WITNESSES"]:
        return
    try:
        current = tlog.status()
    except (DatabaseError, tlog.LogKeyError) as exc:
        body["log"] = f"unknown: {exc}"
        return
    if not current["witnesses"] and not current["problem"]:
        return
    late = [row["name"] for row in current["witnesses"] if row["status"] != "ok" or row["behind"]]
    body["log_witnessed"] = current["witnessed"]
    if late or current["witnessed"] is False or current["problem"]:
        body["log"] = "degraded"
        body["log_witnesses_behind"] = late
        if current["problem"]:
            body["log_problem"] = current["problem"]
        if body["status"] == "ok":
            body["status"] = "degraded"
    else:
        body["log"] = "ok"


def _no_store() -> dict[str, str]:
    return {"Cache-Control": "no-store"}


def _metrics_allowed(request: HttpRequest) -> bool:
    ops = settings.OPS
    if ops["METRICS_ALLOW_LOOPBACK"] and request.META.get("REMOTE_ADDR") in LOOPBACK:
        return True
    expected = ops["METRICS_TOKEN"]
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, given = header.partition(" ")
    return bool(
        expected
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), expected.encode())
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{name}="{_escape(str(value))}"' for name, value in labels.items())
    return "{" + inner + "}"


class _Exposition:
    """Collects metric families and renders the Prometheus text format (version 0.0.4)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict, float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(**labels)} {_number(value)}")

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@login_not_required
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition: each family documented in docs/operations.md."""
    if not _metrics_allowed(request):
        return HttpResponse(
            "metrics need a loopback client or the metrics bearer token\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    started = time.monotonic()
    now = timezone.now()
    out = _Exposition()
    _attempt_families(out, now)
    _worker_families(out, now)
    _audit_families(out, now)
    out.family(
        "ledger_metrics_scrape_seconds",
        "gauge",
        "Time this scrape took to compute.",
        [({}, round(time.monotonic() - started, 6))],
    )
    return HttpResponse(
        out.render(),
        content_type="text/plain; version=0.0.4; charset=utf-8",
        headers=_no_store(),
    )


def _attempt_families(out: _Exposition, now: dt.datetime) -> None:
    """The attempts: by state, the open work, the oldest UNKNOWN, what is due, why in review."""
    # All attempts by state and tenant: an index-only scan of (tenant, state, ...).
    by_state = Attempt.objects.values_list("tenant_id", "state").annotate(n=Count("id")).order_by()
    out.family(
        "ledger_attempts",
        "gauge",
        "Attempts by state and tenant.",
        (({"state": s, "tenant": t}, n) for t, s, n in by_state),
    )
    # Work not yet settled, also by tool: a range of the (state, created_at) index, and these
    # rows are few next to the settled ones, so the scrape stays cheap as the ledger grows.
    open_work = (
        Attempt.objects.filter(state__in=OPEN_STATES)
        .values_list("state", "tenant_id", "tool_name")
        .annotate(n=Count("id"))
        .order_by()
    )
    out.family(
        "ledger_open_attempts",
        "gauge",
        "Attempts not yet settled (neither OUTCOME_CONFIRMED, FAILED nor RECONCILED), by state, "
        "tenant and tool.",
        (({"state": s, "tenant": t, "tool": tool}, n) for s, t, tool, n in open_work),
    )

    oldest_unknown = Attempt.objects.filter(state=State.UNKNOWN).aggregate(m=Min("created_at"))["m"]
    out.family(
        "ledger_unknown_oldest_age_seconds",
        "gauge",
        "Age of the oldest attempt in UNKNOWN, from its creation (0 when none).",
        [({}, max(0.0, (now - oldest_unknown).total_seconds()) if oldest_unknown else 0)],
    )

    due = Attempt.objects.filter(next_check_at__isnull=False, next_check_at__lte=now)
    oldest_due = due.aggregate(m=Min("next_check_at"))["m"]
    out.family(
        "ledger_reconcile_lag_seconds",
        "gauge",
        "How long the most overdue attempt has waited past its next check (0 when none is due).",
        [({}, max(0.0, (now - oldest_due).total_seconds()) if oldest_due else 0)],
    )
    out.family(
        "ledger_reconcile_due_attempts",
        "gauge",
        "Attempts whose next reconcile check is due now.",
        [({}, due.count())],
    )

    reasons = (
        Attempt.objects.filter(state=State.MANUAL_REVIEW)
        .values_list("review_reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    out.family(
        "ledger_manual_review_attempts",
        "gauge",
        "Attempts waiting for a person, by why (payload_mismatch, not_found, max_age, ...).",
        (({"reason": reason or "unspecified"}, n) for reason, n in reasons),
    )


def _worker_families(out: _Exposition, now: dt.datetime) -> None:
    """The reconcile workers: recent lookup answers, heartbeats, totals, degraded providers."""
    # Lookup answers (found, not_found, unavailable, ambiguous) the workers recorded lately: the
    # newest events only, by primary key, so the scan is bounded whatever the history's size.
    newest_event = AttemptEvent.objects.aggregate(m=Max("id"))["m"] or 0
    answers = (
        AttemptEvent.objects.filter(
            id__gt=newest_event - LOOKUP_WINDOW_EVENTS,
            actor_kind=ActorKind.WORKER,
            created_at__gte=now - dt.timedelta(seconds=LOOKUP_WINDOW_SECONDS),
            details__has_key="lookup",
        )
        .values_list("details__lookup__answer")
        .annotate(n=Count("id"))
        .order_by()
    )
    out.family(
        "ledger_reconcile_lookup_answers_recent",
        "gauge",
        f"Provider lookup answers recorded by reconcile workers in the last "
        f"{LOOKUP_WINDOW_SECONDS // 60} minutes (among the newest {LOOKUP_WINDOW_EVENTS} events).",
        (({"answer": str(answer or "unrecorded")}, n) for answer, n in answers),
    )

    workers = list(WorkerHeartbeat.objects.values_list("worker_id", "last_seen"))
    out.family(
        "ledger_worker_heartbeat_age_seconds",
        "gauge",
        "Seconds since each reconcile worker last reported.",
        (({"worker": w}, max(0.0, (now - seen).total_seconds())) for w, seen in workers),
    )
    max_age = settings.OPS["HEARTBEAT_MAX_AGE"]
    alive = sum(1 for _, seen in workers if (now - seen).total_seconds() <= max_age)
    out.family(
        "ledger_workers_alive",
        "gauge",
        f"Reconcile workers whose heartbeat is at most {max_age}s old.",
        [({}, alive)],
    )
    totals = WorkerHeartbeat.objects.aggregate(
        lookups=Sum("lookups_total"), settled=Sum("settled_total")
    )
    out.family(
        "ledger_reconcile_lookups_total",
        "counter",
        "Provider lookups made by the reconcile workers that are registered now.",
        [({}, totals["lookups"] or 0)],
    )
    out.family(
        "ledger_reconcile_settled_total",
        "counter",
        "Attempts settled by the reconcile workers that are registered now.",
        [({}, totals["settled"] or 0)],
    )
    degraded = degraded_providers()
    out.family(
        "ledger_provider_degraded",
        "gauge",
        "Providers a reconcile worker finds degraded, by provider and state (open: the "
        "breaker stopped calling it; half_open: probing it; retry_after: it asked to wait).",
        (({"provider": key, "state": info["state"]}, 1) for key, info in sorted(degraded.items())),
    )
    out.family(
        "ledger_provider_failures",
        "gauge",
        "Failures in a row of each degraded provider, as its worker counted them.",
        (({"provider": key}, int(info.get("failures") or 0)) for key, info in degraded.items()),
    )


def _audit_families(out: _Exposition, now: dt.datetime) -> None:
    """The audit chain's unsealed work and newest checkpoint, and the transparency log's state."""
    window = chain.unsealed_window(now)
    out.family(
        "ledger_audit_unsealed_attempts",
        "gauge",
        "Attempts with history that no checkpoint seals yet (the sealer runs in the worker).",
        [({}, window["attempts"])],
    )
    out.family(
        "ledger_audit_unsealed_oldest_age_seconds",
        "gauge",
        "Age of the oldest change that no checkpoint seals yet (0 when none).",
        [({}, round(window["oldest_seconds"], 3))],
    )
    out.family(
        "ledger_audit_checkpoint_seq",
        "gauge",
        "Sequence number of the newest audit checkpoint (0 when none).",
        [({}, window["checkpoint"]["seq"] if window["checkpoint"] else 0)],
    )
    try:
        log_state = tlog.status()
    except tlog.LogKeyError:
        log_state = None
    if log_state is not None:
        out.family(
            "ledger_log_size",
            "gauge",
            "Leaves in the transparency log, and in its newest signed checkpoint.",
            [
                ({"checkpoint": "sealed"}, log_state["size"]),
                ({"checkpoint": "signed"}, log_state["signed_size"]),
            ],
        )
        out.family(
            "ledger_log_unsigned_checkpoints",
            "gauge",
            "Checkpoints after the newest signed one (no key, or the signer failing).",
            [({}, log_state["unsigned"])],
        )
        out.family(
            "ledger_log_witness_behind",
            "gauge",
            "Leaves of the newest signed checkpoint a witness has not cosigned, by witness.",
            (({"witness": row["name"]}, row["behind"]) for row in log_state["witnesses"]),
        )
        out.family(
            "ledger_log_witness_ok",
            "gauge",
            "1 when a witness's newest submission was cosigned, 0 when it refused or was "
            "unreachable, by witness and status.",
            (
                ({"witness": row["name"], "status": row["status"]}, int(row["status"] == "ok"))
                for row in log_state["witnesses"]
            ),
        )
        out.family(
            "ledger_log_witnessed",
            "gauge",
            "1 when the newest signed checkpoint has the quorum of cosignatures (absent with "
            "no witness configured).",
            [({}, int(bool(log_state["witnessed"])))] if log_state["quorum"] else [],
        )
