"""The configuration history: every change of who may do what (tenants, people, roles, tokens,
tools, grants, ownership rules, SLA policies...), newest first, with before and after.

Scoped by ``ConfigEvent.objects.visible_to`` (reviewers and admins see their tenants' changes
and those that concern every tenant; people and token changes are for admins). Filters live in
the URL; a page is a keyset range on the change's sequence number (never an OFFSET), and the
table is an htmx partial of the page.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from attempts.config_history import subject_kinds
from attempts.models import ConfigEvent, Role, tenants_where
from attempts.models.roles import admin_everywhere
from attempts.views._common import bad_request, refuse_nul_bytes

PAGE_SIZE = 50
PAGE_SIZES = (25, 50, 100, 200)


class BadFilter(ValueError):
    """A filter value the page cannot use; the message says which and why."""


@dataclass
class Filters:
    kind: str = ""
    subject: str = ""
    actor: str = ""
    action: str = ""
    since: str = ""
    until: str = ""
    before: int | None = None
    size: int = PAGE_SIZE

    def params(self, **override: Any) -> dict[str, str]:
        values = {
            "kind": self.kind,
            "subject": self.subject,
            "actor": self.actor,
            "action": self.action,
            "since": self.since,
            "until": self.until,
            "size": str(self.size) if self.size != PAGE_SIZE else "",
            "before": str(self.before) if self.before else "",
        }
        values.update({k: str(v) for k, v in override.items()})
        return {k: v for k, v in values.items() if v}

    @property
    def any(self) -> bool:
        return any((self.kind, self.subject, self.actor, self.action, self.since, self.until))


def _day(value: str, name: str) -> dt.datetime | None:
    if not value:
        return None
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        raise BadFilter(f"{name} must be a date like 2026-12-01, not {value!r}") from None
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def parse_filters(request: HttpRequest) -> Filters:
    """The filters of the URL; BadFilter for a value the page cannot use."""
    get = request.GET
    filters = Filters(
        kind=get.get("kind", "").strip(),
        subject=get.get("subject", "").strip()[:200],
        actor=get.get("actor", "").strip()[:150],
        action=get.get("action", "").strip()[:64],
        since=get.get("since", "").strip(),
        until=get.get("until", "").strip(),
    )
    kinds = subject_kinds()
    if filters.kind and filters.kind not in kinds:
        raise BadFilter(f"unknown kind {filters.kind!r}: choose one of {', '.join(kinds)}")
    since, until = _day(filters.since, "since"), _day(filters.until, "until")
    if since and until and until <= since:
        raise BadFilter("until must be after since")
    for name in ("before", "size"):
        raw = get.get(name, "").strip()
        if not raw:
            continue
        if not raw.isdigit() or len(raw) > 12:
            raise BadFilter(f"{name} must be a whole number, not {raw!r}")
        setattr(filters, name, int(raw))
    if filters.size not in PAGE_SIZES:
        raise BadFilter(f"size must be one of {', '.join(map(str, PAGE_SIZES))}")
    return filters


def changes_for(user: Any, filters: Filters):
    """The changes this person may read that match ``filters``, newest first."""
    rows = ConfigEvent.objects.visible_to(user)
    if filters.kind:
        rows = rows.filter(Q(subject__startswith=f"{filters.kind}:") | Q(subject=filters.kind))
    rows = rows.where_given(
        # An exact subject, or every subject starting with it ("membership:acme/").
        subject__startswith=filters.subject,
        actor=filters.actor,
        action=filters.action,
        created_at__gte=_day(filters.since, "since"),
        created_at__lt=_day(filters.until, "until"),
    )
    return rows.order_by("-seq")


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def fields_of(event: ConfigEvent) -> list[dict[str, str]]:
    """Each field the change names, with its value before and after."""
    before, after = event.before or {}, event.after or {}
    names = list(after) + [name for name in before if name not in after]
    return [
        {
            "name": name,
            "before": _shown(before.get(name)) if event.before is not None else "",
            "after": _shown(after.get(name)) if event.after is not None else "",
        }
        for name in names
    ]


@require_GET
@refuse_nul_bytes
def config_history(request: HttpRequest) -> HttpResponse:
    """The configuration history page (and its table, for htmx)."""
    user = request.user
    if not admin_everywhere(user) and not tenants_where(user, Role.REVIEWER):
        raise PermissionDenied("the configuration history is for reviewers and admins")
    try:
        filters = parse_filters(request)
    except BadFilter as exc:
        return bad_request(request, str(exc))
    rows = changes_for(user, filters)
    if filters.before:
        rows = rows.filter(seq__lt=filters.before)
    page = list(rows[: filters.size + 1])
    has_next = len(page) > filters.size
    page = page[: filters.size]
    base = reverse("config_history")

    def url(**override: Any) -> str:
        params = filters.params(**override)
        return base + ("?" + urlencode(params) if params else "")

    context = {
        "filters": filters,
        "kinds": subject_kinds(),
        "page_sizes": PAGE_SIZES,
        "changes": [{"event": event, "fields": fields_of(event)} for event in page],
        "has_next": has_next,
        "has_prev": filters.before is not None,
        "next_url": url(before=page[-1].seq) if has_next else "",
        "first_url": url(before=""),
        "self_url": url(),
        "now": timezone.now(),
    }
    template = "attempts/config_history.html"
    if request.htmx:
        template += "#table"
    return render(request, template, context)
