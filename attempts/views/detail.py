"""The attempt detail screen: everything an operator needs to prove what happened.

State, age and owner; every identifier (copyable); the normalized arguments with secret fields
redacted; the lineage; the full history with actors and reasons; the reconciliation lookups;
notes; and the actions the user's role allows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts import authority, ledger
from attempts.canonical import canonical_bytes
from attempts.models import Attempt, ConfigEvent, Role, State, Tool
from attempts.views._common import get_attempt_for_user, has_role, redact, user_tenants

MAX_EVENTS = 500
MAX_LINEAGE = 25


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def lineage(attempt: Attempt, tenants: list[str]) -> tuple[list[Attempt], list[Attempt]]:
    """(ancestors oldest first, linked attempts that continue this one). Same tenant always, but
    scoped anyway."""
    ancestors: list[Attempt] = []
    current = attempt
    scoped = Attempt.objects.for_tenants(tenants)
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


def approvals_so_far(events: list[Any]) -> list[str]:
    """Reviewers who approved since the attempt last changed state (mirrors the ledger)."""
    names: list[str] = []
    for event in events:
        if event.from_state != event.to_state:
            names = []
        elif event.action == "attempt.approval":
            names.append(event.actor)
    return names


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
    tool = Tool.objects.filter(name=attempt.tool_name).first()
    critical = bool(tool and tool.critical)
    if kind == "linked_retry":
        preview = ledger.linked_preview(attempt)
        holds, why = True, ""
    else:
        holds, why = authority.authority_holds(attempt)
        preview = {
            "tenant": attempt.tenant_id,
            "tool_name": attempt.tool_name,
            "task_id": attempt.task_id,
            "idempotency_key": attempt.idempotency_key,
            "args": attempt.args,
            "args_hash": attempt.args_hash,
            "policy_version": attempt.policy_version,
            "credential_scope": attempt.credential_scope,
            "critical": critical,
            "approvals_needed": 2 if critical else 1,
        }
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


def _name_owners(events: list[Any]) -> None:
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


def detail_context(request: HttpRequest, attempt: Attempt) -> dict[str, Any]:
    user = request.user
    tenants = user_tenants(user)
    events = list(attempt.events.order_by("-id")[:MAX_EVENTS])
    events.reverse()
    _name_owners(events)
    total_events = attempt.events.count() if len(events) == MAX_EVENTS else len(events)
    shown_args, redacted = redact(attempt.args)
    ancestors, children = lineage(attempt, tenants)
    tool = Tool.objects.filter(name=attempt.tool_name).first()
    can_operate = has_role(user, attempt.tenant_id, Role.OPERATOR)
    can_review = has_role(user, attempt.tenant_id, Role.REVIEWER)
    approvals = approvals_so_far(events)
    attention = attempt.state in (State.UNKNOWN, State.MANUAL_REVIEW)
    return {
        "attempt": attempt,
        "age": timezone.now() - attempt.created_at,
        "tool": tool,
        "args_pretty": pretty_json(shown_args),
        "redacted": redacted,
        "scope_text": ", ".join(attempt.credential_scope) or "(none)",
        "ancestors": ancestors,
        "children": children,
        "events": events,
        "total_events": total_events,
        "lookups": [e for e in events if e.action == "attempt.lookup"],
        "notes": [e for e in events if e.action == "attempt.note"],
        # Who changed what decides this attempt's authority or review (tool, grant, rules).
        "config_changes": list(
            ConfigEvent.objects.affecting(attempt).order_by("-created_at", "-id")[:CONFIG_SHOWN]
        ),
        "can_operate": can_operate,
        "can_review": can_review,
        "can_take": can_operate and attempt.owner_id != user.pk and not attempt.is_terminal,
        "can_unassign": can_operate
        and attempt.owner_id is not None
        and attempt.state != State.MANUAL_REVIEW
        and not attempt.is_terminal,
        "can_assign": can_operate and not attempt.is_terminal,
        "can_confirm": can_review and attention and not attempt.awaiting_approval,
        "can_fail": can_review and attention and not attempt.awaiting_approval,
        "can_reject": can_review
        and attempt.awaiting_approval
        and attempt.state == State.MANUAL_REVIEW,
        "approval_kind": approval_kind(attempt) if can_review else "",
        "approvals": approvals,
        "approvals_needed": 2 if tool and tool.critical else 1,
        "already_approved": user.get_username() in approvals,
        "assignees": list(
            get_user_model()
            .objects.filter(ledger_memberships__tenant_id=attempt.tenant_id, is_active=True)
            .order_by("username")
            .values_list("username", flat=True)
        ),
    }


CONFIG_SHOWN = 20


@require_GET
def attempt_detail(request: HttpRequest, attempt_id: str) -> HttpResponse:
    attempt = get_attempt_for_user(request.user, attempt_id)
    return render(request, "attempts/detail.html", detail_context(request, attempt))
