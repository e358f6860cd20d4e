"""The attempt detail screen: everything an operator needs to prove what happened.

State, age and owner; every identifier (copyable); the normalized arguments with secret fields
redacted; the lineage; the full history with actors and reasons; the reconciliation lookups;
notes; and the actions the user's role allows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts import authority, ledger, linked, owners, tracing, waiting
from attempts.canonical import canonical_bytes
from attempts.models import (
    OWNED_STATES,
    ApprovalPolicy,
    Attempt,
    ConfigEvent,
    Role,
    SlaEscalation,
    SlaPolicy,
    State,
    Tool,
)
from attempts.review import may_decide_held
from attempts.views._common import get_attempt_for_user, has_role, redact
from attempts.views.erasure import erasure_context

MAX_EVENTS = 500
MAX_LINEAGE = 25
MAX_LOOKUPS = 100
# How often the open page refreshes its live part.
DETAIL_POLL_SECONDS = 10


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def lineage(attempt: Attempt, user: Any) -> tuple[list[Attempt], list[Attempt]]:
    """(ancestors oldest first, linked attempts that continue this one). Same tenant always, but
    scoped to what the user may see anyway."""
    ancestors: list[Attempt] = []
    current = attempt
    scoped = Attempt.objects.visible_to(user)
    while current.parent_id and len(ancestors) < MAX_LINEAGE:
        parent = scoped.filter(pk=current.parent_id).first()
        if parent is None:
            break
        ancestors.append(parent)
        current = parent
    ancestors.reverse()
    # Two steps, each certain to use an index: the ids from the parent index alone (covering),
    # then the rows by primary key. One combined query can be planned as a table scan when the
    # column is mostly NULL and ANALYZE has run. Linked attempts never change tenant; the scope
    # is applied anyway.
    child_ids = list(Attempt.objects.filter(parent_id=attempt.pk).values_list("id", flat=True))
    children = list(
        scoped.filter(pk__in=child_ids).order_by("created_at", "id") if child_ids else []
    )
    return ancestors, children


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [2]}`` as ``{"a.b": 1, "c[0]": 2}`` (leaves only)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value, key=str):
            out.update(_flatten(value[key], f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{path}[{i}]"))
        return out
    return {path or "(whole)": value}


def linked_diff(before: Attempt | dict[str, Any], after: Attempt | dict[str, Any]) -> list[dict]:
    """What differs between two linked attempts (or an attempt and the preview of its linked
    retry): key, policy, scopes, args hash and each argument leaf, secrets redacted."""

    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)

    rows = []
    for name, label in (
        ("idempotency_key", "Idempotency key"),
        ("policy_version", "Policy version"),
        ("credential_scope", "Credential scopes"),
        ("args_hash", "Args hash"),
    ):
        old, new = get(before, name), get(after, name)
        if old != new:
            rows.append({"field": label, "before": _shown(old), "after": _shown(new)})
    old_args, _ = redact(get(before, "args"))
    new_args, _ = redact(get(after, "args"))
    flat_old, flat_new = _flatten(old_args), _flatten(new_args)
    for path in sorted(set(flat_old) | set(flat_new)):
        if flat_old.get(path, _MISSING) != flat_new.get(path, _MISSING):
            rows.append(
                {
                    "field": f"args.{path}",
                    "before": _shown(flat_old.get(path, _MISSING)),
                    "after": _shown(flat_new.get(path, _MISSING)),
                }
            )
    return rows


_MISSING = object()


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(none)"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def args_diff_for(user: Any, attempt: Attempt) -> dict[str, Any] | None:
    """The diff the detail and approve pages show: against the parent when this attempt is a
    linked one, else against what a linked retry would send (when one may be approved)."""
    if attempt.parent_id:
        parent = Attempt.objects.visible_to(user).filter(pk=attempt.parent_id).first()
        if parent is not None:
            return {
                "against": parent.attempt_id,
                "before_label": f"parent {parent.attempt_id}",
                "after_label": "this attempt",
                "rows": linked_diff(parent, attempt),
            }
    if approval_kind(attempt) == "linked_retry":
        try:
            preview = linked.linked_preview(attempt)
        except ledger.LedgerError:
            return None
        return {
            "against": "",
            "before_label": "this attempt",
            "after_label": "the linked retry",
            "rows": linked_diff(attempt, preview),
        }
    return None


def approval_kind(attempt: Attempt) -> str:
    """'linked_attempt' (a prepared linked attempt awaits approval), 'linked_retry' (a reviewer
    may approve a linked retry of this attempt), or '' (nothing to approve)."""
    if attempt.state != State.MANUAL_REVIEW:
        return ""
    return "linked_attempt" if attempt.awaiting_approval else "linked_retry"


def approval_preview(attempt: Attempt) -> dict[str, Any]:
    """Exactly what approving would record and send, and a fingerprint of it, so the approval
    is refused if any of it changed between the preview and the click."""
    kind = approval_kind(attempt)
    if kind == "linked_retry":
        preview = linked.linked_preview(attempt)
        holds, why = True, ""
    else:
        holds, why = authority.authority_holds(attempt)
        preview = linked.recorded_preview(attempt)
    fingerprint = hashlib.sha256(canonical_bytes(preview)).hexdigest()
    shown_args, redacted = redact(preview["args"])
    return {
        "kind": kind,
        "data": preview,
        "args_pretty": pretty_json(shown_args),
        "redacted": redacted,
        "fingerprint": fingerprint,
        "authority_holds": holds,
        "authority_problem": why,
    }


def name_owners(events: list[Any]) -> None:
    """Show people by name in event details (``owner_id=6`` becomes ``owner=triage``)."""
    ids = {
        value
        for e in events
        for key, value in (e.details or {}).items()
        if key.endswith("owner_id") and isinstance(value, int)
    }
    names = (
        dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
        if ids
        else {}
    )
    for e in events:
        shown = {}
        for key, value in (e.details or {}).items():
            if key.endswith("owner_id") and (value is None or value in names):
                shown[key[: -len("_id")]] = names.get(value, "nobody")
            else:
                shown[key] = value
        e.shown_details = shown


LOOKUP_Q = Q(action="attempt.lookup") | Q(details__has_key="lookup")


def sla_for(attempt: Attempt, now: dt.datetime) -> dict[str, Any]:
    """The attempt's SLA level, thresholds and acknowledgement (empty when none applies)."""
    if attempt.state not in (State.UNKNOWN, State.MANUAL_REVIEW):
        return {}
    policy = SlaPolicy.pick(SlaPolicy.table(), attempt.tool_name, attempt.tenant_id)
    if policy is None:
        return {}
    warn, breach = policy.thresholds(attempt.state)
    escalation = (
        SlaEscalation.objects.filter(attempt=attempt, state=attempt.state)
        .select_related("acknowledged_by", "escalated_to")
        .first()
    )
    return {
        "level": SlaPolicy.level(policy, attempt.state, attempt.attention_age(now)),
        "warn": warn,
        "breach": breach,
        "escalation": escalation,
    }


def _waiting(attempt: Attempt, now: dt.datetime) -> tuple[Any, str]:
    """(the attempt's latest event when it says recovery holds it, what happens next and why
    in words) for a live attempt."""
    if attempt.is_terminal:
        return None, ""
    latest = attempt.events.order_by("-id").only("id", "reason", "details").first()
    details = latest.details if latest is not None else None
    why = waiting.why_waiting(
        state=attempt.state,
        updated_at=attempt.updated_at,
        next_check_at=attempt.next_check_at,
        approval_policy=attempt.approval_policy_id is not None,
        latest_details=details,
        now=now,
    )
    return (latest if waiting.held(details) else None), why


def live_context(request: HttpRequest, attempt: Attempt) -> dict[str, Any]:
    """What the self-refreshing part of the page shows: state, owner, identifiers, arguments,
    lineage, lookups and history (never the forms, so nothing typed is lost)."""
    user = request.user
    now = timezone.now()
    history = attempt.events.exclude(action="attempt.lookup")
    events = list(history.order_by("-id")[:MAX_EVENTS])
    events.reverse()
    name_owners(events)
    total_events = history.count() if len(events) == MAX_EVENTS else len(events)
    lookups = list(attempt.events.filter(LOOKUP_Q).order_by("-id")[:MAX_LOOKUPS])
    lookups.reverse()
    name_owners(lookups)
    for e in lookups:
        inner = (e.details or {}).get("lookup")
        e.answer = (inner or {}).get("status") if isinstance(inner, dict) else None
        e.answer = e.answer or (e.details or {}).get("answer") or e.reason or "—"
    total_lookups = (
        attempt.events.filter(LOOKUP_Q).count() if len(lookups) == MAX_LOOKUPS else (len(lookups))
    )
    shown_args, redacted = redact(attempt.args)
    ancestors, children = lineage(attempt, user)
    since = request.GET.get("since", "")
    changed: list[str] = []
    if since.isdigit():
        from attempts.review import describe_change

        changed = [describe_change(e) for e in attempt.decisive_changes_since(int(since))]
    held, why_waiting = _waiting(attempt, now)
    return {
        "attempt": attempt,
        "age": attempt.attention_age(now),
        "sla": sla_for(attempt, now),
        "tool": Tool.objects.filter(name=attempt.tool_name).first(),
        "args_pretty": pretty_json(shown_args),
        "redacted": redacted,
        "scope_text": ", ".join(attempt.credential_scope) or "(none)",
        "trace_url": tracing.trace_url(attempt.trace_id),
        "ancestors": ancestors,
        "children": children,
        "events": events,
        "total_events": total_events,
        "lookups": lookups,
        "total_lookups": total_lookups,
        "now": now,
        "changed_since_open": changed,
        "poll_seconds": DETAIL_POLL_SECONDS,
        "live_url": f"{request.path}?since={since}" if since.isdigit() else "",
        # Recovery could not ask the provider (breaker open, Retry-After): say so on the page
        # while that is the attempt's latest news.
        "provider_deferred": held,
        "why_waiting": why_waiting,
    }


def detail_context(request: HttpRequest, attempt: Attempt) -> dict[str, Any]:
    user = request.user
    context = live_context(request, attempt)
    can_operate = has_role(user, attempt.tenant_id, Role.OPERATOR)
    can_review = has_role(user, attempt.tenant_id, Role.REVIEWER)
    approvals = attempt.approvers_since_last_move()
    attention = attempt.state in (State.UNKNOWN, State.MANUAL_REVIEW)
    last_event_id = attempt.last_event_id()
    context.update(
        {
            "last_event_id": last_event_id,
            "live_url": f"{request.path}?since={last_event_id}",
            "notes": list(attempt.events.filter(action="attempt.note").order_by("id")),
            "can_operate": can_operate,
            "can_review": can_review,
            "can_take": can_operate and attempt.owner_id != user.pk and not attempt.is_terminal,
            "can_unassign": can_operate
            and attempt.owner_id is not None
            and attempt.state not in OWNED_STATES
            and not attempt.is_terminal,
            "can_assign": can_operate and not attempt.is_terminal,
            "can_ack": can_operate
            and bool(context["sla"].get("level"))
            and not (
                context["sla"].get("escalation") and context["sla"]["escalation"].acknowledged_by_id
            ),
            "can_confirm": can_review and attention and not attempt.awaiting_approval,
            "can_fail": can_review and attention and not attempt.awaiting_approval,
            "can_reject": can_review
            and attempt.awaiting_approval
            and attempt.state == State.MANUAL_REVIEW,
            "approval_kind": approval_kind(attempt) if can_review else "",
            "approvals": approvals,
            "approvals_needed": attempt.approvals_needed(),
            "already_approved": user.get_username() in approvals,
            "assignees": owners.owner_names([attempt.tenant_id]),
            "diff": args_diff_for(user, attempt),
            "typed": {},
            # Who changed what decides this attempt's authority or review (tool, grant, rules).
            "config_changes": list(
                ConfigEvent.objects.affecting(attempt).order_by("-created_at", "-id")[:CONFIG_SHOWN]
            ),
        }
    )
    context["held_decision"] = _may_decide_held(user, attempt)
    context["next_attempt"] = Attempt.objects.next_for(user, after=attempt)
    # A card with nothing to do in it is not shown (a terminal attempt, a viewer).
    context["has_actions"] = any(
        context[name]
        for name in (
            "can_take",
            "can_unassign",
            "can_assign",
            "can_ack",
            "can_confirm",
            "can_fail",
            "can_reject",
            "approval_kind",
            "held_decision",
        )
    )

    return context


CONFIG_SHOWN = 20


def _may_decide_held(user: Any, attempt: Attempt) -> bool:
    """Whether this person may decide on (or correct) a call an approval policy holds."""
    if attempt.state != State.AWAITING_APPROVAL or attempt.approval_policy_id is None:
        return False
    policy = ApprovalPolicy.objects.get(pk=attempt.approval_policy_id)
    return may_decide_held(user, attempt, policy)[0]


@require_GET
def attempt_detail(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """The attempt page; the htmx poll gets only its live part (the forms stay as typed)."""
    attempt = get_attempt_for_user(request.user, attempt_id)
    if request.htmx and request.GET.get("since") is not None:
        context = live_context(request, attempt)
        context["oob"] = True
        return render(request, "attempts/detail.html#live", context)
    context = detail_context(request, attempt)
    context.update(erasure_context(request.user, attempt))
    return render(request, "attempts/detail.html", context)
