"""The queue planner: one page of a queue as ordered index ranges ("lanes") merged, keyset
pages by (created_at, id), and the total, exact up to a cap and estimated past it.

Without a search a lane is one equality prefix of a queue index, (tenant) for every state or
(tenant, state), so each is an ordered index range; a prefix search has one lane per identifier,
each a range of that identifier's own index (``AttemptQuerySet.prefix_search``), so a prefix
matching most of the ledger is never gathered and sorted, and each lane reads at most PREFIX_SCAN
entries of its range (``_first_of_range``). Phase one reads only (created_at, id) from each lane,
phase two loads the page's rows by key. Views and the API call ``queue_page``.
"""

from __future__ import annotations

import datetime as dt
import heapq
from dataclasses import dataclass
from typing import Any

from django.db import connection, models
from django.db.models import Q
from django.db.models.expressions import RawSQL

from attempts import dbadapter, rows
from attempts.models import (
    MIN_PREFIX,
    PREFIX_FIELDS,
    QUEUE_COUNT_CAP,
    Attempt,
    State,
    canonical_attempt_id,
)

# A prefix search reads at most this many entries of one identifier's range.
PREFIX_SCAN = 10 * QUEUE_COUNT_CAP


@dataclass
class QueuePage:
    """One page of a queue (``queue_page``)."""

    rows: list[dict[str, Any]]
    has_next: bool
    has_prev: bool
    more_matches: bool = False  # a prefix search found more than one page: narrow it
    total: int = 0
    total_exact: bool = True
    total_at_least: bool = False  # not exact, and a lower bound rather than an estimate
    search_cut: bool = False  # matches past the PREFIX_SCAN entries read may be missing
    # The screen's own encoding of the first and last rows' keys, for its links.
    next_cursor: str = ""
    prev_cursor: str = ""


def exact_search(term: str) -> Q:
    """A term shorter than MIN_PREFIX matches identifiers exactly (a prefix would match too
    much to be useful)."""
    return (
        Q(attempt_id=canonical_attempt_id(term))
        | Q(idempotency_key=term)
        | Q(provider_request_id=term)
        | Q(task_id=term)
    )


def search_scope(tenants: list[str], states: tuple[str, ...]) -> Q:
    """The tenant and state limits of a search lane, or of any read led by an identifier's own
    index (the API's list by key, task or trace). On SQLite they are written so the planner
    cannot read them from an index (``+column``): it must walk the identifier's own index in
    order, never gather every match of a broad prefix by tenant and sort them. (With no
    statistics SQLite may otherwise pick the tenant's range and read every attempt in it.)"""
    every_state = set(states) == set(State.values)
    if connection.vendor != "sqlite":
        return Q(tenant_id__in=tenants) & (Q() if every_state else Q(state__in=states))
    table = Attempt._meta.db_table
    scope = Q(_unindexed_in(f'"{table}"."tenant_id"', tenants))
    if not every_state:
        scope &= Q(_unindexed_in(f'"{table}"."state"', list(states)))
    return scope


def _unindexed_in(column: str, values: list[str]) -> RawSQL:
    if not values:
        return RawSQL("0 = 1", [], output_field=models.BooleanField())
    marks = ", ".join(["%s"] * len(values))
    # The column name is ours; the values are parameters.
    return RawSQL(f"+{column} IN ({marks})", list(values), output_field=models.BooleanField())  # noqa: S611


def _keyset(cursor: tuple[dt.datetime, int], *, forward_ascending: bool) -> Q:
    """Rows strictly after ``cursor`` in the walking direction. The plain range term on
    created_at is what lets the index seek; the OR only breaks ties."""
    when, pk = cursor
    if forward_ascending:
        return Q(created_at__gte=when) & (Q(created_at__gt=when) | Q(id__gt=pk))
    return Q(created_at__lte=when) & (Q(created_at__lt=when) | Q(id__lt=pk))


def _queue_lanes(
    base: Any,
    uncursored: Any,
    tenants: list[str],
    states: tuple[str, ...],
    q: str,
    *,
    by_owner: bool,
    order: tuple[str, str],
) -> tuple[list, list]:
    """(each lane walked from the cursor, each lane whole, for the total): one lane per index
    range (``queue_page``). A prefix search's lanes are read by
    ``_first_of_range``; these serve PostgreSQL's estimate of its total. No tenant or no
    state: no lane."""
    if not states or not tenants:
        return [], []
    if q and len(q) >= MIN_PREFIX:
        scope = search_scope(tenants, states)
        lanes = [base.prefix_search(q, field).filter(scope) for field in PREFIX_FIELDS]
        return lanes, lanes
    if q:
        specs = [exact_search(q) & search_scope(tenants, states)]
    elif set(states) == set(State.values) and not by_owner:
        specs = [Q(tenant_id=t) for t in tenants]
    else:
        specs = [Q(tenant_id=t, state=s) for t in tenants for s in states]
    return (
        [base.filter(spec).order_by(*order) for spec in specs],
        [uncursored.filter(spec) for spec in specs],
    )


def _first_of_range(scope: Q, field: str, term: str, want: int) -> tuple[list[int], bool]:
    """A prefix search's lane: the ids of the rows in ``scope`` (filters, cursor, tenants,
    states) among the first PREFIX_SCAN + 1 entries of ``field``'s range of ``term``, in the
    range's order, at most ``max(QUEUE_COUNT_CAP, want) + 1`` of them; and whether the lane
    holds more than those (it stopped at that many, or the range goes on past its entries).

    One ordered walk of the identifier's index, each entry's row checked against the scope as
    it is read, stopping once enough rows are found: bounding the entries bounds the reads,
    however rare the matches of a broad prefix are in a narrow state, and no plan can trade
    the walk for the whole range."""
    first = Attempt.objects.prefix_search(term, field).order_by("search_key")
    walk = first.annotate(
        in_scope=models.ExpressionWrapper(scope, output_field=models.BooleanField())
    ).values("id", "in_scope")[: PREFIX_SCAN + 1]
    if walk.query.is_empty():  # the term cannot start this identifier (an args hash is hex)
        return [], False
    sql, params = dbadapter.sql_with_params(walk)
    limit = max(QUEUE_COUNT_CAP, want) + 1
    with connection.cursor() as cursor:
        # The ORM has no subquery in FROM: only the walk's rows in scope come back, and the
        # walk stops when ``limit`` of them are found. The walk's SQL is the ORM's own.
        cursor.execute(
            f'SELECT "id" FROM ({sql}) AS "walk" WHERE "in_scope" LIMIT %s',  # noqa: S608
            [*params, limit],
        )
        found = [pk for (pk,) in cursor.fetchall()]
    if len(found) == limit:
        return found, True
    return found, first.values("id")[: PREFIX_SCAN + 1].count() > PREFIX_SCAN


def _estimate_total(lanes: list, scanned: list | None = None) -> tuple[int, bool, bool]:
    """How many rows the lanes hold, as (total, exact, lower bound): exact up to
    QUEUE_COUNT_CAP per lane (ids read from the lane's index, no COUNT), else PostgreSQL's
    planner estimate, else a lower bound: the ids read. SQLite has no estimate, and a prefix
    walk that stopped at PREFIX_SCAN entries with fewer than the cap found gets none either:
    the rest of its range is unread, and the planner's guess of it (its filters taken as
    independent) can be thousands where none are in the queue.

    A prefix search's ids are the ones ``_first_of_range`` found (``scanned``: each lane's ids
    and whether it holds more than those), so a cut range makes the total inexact too."""
    if scanned is None:
        scanned = [
            (list(lane.order_by().values_list("id", flat=True)[: QUEUE_COUNT_CAP + 1]), False)
            for lane in lanes
        ]
    ids: set[int] = set()
    capped = False
    for found, cut in scanned:
        capped = capped or cut or len(found) > QUEUE_COUNT_CAP
        ids.update(found[:QUEUE_COUNT_CAP])
    if not capped:
        return len(ids), True, False
    walked_short = any(cut and len(found) <= QUEUE_COUNT_CAP for found, cut in scanned)
    if connection.vendor == "postgresql" and not walked_short:
        estimate = sum(rows.planned_rows(lane.order_by().values("id")) for lane in lanes)
        return max(estimate, len(ids)), False, False
    return len(ids), False, True


def queue_page(
    *,
    user: Any,
    tenants: list[str],
    states: tuple[str, ...],
    page_size: int,
    tool: str = "",
    owner_id: int | None = None,
    unassigned: bool = False,
    awaiting_me: bool = False,
    created_before: dt.datetime | None = None,
    updated_before: dt.datetime | None = None,
    q: str = "",
    ascending: bool = True,
    after: tuple[dt.datetime, int] | None = None,
    before: tuple[dt.datetime, int] | None = None,
    fields: tuple[str, ...] = ("id",),
) -> QueuePage:
    """One page of a queue for ``user``: attempts of ``tenants`` (theirs, or one of them) in
    ``states``, filtered, in creation order, keyset-paginated by (created_at, id) ``after`` or
    ``before`` a row, each row the ``fields`` asked for. Rows outside what ``user`` may see are
    never returned. The total is ``_estimate_total``'s."""
    filters = _filters(
        user,
        tool=tool,
        owner_id=owner_id,
        unassigned=unassigned,
        awaiting_me=awaiting_me,
        created_before=created_before,
        updated_before=updated_before,
    )
    backwards = before is not None
    walk_ascending = ascending != backwards
    cursor = Q()
    if after:
        cursor = _keyset(after, forward_ascending=ascending)
    elif before:
        cursor = _keyset(before, forward_ascending=not ascending)
    uncursored = Attempt.objects.filter(filters)
    order = ("created_at", "id") if walk_ascending else ("-created_at", "-id")
    want = page_size + 1
    prefix = bool(q) and len(q) >= MIN_PREFIX
    lanes, lanes_without_cursor = _queue_lanes(
        uncursored.filter(cursor),
        uncursored,
        tenants,
        states,
        q,
        by_owner=owner_id is not None,
        order=order,
    )
    scanned, search_cut = None, False
    if lanes and prefix:
        scanned = _prefix_lanes(filters & cursor & search_scope(tenants, states), q, want)
        search_cut = any(more and len(found) < want for found, more in scanned)
        keys = _first_keys(scanned, want)
    else:
        keys = [list(lane.values_list("created_at", "id")[:want]) for lane in lanes]
    merged = _rows(user, _merge(keys, prefix=prefix, ascending=walk_ascending, want=want), fields)
    more = len(merged) > page_size
    page_rows = merged[:page_size]
    if backwards:
        page_rows.reverse()
        has_prev, has_next = more, True
    else:
        has_next, has_prev = more, after is not None
    total, exact, at_least = _estimate_total(lanes_without_cursor, scanned)
    return QueuePage(
        rows=page_rows,
        # A prefix search is one page of its best matches: no pages around it.
        has_next=has_next and bool(page_rows) and not prefix,
        has_prev=has_prev and bool(page_rows) and not prefix,
        more_matches=prefix and more,
        total=total,
        total_exact=exact,
        total_at_least=at_least,
        search_cut=search_cut,
    )


def _filters(
    user: Any,
    *,
    tool: str,
    owner_id: int | None,
    unassigned: bool,
    awaiting_me: bool,
    created_before: dt.datetime | None,
    updated_before: dt.datetime | None,
) -> Q:
    """The page's filters besides tenants, states, search and cursor."""
    filters = Q()
    if tool:
        filters &= Q(tool_name=tool)
    if owner_id is not None:
        filters &= Q(owner_id=owner_id)
    elif unassigned:
        filters &= Q(owner__isnull=True)
    if awaiting_me:
        filters &= Q(pk__in=Attempt.objects.awaiting_approval_of(user).values("pk"))
    if created_before is not None:
        filters &= Q(created_at__lte=created_before)
    if updated_before is not None:
        filters &= Q(updated_at__lte=updated_before)
    return filters


def _prefix_lanes(scope: Q, term: str, want: int) -> list[tuple[list[int], bool]]:
    """Each identifier's lane: its matches among the first PREFIX_SCAN entries of its range, in
    the range's order. Fewer than a page of them, with more range after them, is said
    (``search_cut``) instead of walking the rest of the range."""
    return [_first_of_range(scope, field, term, want) for field in PREFIX_FIELDS]


def _first_keys(scanned: list[tuple[list[int], bool]], want: int) -> list[list[tuple]]:
    """The (created_at, id) keys of the rows a prefix search shows: each lane's first ``want``."""
    shown = {pk for found, _ in scanned for pk in found[:want]}
    return [list(Attempt.objects.filter(pk__in=shown).values_list("created_at", "id"))]


def _merge(keys: list[list[tuple]], *, prefix: bool, ascending: bool, want: int) -> list[tuple]:
    """The lanes' keys in walking order, each row once (a row found by two identifiers)."""
    if prefix:
        return sorted(set().union(*keys), reverse=not ascending)
    merged: list[tuple] = []
    for key in heapq.merge(*keys, reverse=not ascending):
        if not merged or merged[-1] != key:
            merged.append(key)
        if len(merged) == want:
            break
    return merged


def _rows(user: Any, keys: list[tuple], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of ``keys``, in their order, as ``fields``: only those ``user`` may see."""
    by_pk = {
        row["id"]: row
        for row in Attempt.objects.visible_to(user)
        .filter(pk__in=[pk for _, pk in keys])
        .values(*fields)
    }
    return [by_pk[pk] for _, pk in keys if pk in by_pk]
