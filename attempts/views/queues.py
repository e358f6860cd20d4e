"""The queues: UNKNOWN, MANUAL_REVIEW, stale in flight, and all attempts.

Fast at a million rows: a page is never an OFFSET and never a COUNT. Each page is a keyset
range on (created_at, id) read from the (tenant, state, created_at, id) index, one short range
per (tenant, state) "lane" in the user's scope, merged in Python; ``page_size + 1`` rows tell
whether there is more. Filters and the cursor live in the URL, so a link, a reload or the htmx
poll shows the same place.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db.models import Max
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from attempts import ledger, owners, review, waiting
from attempts.models import (
    ATTENTION_STATES,
    MIN_PREFIX,
    ArchivedAttempt,
    Attempt,
    AttemptEvent,
    Role,
    SlaEscalation,
    SlaPolicy,
    State,
    Tool,
    attention_age,
)
from attempts.queues import PREFIX_SCAN, QueuePage, queue_page
from attempts.review import Seen
from attempts.views._common import (
    bad_request,
    max_role,
    refuse_nul_bytes,
    tenant_roles,
    user_tenants,
)

PAGE_SIZE = 50
IN_FLIGHT = (State.INTENT_RECORDED, State.DISPATCHED, State.FAILED_RETRYABLE)
AGES = {
    "": None,
    "5m": dt.timedelta(minutes=5),
    "1h": dt.timedelta(hours=1),
    "1d": dt.timedelta(days=1),
    "7d": dt.timedelta(days=7),
}
AGE_LABELS = {
    "": "any age",
    "5m": "older than 5 min",
    "1h": "older than 1 h",
    "1d": "older than 1 day",
    "7d": "older than 7 days",
}
ROW_FIELDS = (
    "id",
    "attempt_id",
    "tenant_id",
    "tool_name",
    "task_id",
    "idempotency_key",
    "provider_request_id",
    "args_hash",
    "state",
    "version",
    "owner_id",
    "review_reason",
    "awaiting_approval",
    "created_at",
)


@dataclass(frozen=True)
class Queue:
    slug: str
    title: str
    states: tuple[str, ...]
    stale_only: bool = False
    description: str = ""


QUEUES: dict[str, Queue] = {
    q.slug: q
    for q in (
        Queue(
            "unknown",
            "UNKNOWN",
            (State.UNKNOWN,),
            description="The outcome is not known: reconciliation keeps looking; a person decides when it cannot.",
        ),
        Queue(
            "review",
            "Manual review",
            (State.MANUAL_REVIEW,),
            description="A person must decide: confirm, fail, or approve a linked retry.",
        ),
        Queue(
            "inflight",
            "In flight",
            IN_FLIGHT,
            description="Recorded, dispatched or waiting to be sent again: the ledger or its agent is still working on these.",
        ),
        Queue(
            "stale",
            "Stale in flight",
            IN_FLIGHT,
            stale_only=True,
            description="Recorded or dispatched, and unchanged for longer than the stale threshold: recovery should have picked these up.",
        ),
        Queue(
            "all", "All attempts", tuple(State.values), description="Every attempt in your tenants."
        ),
    )
}


class BadFilter(ValueError):
    """A query-string value the queue cannot use (answered with a clear 400)."""


PAGE_SIZES = (25, 50, 100, 200)


@dataclass
class Filters:
    tenant: str = ""
    tool: str = ""
    owner: str = ""  # "", "me", "unassigned" or a username
    owner_id: int | None = None  # the person when ``owner`` names one
    awaiting: str = ""  # "me": awaiting my approval
    state: str = ""
    age: str = ""
    q: str = ""
    sort: str = "oldest"
    size: int = 0  # 0: PAGE_SIZE
    after: tuple[dt.datetime, int] | None = None
    before: tuple[dt.datetime, int] | None = None

    def params(self, **override: Any) -> dict[str, str]:
        """The non-default filters as query parameters (for links and the poll)."""
        values = {
            "tenant": self.tenant,
            "tool": self.tool,
            "owner": self.owner,
            "awaiting": self.awaiting,
            "state": self.state,
            "age": self.age,
            "q": self.q,
            "sort": "" if self.sort == "oldest" else self.sort,
            "size": str(self.size) if self.size else "",
        }
        values.update(override)
        return {k: v for k, v in values.items() if v}

    @property
    def any(self) -> bool:
        return bool(
            self.q or self.tenant or self.tool or self.owner or self.age or self.state
        ) or bool(self.awaiting)


def encode_cursor(created_at: dt.datetime, pk: int) -> str:
    micros = int(created_at.timestamp() * 1_000_000)
    return f"{micros}.{pk}"


def decode_cursor(raw: str) -> tuple[dt.datetime, int]:
    try:
        micros_text, pk_text = raw.split(".", 1)
        micros, pk = int(micros_text), int(pk_text)
        if micros < 0 or not 0 <= pk < 2**63:
            raise ValueError
        when = dt.datetime.fromtimestamp(micros / 1_000_000, tz=dt.UTC)
    except (ValueError, OverflowError, OSError):
        raise BadFilter(
            "the page cursor in the address is not valid; start again from the first page"
        ) from None
    return when, pk


def parse_filters(request: HttpRequest, queue: Queue) -> Filters:
    get = request.GET
    f = Filters(
        tenant=get.get("tenant", "").strip(),
        tool=get.get("tool", "").strip(),
        owner=get.get("owner", "").strip(),
        state=get.get("state", "").strip(),
        age=get.get("age", "").strip(),
        q=get.get("q", "").strip()[:255],
        sort=get.get("sort", "oldest").strip() or "oldest",
        awaiting=get.get("awaiting", "").strip(),
    )
    if f.tenant and f.tenant not in tenant_roles(request.user):
        raise BadFilter(f"you are not a member of a tenant called {f.tenant!r}")
    if f.owner not in ("", "me", "unassigned"):
        f.owner_id = (
            get_user_model()
            .objects.filter(
                username=f.owner, ledger_memberships__tenant_id__in=user_tenants(request.user)
            )
            .values_list("pk", flat=True)
            .first()
        )
        if f.owner_id is None:
            raise BadFilter(
                "owner must be me, unassigned, empty (anyone) or a person in your tenants"
            )
    if f.awaiting not in ("", "me"):
        raise BadFilter("awaiting must be me or empty")
    size = get.get("size", "").strip()
    if size:
        if not size.isdigit() or int(size) not in PAGE_SIZES:
            raise BadFilter("page size must be one of " + ", ".join(map(str, PAGE_SIZES)))
        f.size = int(size)
    if f.state and f.state not in queue.states:
        raise BadFilter(f"state {f.state!r} is not shown in the {queue.title} queue")
    if f.age not in AGES:
        raise BadFilter("age must be one of: " + ", ".join(a for a in AGES if a))
    if f.sort not in ("oldest", "newest"):
        raise BadFilter("sort must be oldest or newest")
    if get.get("after"):
        f.after = decode_cursor(get["after"])
    if get.get("before"):
        f.before = decode_cursor(get["before"])
    if f.after and f.before:
        raise BadFilter("a page has either an after or a before cursor, not both")
    return f


def fetch_page(
    *,
    user: Any,
    queue: Queue,
    filters: Filters,
    now: dt.datetime,
    page_size: int | None = None,
    request: HttpRequest | None = None,
) -> QueuePage:
    """One page of the queue for this user (``queues.queue_page``: tenant-scoped,
    filtered, keyset-paginated), with what its rows show."""
    states = (filters.state,) if filters.state else queue.states
    if filters.awaiting:
        states = tuple(s for s in states if s == State.MANUAL_REVIEW)
    age = AGES[filters.age]
    stale_after = dt.timedelta(seconds=settings.LEDGER["STALE_AFTER"])
    page = queue_page(
        user=user,
        # the user's own tenants (the one scoping rule), or one of them
        tenants=[filters.tenant] if filters.tenant else user_tenants(user),
        states=states,
        page_size=page_size or filters.size or PAGE_SIZE,
        tool=filters.tool,
        owner_id=user.pk if filters.owner == "me" else filters.owner_id,
        unassigned=filters.owner == "unassigned",
        awaiting_me=bool(filters.awaiting),
        created_before=now - age if age is not None else None,
        updated_before=now - stale_after if queue.stale_only else None,
        q=filters.q,
        ascending=filters.sort == "oldest",
        after=filters.after,
        before=filters.before,
        fields=ROW_FIELDS,
    )
    rows = page.rows
    if rows:
        page.next_cursor = encode_cursor(rows[-1]["created_at"], rows[-1]["id"])
        page.prev_cursor = encode_cursor(rows[0]["created_at"], rows[0]["id"])
    _decorate(rows, now, user, request)
    return page


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decorate(
    rows: list[dict[str, Any]], now: dt.datetime, user: Any, request: HttpRequest | None
) -> None:
    """Everything the row template shows, computed here: per-row template filters and URL
    reversing are what a 50-row page spends its time on."""
    from attempts.templatetags.ledger_ui import display_tools, duration, state_class

    owner_ids = {r["owner_id"] for r in rows if r["owner_id"]}
    names = (
        dict(get_user_model().objects.filter(pk__in=owner_ids).values_list("pk", "username"))
        if owner_ids
        else {}
    )
    pks = [r["id"] for r in rows]
    review_pks = [r["id"] for r in rows if r["state"] == State.MANUAL_REVIEW]
    awaiting_me = (
        set(
            Attempt.objects.awaiting_approval_of(user)
            .filter(pk__in=review_pks)
            .values_list("pk", flat=True)
        )
        if review_pks
        else set()
    )
    last_events = (
        dict(
            AttemptEvent.objects.filter(attempt_id__in=pks)
            .values("attempt_id")
            .annotate(last=Max("id"))
            .values_list("attempt_id", "last")
        )
        if pks
        else {}
    )
    attention = [r for r in rows if r["state"] in ATTENTION_STATES]
    policies = SlaPolicy.table() if attention else {}
    acknowledged = (
        set(
            SlaEscalation.objects.filter(
                attempt_id__in=[r["id"] for r in attention], acknowledged_by__isnull=False
            ).values_list("attempt_id", "state")
        )
        if attention and policies
        else set()
    )
    whys = _whys(rows, last_events, now)
    _amount_args(rows, display_tools(request))
    zone = timezone.get_current_timezone()
    detail_base = reverse("attempt-detail", args=["-"])[:-2]
    for row in rows:
        age = attention_age(row["created_at"], now)
        row["owner_name"] = names.get(row["owner_id"], "")
        row["mine"] = row["owner_id"] == user.pk
        row["age_text"] = duration(age)
        row["created_text"] = row["created_at"].astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")
        row["state_css"] = state_class(row["state"])
        row["url"] = f"{detail_base}{row['attempt_id']}/"
        row["task_short"] = _short(row["task_id"], 28)
        row["key_short"] = _short(row["idempotency_key"], 40)
        row["provider_short"] = _short(row["provider_request_id"], 24) or "—"
        row["awaits_me"] = row["id"] in awaiting_me
        row["seen"] = f"{row['attempt_id']}:{row['version']}:{last_events.get(row['id'], 0)}"
        policy = SlaPolicy.pick(policies, row["tool_name"], row["tenant_id"]) if policies else None
        row["sla"] = SlaPolicy.level(policy, row["state"], age)
        row["sla_ack"] = (row["id"], row["state"]) in acknowledged
        row["why"] = whys.get(row["id"], "")


def _amount_args(rows: list[dict[str, Any]], money_tools: dict[str, Any]) -> None:
    """The arguments of the rows whose tool declares an amount (one bounded query), so the
    row shows it as money; other rows never read their arguments."""
    wanted = [row["id"] for row in rows if row["tool_name"] in money_tools]
    if not wanted:
        return
    args = dict(Attempt.objects.filter(pk__in=wanted).values_list("pk", "args"))
    for row in rows:
        if row["id"] in args:
            row["args"] = args[row["id"]]


# States whose rows say what happens next (attempts.waiting): recovery's work.
WHY_STATES = (State.UNKNOWN, State.INTENT_RECORDED, State.DISPATCHED, State.FAILED_RETRYABLE)


def _whys(
    rows: list[dict[str, Any]], last_events: dict[int, int], now: dt.datetime
) -> dict[int, str]:
    """What happens next to each UNKNOWN, stale, approved or held row, and why: two bounded
    queries for the page (the rows' schedule, their latest events' details)."""
    pks = [r["id"] for r in rows if r["state"] in WHY_STATES]
    if not pks:
        return {}
    schedule = {
        pk: (updated, next_check, policy)
        for pk, updated, next_check, policy in Attempt.objects.filter(pk__in=pks).values_list(
            "pk", "updated_at", "next_check_at", "approval_policy_id"
        )
    }
    details = dict(
        AttemptEvent.objects.filter(
            id__in=[last_events[pk] for pk in pks if pk in last_events]
        ).values_list("attempt_id", "details")
    )
    out = {}
    for row in rows:
        if row["id"] not in schedule:
            continue
        updated, next_check, policy = schedule[row["id"]]
        out[row["id"]] = waiting.why_waiting(
            state=row["state"],
            updated_at=updated,
            next_check_at=next_check,
            approval_policy=policy is not None,
            latest_details=details.get(row["id"]),
            now=now,
        )
    return out


def _tool_names() -> list[str]:
    return list(Tool.objects.order_by("name").values_list("name", flat=True))


@require_GET
@refuse_nul_bytes
def queue_view(request: HttpRequest, slug: str = "unknown") -> HttpResponse:
    """A queue page; for htmx (filter changes, paging, the poll) only the table fragment."""
    queue = QUEUES.get(slug)
    if queue is None:
        return bad_request(request, f"there is no queue called {slug!r}", status=404)
    try:
        filters = parse_filters(request, queue)
    except BadFilter as exc:
        return bad_request(request, str(exc))
    now = timezone.now()
    page = fetch_page(user=request.user, queue=queue, filters=filters, now=now, request=request)
    here = reverse("queue", args=[queue.slug])
    base_params = filters.params()
    top_role = max_role(request.user)
    people = owners.owner_names(user_tenants(request.user))
    context = {
        "queue": queue,
        "queues": QUEUES.values(),
        "filters": filters,
        "page": page,
        "now": now,
        "tenants": user_tenants(request.user),
        "tools": _tool_names(),
        "states": queue.states,
        "ages": AGE_LABELS,
        "self_url": here + ("?" + urlencode(request.GET) if request.GET else ""),
        "first_url": here + ("?" + urlencode(base_params) if base_params else ""),
        "next_url": here + "?" + urlencode({**base_params, "after": page.next_cursor}),
        "prev_url": here + "?" + urlencode({**base_params, "before": page.prev_cursor}),
        "can_bulk": Role.can_act(top_role),
        "can_bulk_review": Role.can_review(top_role),
        # Whom the assign control offers, and the owner filter's choices: who may own work.
        "assignees": people,
        "owners": people,
        "page_sizes": PAGE_SIZES,
        "sort_url": here
        + "?"
        + urlencode(filters.params(sort="newest" if filters.sort == "oldest" else "")),
        "short_search": bool(filters.q) and len(filters.q) < MIN_PREFIX,
        # Attempts moved to an archive: the search says where they went (docs/archive.md).
        "archived": list(
            ArchivedAttempt.objects.visible_to(request.user)
            .matching(filters.q)
            .select_related("archive")[:10]
        ),
        "min_prefix": MIN_PREFIX,
        "prefix_scan": PREFIX_SCAN,
        "poll_seconds": 15,
    }
    if request.htmx:
        return render(request, "attempts/queues.html#table", context)
    return render(request, "attempts/queues.html", context)


BULK_ACTIONS = {
    "take": "Took",
    "assign": "Assigned",
    "unassign": "Unassigned",
    "confirm": "Marked OUTCOME_CONFIRMED",
    "fail": "Marked FAILED",
    "note": "Added a note to",
}


def _bulk_one(action: str, attempt_id: str, seen: Seen, user: Any, owner: Any, post: Any) -> None:
    """One attempt of a bulk action: the same review function, role and version checks as
    the attempt's own page."""
    if action in ("take", "assign", "unassign"):
        review.assign(attempt_id, user=user, owner=owner, seen=seen)
    elif action == "confirm":
        review.review_confirm(
            attempt_id,
            user=user,
            result_ref=post.get("result_ref", ""),
            evidence=post.get("evidence", ""),
            seen=seen,
        )
    elif action == "fail":
        review.review_fail(attempt_id, user=user, reason=post.get("reason", ""), seen=seen)
    else:
        review.add_note(attempt_id, user=user, text=post.get("text", ""))


def _parse_pick(item: str) -> tuple[str, Seen | None]:
    """``attempt_id:version[:last event id]`` as the row showed it."""
    attempt_id, _, rest = item.partition(":")
    version_text, _, event_text = rest.partition(":")
    try:
        version = int(version_text) if version_text else None
        event_id = int(event_text) if event_text else None
    except ValueError:
        raise ValueError("bad version") from None
    return attempt_id, Seen(version, event_id) if version is not None else None


@require_POST
@refuse_nul_bytes
def bulk_action(request: HttpRequest) -> HttpResponse:
    """Take, assign, unassign, mark confirmed or failed (with evidence and a reason), or note
    many attempts at once. Each one is its own role check and compare against what the page
    showed; the message says how many were done and why any were not."""
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = reverse("queue", args=["unknown"])
    action = request.POST.get("action", "")
    if action not in BULK_ACTIONS:
        return bad_request(request, "choose one of: " + ", ".join(BULK_ACTIONS))
    picked = request.POST.getlist("attempt")
    if not picked:
        messages.error(request, "Select at least one attempt first.")
        return HttpResponseRedirect(back)
    if len(picked) > 200:
        return bad_request(request, "at most 200 attempts at once")
    owner = None
    if action == "take":
        owner = request.user
    elif action == "assign":
        username = request.POST.get("owner", "").strip()
        owner = owners.active_person(username)
        if owner is None:
            return bad_request(request, f"there is no active user called {username!r}")
    done_ids: list[str] = []
    problems: list[str] = []
    for item in picked:
        try:
            attempt_id, seen = _parse_pick(item)
        except ValueError:
            problems.append(f"{item.partition(':')[0]}: bad version")
            continue
        if not Attempt.objects.visible_to(request.user).filter(attempt_id=attempt_id).exists():
            problems.append(f"{attempt_id}: not found")
            continue
        try:
            _bulk_one(action, attempt_id, seen, request.user, owner, request.POST)
        except ledger.InvalidIntent as exc:
            if not done_ids:
                # What was typed (evidence, a reason, a note) is refused by review before it
                # reads the attempt: the same answer for every one, said once.
                messages.error(request, f"Nothing changed: {exc.message}.")
                return HttpResponseRedirect(back)
            problems.append(f"{attempt_id}: {exc.message}")
        except ledger.LedgerError as exc:
            problems.append(f"{attempt_id}: {exc.message}")
        else:
            done_ids.append(attempt_id)
    verb = BULK_ACTIONS[action]
    if action == "assign" and owner is not None:
        verb = f"Assigned to {owner.get_username()}"
    if done_ids:
        messages.success(
            request, f"{verb} {len(done_ids)} attempt{'s' if len(done_ids) != 1 else ''}."
        )
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        messages.error(request, f"{len(problems)} not changed: {shown}")
    return HttpResponseRedirect(back)
