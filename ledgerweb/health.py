"""The overview's health band: whether work is moving, for every role (issue 40).

Worker heartbeat age and reconcile lag, the providers that hold work (with the tools they
hold), approved-but-not-sent and stale counts, each a link to the queue that shows them. Every
query is bounded (a MIN read from an index, counts that stop at ``CAP``, the heartbeat rows):
never a full count of the ledger on a page load.

It lives here, beside ``/healthz``, because it reads the reconcile workers' heartbeats and
``attempts`` never imports ``reconciliation``: the overview template asks for ``health_band``,
which this module's context processor provides, computed only when a template uses it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from attempts.models import Attempt, State
from ledgerweb.ops import degraded_providers, providers_past_deadline
from reconciliation.models import WorkerHeartbeat
from reconciliation.reconciler import OPERATION_STATES

CAP = 100
# Reconcile lag above this many seconds is shown as a problem.
LAG_WARN = 60.0


def band(user: Any, now: dt.datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    visible = Attempt.objects.visible_to(user)
    max_age = settings.OPS["HEARTBEAT_MAX_AGE"]
    newest = WorkerHeartbeat.objects.order_by("-last_seen").values_list("last_seen", flat=True)
    last_seen = newest.first()
    beat_age = (now - last_seen).total_seconds() if last_seen else None
    workers = WorkerHeartbeat.objects.filter(
        last_seen__gte=now - dt.timedelta(seconds=max_age)
    ).count()
    degraded = degraded_providers()
    # Work a provider holds is due but waits on purpose (the band names the provider): the lag
    # is how long work that may be done now has waited.
    held_work = Q()
    for info in degraded.values():
        states = OPERATION_STATES.get(info.get("operation", ""))
        if states and info.get("tools"):
            held_work |= Q(tool_name__in=list(info["tools"]), state__in=states)
    due = visible.due(now)
    if held_work:
        due = due.exclude(held_work)
    oldest_due = due.order_by("next_check_at").values_list("next_check_at", flat=True).first()
    lag = max(0.0, (now - oldest_due).total_seconds()) if oldest_due else 0.0
    approved, approved_more = (
        visible.filter(state=State.INTENT_RECORDED, approval_policy__isnull=False)
        .filter(updated_at__lte=now - dt.timedelta(seconds=settings.LEDGER["APPROVAL_GRACE"]))
        .count_upto(CAP)
    )
    stale, stale_more = visible.stale_in_flight(now).count_upto(CAP)
    queue = reverse("queue", args=["all"])
    held = []
    slow = providers_past_deadline()
    for key, info in sorted(degraded.items()):
        tools = list(info.get("tools") or [])
        held.append(
            {
                "key": key,
                "state": info["state"].replace("_", "-"),
                "until": info.get("until"),
                "last_error": info.get("last_error") or "",
                "tools": [{"name": t, "url": f"{queue}?tool={t}"} for t in tools],
                "past_deadline": key in slow,
            }
        )
    for key, info in sorted(slow.items()):
        if not any(row["key"] == key for row in held):
            held.append(
                {
                    "key": key,
                    "state": "calls cut at their deadline",
                    "until": None,
                    "last_error": "",
                    "tools": [{"name": t, "url": f"{queue}?tool={t}"} for t in info["tools"]],
                    "past_deadline": True,
                }
            )
    worker_ok = beat_age is not None and beat_age <= max_age
    return {
        "worker_ok": worker_ok,
        "workers": workers,
        "beat_age": beat_age,
        "lag": lag,
        "lag_ok": lag <= LAG_WARN,
        "providers": held,
        "approved": approved,
        "approved_more": approved_more,
        "approved_url": reverse("queue", args=["inflight"]) + f"?state={State.INTENT_RECORDED}",
        "stale": stale,
        "stale_more": stale_more,
        "stale_url": reverse("queue", args=["stale"]),
        "lag_url": reverse("queue", args=["all"]) + "?sort=oldest",
        "ok": worker_ok and lag <= LAG_WARN and not held and not stale and not approved,
    }


def health_band(request: HttpRequest) -> dict[str, Any]:
    """``health_band``: the band, computed when (and only if) a template reads it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"health_band": lambda: band(user)}
