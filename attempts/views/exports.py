"""Audit screens: the export form and its streamed downloads, and the printable report of one
logical effect across its lineage. Reviewers and admins only, always within their tenants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts import audit_export, chain, log, verify_export
from attempts.models import (
    ATTEMPT_ID,
    Attempt,
    AttemptEvent,
    Checkpoint,
    CheckpointLeaf,
    Role,
    State,
    Tool,
)
from attempts.views._common import refuse_politely
from attempts.views.detail import name_owners

DOWNLOADS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "jsonl": ("application/jsonl; charset=utf-8", "jsonl"),
    "manifest": ("application/json", "csv.manifest.json"),
}
# Actions a person takes that decide something about an effect (shown as "who decided what").
DECISIONS = {
    "attempt.review_confirmed": "confirmed the outcome",
    "attempt.review_failed": "declared it failed",
    "attempt.approval": "approved (first of two reviewers)",
    "attempt.linked_retry_approved": "approved a linked retry",
    "attempt.approved": "approved the linked attempt",
    "attempt.owner_changed": "assigned an owner",
    "attempt.unassigned": "unassigned the owner",
    "attempt.note": "added a note",
}


def _allowed_tenants(request: HttpRequest) -> set[str] | None:
    """Tenants the person may export or report on; refuses anyone who reviews nowhere."""
    allowed = audit_export.export_tenants(request.user)
    if allowed is not None and not allowed:
        raise PermissionDenied("audit reports are for reviewers and admins")
    return allowed


def _tenant_choices(allowed: set[str] | None) -> list[str]:
    if allowed is None:
        from attempts.models import Tenant

        return list(Tenant.objects.order_by("slug").values_list("slug", flat=True))
    return sorted(allowed)


def _plan(request: HttpRequest, allowed: set[str] | None) -> audit_export.ExportPlan:
    filters = audit_export.ExportFilters.parse(request.GET)
    if filters.tenant and allowed is not None and filters.tenant not in allowed:
        raise audit_export.ExportError(f"you cannot export tenant {filters.tenant!r}")
    upto_text = request.GET.get("upto", "").strip()
    upto = None
    if upto_text:
        if not upto_text.isdigit():
            raise audit_export.ExportError("upto must be an event id")
        upto = int(upto_text)
    return audit_export.plan_export(user=request.user, filters=filters, upto=upto)


@require_GET
@refuse_politely
def audit_exports(request: HttpRequest) -> HttpResponse:
    """The export form: filters, how many events match, and download links pinned to the head."""
    allowed = _allowed_tenants(request)
    context: dict[str, Any] = {
        "tenants": _tenant_choices(allowed),
        "states": State.choices,
        "values": request.GET,
    }
    status = 200
    try:
        plan = _plan(request, allowed)
    except audit_export.ExportError as exc:
        context["error"] = str(exc)
        status = 400
    else:
        query = plan.filters.as_query()
        query["upto"] = str(plan.upto)
        context.update(
            plan=plan,
            matching=plan.count(),
            qs=urlencode(query),
            tools=list(Tool.objects.order_by("name").values_list("name", flat=True)),
            window=chain.unsealed_window(),
            tlog=_log_status(),
        )
    return render(request, "attempts/exports.html", context, status=status)


def _log_status() -> dict[str, Any] | None:
    """The transparency log as the audit page shows it (signatures, witnesses)."""
    try:
        return log.status()
    except log.LogKeyError as exc:
        return {"problem": str(exc), "witnesses": []}


@require_GET
@refuse_politely
def audit_download(request: HttpRequest, fmt: str) -> HttpResponse:
    """A streamed CSV or JSON Lines export, or the CSV's manifest, for the filters in the URL."""
    if fmt not in DOWNLOADS:
        raise Http404("no such export format")
    allowed = _allowed_tenants(request)
    try:
        plan = _plan(request, allowed)
    except audit_export.ExportError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    content_type, extension = DOWNLOADS[fmt]
    name = audit_export.file_name(plan, extension)
    if fmt == "manifest":
        response: HttpResponse = JsonResponse(
            audit_export.csv_manifest(plan), json_dumps_params={"indent": 2}
        )
    else:
        stream = audit_export.stream_csv(plan) if fmt == "csv" else audit_export.stream_jsonl(plan)
        response = StreamingHttpResponse(stream, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["Cache-Control"] = "no-store"
    return response


def _lineage(root: Attempt, scoped) -> list[Attempt]:
    """The root and every attempt linked below it, oldest first (one logical effect)."""
    found = [root]
    frontier = [root.pk]
    while frontier:
        children = list(scoped.filter(parent_id__in=frontier).order_by("created_at", "id"))
        found.extend(children)
        frontier = [child.pk for child in children]
    return found


def _event_rows(
    events: list[AttemptEvent], attempt_ids: dict[int, str], salts: dict[int, str]
) -> list[dict[str, Any]]:
    """Events (in id order) with their chain check: the hash recomputes, and the event before it
    in the attempt's chain (for history written before per-attempt chains, in the whole ledger)
    has the hash this one names; a format-3 event's free text is what its salted digest
    committed to (``salts``: each attempt's, by pk)."""
    last_of: dict[int, str] = {}
    name_owners(events)  # people by name, as the attempt page shows them
    rows = []
    for event in events:
        row = event.export_row(attempt_ids[event.attempt_id])
        if event.chain_format == verify_export.LEGACY_FORMAT:
            expected_prev = (
                AttemptEvent.objects.filter(id__lt=event.id)
                .order_by("-id")
                .values_list("hash", flat=True)
                .first()
            ) or verify_export.GENESIS
        else:
            expected_prev = last_of.get(event.attempt_id, verify_export.GENESIS)
        last_of[event.attempt_id] = event.hash
        rows.append(
            {
                "event": event,
                "attempt_id": row["attempt_id"],
                "hash_ok": verify_export.event_hash(row) == event.hash
                and not verify_export.text_problem(row, salts.get(event.attempt_id)),
                "link_ok": expected_prev == event.prev_hash,
                "details_json": json.dumps(
                    event.shown_details, indent=1, sort_keys=True, ensure_ascii=False
                )
                if event.details
                else "",
                "request_id": (event.details or {}).get("provider_request_id", ""),
                "decision": DECISIONS.get(event.action, "") if event.actor_kind == "user" else "",
            }
        )
    return rows


def _receipt_of(attempt: Attempt) -> dict[str, Any] | None:
    """The attempt's receipt (signed checkpoint, leaf, inclusion proof), or None while its
    current state is not in a signed checkpoint."""
    try:
        return log.receipt(attempt)
    except (log.NotSealed, LookupError):
        return None


def _seal_of(attempt: Attempt) -> dict[str, Any] | None:
    """The newest checkpoint that sealed ``attempt``: its number and hash, and how many of the
    attempt's events it covers."""
    leaf = (
        CheckpointLeaf.objects.filter(attempt_id=attempt.attempt_id)
        .select_related("checkpoint")
        .order_by("-checkpoint__seq")
        .first()
    )
    if leaf is None:
        return None
    return {"seq": leaf.checkpoint.seq, "hash": leaf.checkpoint.hash, "length": leaf.length}


@require_GET
@refuse_politely
def attempt_report(request: HttpRequest, attempt_id: str) -> HttpResponse:
    """Everything that happened to one logical effect across its lineage, readable on paper."""
    _allowed_tenants(request)  # refuses anyone who reviews nowhere
    scoped = Attempt.objects.visible_to(request.user, Role.REVIEWER)
    attempt = scoped.select_related("parent").filter(attempt_id=attempt_id).first()
    if attempt is None:
        raise Http404("no such attempt")
    root = attempt
    while root.parent_id is not None:
        parent = scoped.filter(pk=root.parent_id).first()
        if parent is None:
            break
        root = parent
    lineage = _lineage(root, scoped.select_related("owner"))
    attempt_ids = {a.pk: a.attempt_id for a in lineage}
    events = list(AttemptEvent.objects.filter(attempt_id__in=list(attempt_ids)).order_by("id"))
    rows = _event_rows(events, attempt_ids, {a.pk: a.args_salt for a in lineage})
    sections = []
    for item in lineage:
        sections.append(
            {
                "attempt": item,
                "args_json": json.dumps(item.args, indent=1, sort_keys=True),
                "rows": [r for r in rows if r["attempt_id"] == item.attempt_id],
                "seal": _seal_of(item),
                "receipt": _receipt_of(item),
            }
        )
    head = Checkpoint.objects.order_by("-seq").values_list("seq", "hash").first()
    context = {
        "focus": attempt,
        "sections": sections,
        "decisions": [r for r in rows if r["decision"]],
        "all_ok": all(r["hash_ok"] and r["link_ok"] for r in rows),
        "head": head,
        "printed_at": timezone.now(),
        "events_total": len(rows),
    }
    return render(request, "attempts/report.html", context)


@require_GET
@refuse_politely
def report_lookup(request: HttpRequest) -> HttpResponse:
    """The report form on the exports page: go to the report of the attempt id typed in."""
    _allowed_tenants(request)
    attempt_id = request.GET.get("attempt", "").strip()
    if not ATTEMPT_ID.fullmatch(attempt_id):
        return HttpResponseBadRequest(
            "give an attempt id (letters, digits, _ and -, at most 32)", content_type="text/plain"
        )
    return redirect("audit_report", attempt_id=attempt_id)


@require_GET
@refuse_politely
def log_page(request: HttpRequest) -> HttpResponse:
    """The transparency log for an operator or an auditor: the newest signed checkpoint, who
    cosigned it and when, the verifier key to copy, and how to check an export with the
    standalone verifier (a link that downloads it)."""
    _allowed_tenants(request)  # reviewers and admins, as the exports
    signed = log.newest_signed()
    cosigners = []
    if signed is not None:
        cosigners = list(
            signed.signatures.filter(kind="witness").order_by("name").values("name", "created_at")
        )
    try:
        keys = [str(key) for key in log.verifier_keys()]
    except log.LogKeyError as exc:
        keys, key_problem = [], str(exc)
    else:
        key_problem = ""
    return render(
        request,
        "attempts/log.html",
        {
            "signed": signed,
            "note": log.signed_note(signed) if signed else None,
            "cosigners": cosigners,
            "keys": keys,
            "key_problem": key_problem,
            "tlog": _log_status(),
        },
    )


@require_GET
@refuse_politely
def verifier_script(request: HttpRequest) -> HttpResponse:
    """The standalone verifier (``verify_export.py``: standard library and ``rfc8785``), the
    exact file this server checks with, to run where the server is not trusted."""
    _allowed_tenants(request)
    response = HttpResponse(
        Path(verify_export.__file__).read_bytes(), content_type="text/x-python; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="verify_export.py"'
    return response
