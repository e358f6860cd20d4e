"""The queues: tenant scope, filters, search, keyset pagination (no OFFSET, no COUNT), the
htmx fragment and poll, and bulk take/assign."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from attempts import queues as planner
from attempts.models import Attempt, State
from attempts.views import queues
from tests.conftest import PASSWORD
from tests.dashboard.conftest import login, make_attempt, make_review, make_unknown


def ids_in(response) -> list[str]:
    return [row["attempt_id"] for row in response.context["page"].rows]


def lane_plans(queries: CaptureQueriesContext) -> list[str]:
    """SQLite's query plan of each lane query of a queue page (at least one), one line each:
    a queue's lanes read (created_at, id), a prefix search's read (id, in_scope); the query that
    loads the keys of a prefix search's rows by id is not a lane."""
    by_id = re.compile(r'WHERE "attempts_attempt"\."id" IN \(\d')
    lanes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith('SELECT "attempts_attempt"."created_at" AS "created_at", ')
        and not by_id.search(q["sql"])
        or '"in_scope"' in q["sql"]
    ]
    assert lanes
    plans = []
    with connection.cursor() as cursor:
        for sql in lanes:
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            plans.append(" | ".join(str(row[-1]) for row in cursor.fetchall()))
    return plans


def test_unknown_queue_shows_only_my_tenants_unknown_work(world, clients):
    mine = make_unknown(world)
    theirs = make_unknown(world, tenant="globex")
    review = make_review(world)
    response = clients.viewer.get("/queues/unknown/")
    assert response.status_code == 200
    assert ids_in(response) == [mine.attempt_id]
    body = response.content.decode()
    assert theirs.attempt_id not in body and review.attempt_id not in body
    assert ids_in(clients.outsider.get("/queues/unknown/")) == [theirs.attempt_id]


def test_review_stale_and_all_queues(world, clients):
    unknown = make_unknown(world)
    review = make_review(world)
    fresh = make_attempt(world)
    stale = make_attempt(world)
    Attempt.objects.filter(pk=stale.pk).update(updated_at=timezone.now() - dt.timedelta(hours=1))
    assert ids_in(clients.viewer.get("/queues/review/")) == [review.attempt_id]
    assert ids_in(clients.viewer.get("/queues/stale/")) == [stale.attempt_id]
    everything = ids_in(clients.viewer.get("/queues/all/"))
    assert set(everything) == {
        unknown.attempt_id,
        review.attempt_id,
        fresh.attempt_id,
        stale.attempt_id,
    }
    only_intents = ids_in(clients.viewer.get("/queues/all/?state=INTENT_RECORDED"))
    assert set(only_intents) == {fresh.attempt_id, stale.attempt_id}


def test_filters_tool_owner_age_and_tenant(world, clients):
    ticket = make_unknown(world, tool="open_ticket")
    card = make_unknown(world, tool="charge_card")
    old = make_unknown(world, tool="update_crm")
    Attempt.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=2))
    # The ownership rule gives acme's attention work to "triage".
    assert Attempt.objects.get(pk=ticket.pk).owner == world.triage
    Attempt.objects.filter(pk=card.pk).update(owner=None)
    c = clients.triage
    assert ids_in(c.get("/queues/unknown/?tool=charge_card")) == [card.attempt_id]
    assert set(ids_in(c.get("/queues/unknown/?owner=me"))) == {ticket.attempt_id, old.attempt_id}
    assert ids_in(c.get("/queues/unknown/?owner=unassigned")) == [card.attempt_id]
    assert ids_in(c.get("/queues/unknown/?age=1d")) == [old.attempt_id]
    assert len(ids_in(c.get("/queues/unknown/?tenant=acme"))) == 3


@pytest.mark.parametrize(
    "query",
    [
        "tenant=globex",  # not a member: never another tenant's data
        "tenant=nope",
        "owner=someone",
        "state=FAILED",  # not in the UNKNOWN queue
        "age=3y",
        "sort=sideways",
        "after=garbage",
        "after=1.2&before=1.3",
        "after=1.99999999999999999999999",
        "before=99999999999999999999999.1",
    ],
)
def test_bad_filters_are_a_clear_400(world, clients, query):
    response = clients.operator.get(f"/queues/unknown/?{query}")
    assert response.status_code == 400
    assert "Cannot show this" in response.content.decode()


def test_unknown_queue_slug_is_404(world, clients):
    assert clients.operator.get("/queues/nonsense/").status_code == 404


def test_search_by_every_identifier(world, clients):
    target = make_unknown(world, provider_request_id="req-abc-123", key="acme:search:me")
    make_unknown(world)
    other_tenant = make_unknown(world, tenant="globex", provider_request_id="req-globex-9")
    for term in (
        "acme:search:me",
        "req-abc-123",
        target.task_id,
        target.attempt_id,
        target.attempt_id.lower(),
        target.args_hash[:10],
        target.args_hash[:10].upper(),
    ):
        assert ids_in(clients.viewer.get("/queues/all/", {"q": term})) == [target.attempt_id], term
    assert ids_in(clients.viewer.get("/queues/all/", {"q": "req-globex-9"})) == []
    assert ids_in(clients.viewer.get("/queues/all/", {"q": other_tenant.attempt_id})) == []
    # Too short a prefix is not a prefix search (it would match everything), and the page
    # says so instead of silently finding nothing.
    short = clients.viewer.get("/queues/all/", {"q": target.args_hash[:3]})
    assert ids_in(short) == []
    assert "only exact matches" in short.content.decode()
    # Prefixes of every identifier, from MIN_PREFIX characters on.
    for term in (
        "acme:sea",
        "req-abc",
        target.task_id[:5],
        target.attempt_id[:-3],
        target.attempt_id[:-3].lower(),
        target.args_hash[:5],
    ):
        found = ids_in(clients.viewer.get("/queues/all/", {"q": term}))
        assert target.attempt_id in found, term
        assert other_tenant.attempt_id not in found, term


def test_keyset_pagination_walks_every_row_once_forwards_and_back(world, clients, monkeypatch):
    monkeypatch.setattr(queues, "PAGE_SIZE", 3)
    base = timezone.now() - dt.timedelta(hours=3)
    made = []
    for i in range(8):
        attempt = make_unknown(world, tenant="acme" if i % 3 else "globex")
        made.append(attempt)
    # Two rows share a timestamp, to prove the id tie-break.
    for i, attempt in enumerate(made):
        when = base + dt.timedelta(minutes=i if i != 5 else 4)
        Attempt.objects.filter(pk=attempt.pk).update(created_at=when)
    world.admin.is_superuser = True  # a superuser sees both tenants
    world.admin.save()
    from tests.dashboard.conftest import login

    client = login(world.admin)
    expected = [
        a.attempt_id
        for a in sorted(
            Attempt.objects.filter(state=State.UNKNOWN), key=lambda a: (a.created_at, a.pk)
        )
    ]
    seen, pages, url = [], [], "/queues/unknown/"
    while True:
        response = client.get(url)
        pages.append(response)
        seen += ids_in(response)
        if not response.context["page"].has_next:
            break
        url = response.context["next_url"]
    assert seen == expected
    assert [len(ids_in(p)) for p in pages] == [3, 3, 2]
    # Back from the last page.
    back = client.get(pages[-1].context["prev_url"])
    assert ids_in(back) == expected[3:6]
    back = client.get(back.context["prev_url"])
    assert ids_in(back) == expected[0:3]
    assert not back.context["page"].has_prev
    # Newest first is the exact reverse.
    newest, url = [], "/queues/unknown/?sort=newest"
    while url:
        response = client.get(url)
        newest += ids_in(response)
        url = response.context["next_url"] if response.context["page"].has_next else None
    assert newest == list(reversed(expected))


def test_queue_pages_never_use_offset_or_count(world, clients):
    for _ in range(3):
        make_unknown(world)
    with CaptureQueriesContext(connection) as queries:
        first = clients.operator.get("/queues/unknown/")
        clients.operator.get(first.context["next_url"])
        clients.operator.get("/queues/all/?q=acme")
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert not [s for s in sql if "OFFSET" in s]
    # A prefix search walks at most the first PREFIX_SCAN + 1 entries of each range, and counts
    # how far those entries go only when the walk found fewer rows than it stops at: a bounded
    # read, never a count of the queue.
    bounded = f"LIMIT {planner.PREFIX_SCAN + 1})"
    assert [s for s in sql if f'{bounded} AS "WALK"' in s]
    assert not [s for s in sql if "COUNT(" in s and not s.endswith(f"{bounded} SUBQUERY")]


def test_htmx_gets_the_table_fragment_that_polls_the_same_place(world, clients):
    make_unknown(world)
    response = clients.operator.get(
        "/queues/unknown/?tool=open_ticket", headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and body.lstrip().startswith('<div id="queue-table"')
    assert 'hx-get="/queues/unknown/?tool=open_ticket"' in body
    assert 'hx-trigger="every 15s"' in body


def test_full_page_keeps_filters_in_the_form(world, clients):
    response = clients.operator.get("/queues/unknown/?tool=open_ticket&owner=me&age=1h")
    body = response.content.decode()
    assert '<option value="open_ticket" selected>' in body
    assert '<option value="me" selected>' in body
    assert '<option value="1h" selected>' in body


def test_bulk_take_and_assign(world, clients):
    a, b = make_unknown(world), make_unknown(world)
    picks = [f"{a.attempt_id}:{a.version}", f"{b.attempt_id}:{b.version}"]
    response = clients.operator.post(
        "/queues/bulk/", {"action": "take", "attempt": picks, "next": "/queues/unknown/?tool=x"}
    )
    assert response.status_code == 302 and response.url == "/queues/unknown/?tool=x"
    assert set(Attempt.objects.values_list("owner__username", flat=True)) == {"operator"}
    assert Attempt.objects.get(pk=a.pk).events.last().actor == "operator"
    # Assigning with the versions shown before the take: someone else changed them.
    response = clients.reviewer.post(
        "/queues/bulk/", {"action": "assign", "owner": "reviewer2", "attempt": picks}, follow=True
    )
    assert "someone else changed" in response.content.decode()
    assert set(Attempt.objects.values_list("owner__username", flat=True)) == {"operator"}
    fresh = [f"{x.attempt_id}:{x.version}" for x in Attempt.objects.all()]
    clients.reviewer.post(
        "/queues/bulk/", {"action": "assign", "owner": "reviewer2", "attempt": fresh}
    )
    assert set(Attempt.objects.values_list("owner__username", flat=True)) == {"reviewer2"}


def test_bulk_refuses_viewers_other_tenants_and_unsafe_redirects(world, clients):
    mine = make_unknown(world)
    theirs = make_unknown(world, tenant="globex")
    response = clients.viewer.post(
        "/queues/bulk/",
        {"action": "take", "attempt": [f"{mine.attempt_id}:{mine.version}"]},
        follow=True,
    )
    assert "needs the operator role" in response.content.decode()
    response = clients.operator.post(
        "/queues/bulk/",
        {
            "action": "take",
            "attempt": [f"{theirs.attempt_id}:{theirs.version}"],
            "next": "https://evil.example/",
        },
    )
    assert response.url == "/queues/unknown/"
    assert Attempt.objects.get(pk=theirs.pk).owner == world.outsider
    assert Attempt.objects.get(pk=mine.pk).owner == world.triage
    assert clients.operator.post("/queues/bulk/", {"action": "explode"}).status_code == 400
    assert clients.operator.get("/queues/bulk/").status_code == 405


@pytest.mark.parametrize(
    "query", ["/queues/unknown/", "/queues/all/", "/queues/unknown/?owner=me&sort=newest"]
)
def test_queue_lanes_are_ordered_index_ranges_on_sqlite(world, clients, query):
    """Each lane must read an index in order (no table scan, no sort of the whole state)."""
    if connection.vendor != "sqlite":
        pytest.skip("query plans are checked on SQLite")
    from attempts.models import Membership

    Membership.objects.create(user=world.triage, tenant=world.globex, role="operator")
    make_unknown(world)
    with CaptureQueriesContext(connection) as queries:
        clients.triage.get(query)
    for plan in lane_plans(queries):
        assert "USING COVERING INDEX attempt_" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


def test_the_poll_of_a_later_page_stays_on_that_page(world, clients, monkeypatch):
    monkeypatch.setattr(queues, "PAGE_SIZE", 2)
    made = [make_unknown(world) for _ in range(5)]
    first = clients.operator.get("/queues/unknown/")
    second_url = first.context["next_url"]
    poll = clients.operator.get(second_url, headers={"HX-Request": "true"})
    body = poll.content.decode()
    assert f'hx-get="{second_url.replace("&", "&amp;")}"' in body
    assert ids_in(poll) == ids_in(clients.operator.get(second_url))
    assert ids_in(poll) == [a.attempt_id for a in made[2:4]]


@pytest.mark.parametrize("term", ["acme:", "req-", "task-", "att_0", "abcdef"])
def test_prefix_search_lanes_walk_an_index_on_sqlite(world, clients, term):
    """Each identifier's lane of a prefix search is a range of that identifier's index, read in
    order: no table scan, no sort of every match (a prefix may match most of the ledger)."""
    if connection.vendor != "sqlite":
        pytest.skip("query plans are checked on SQLite")
    make_unknown(world, provider_request_id="req-1")
    with CaptureQueriesContext(connection) as queries:
        response = clients.operator.get("/queues/all/", {"q": term})
    assert response.status_code == 200
    for plan in lane_plans(queries):
        assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
        assert "SCAN attempts_attempt" not in plan or "USING" in plan, plan


@pytest.mark.parametrize(
    "field", ["idempotency_key", "provider_request_id", "task_id", "attempt_id", "args_hash"]
)
def test_prefix_search_has_a_byte_order_index_on_postgresql(world, field):
    """On PostgreSQL each identifier's prefix range is a range of a byte-order index (a range
    under the database's own collation would not be a prefix): the column's own index, or
    ``attempt_id``'s ``COLLATE "C"`` copy."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prefix indexes")
    make_unknown(world)
    lane = (
        Attempt.objects.prefix_search("abcd", field)
        .order_by("search_key", "id")
        .values_list("created_at", "id")[:51]
    )
    sql, params = lane.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = " | ".join(row[0] for row in cursor.fetchall())
    index = {
        "idempotency_key": "attempts_attempt_idempotency_key_",  # its unique constraint's
        "provider_request_id": "attempt_provider_req_idx",
        "task_id": "attempt_task_idx",
        "attempt_id": "attempt_id_prefix_idx",
        "args_hash": "attempt_args_hash16_idx",
    }[field]
    assert f"Scan using {index}" in plan or f"Index Scan on {index}" in plan, plan
    assert "Index Cond" in plan, plan


def test_a_long_args_hash_prefix_is_checked_past_the_indexed_characters(world, clients):
    """The index keeps an args hash's first HASH_PREFIX characters: a longer term is a range
    of those, then the rest is checked on each row, so a term that differs only after them
    finds nothing, and the whole hash finds its attempt."""
    from attempts.models.attempts import HASH_PREFIX

    target = make_unknown(world)
    make_unknown(world)
    whole = target.args_hash
    assert ids_in(clients.viewer.get("/queues/all/", {"q": whole})) == [target.attempt_id]
    longer = whole[: HASH_PREFIX + 4]
    assert ids_in(clients.viewer.get("/queues/all/", {"q": longer})) == [target.attempt_id]
    tail = "0" if whole[HASH_PREFIX] != "0" else "1"
    wrong = whole[:HASH_PREFIX] + tail
    assert ids_in(clients.viewer.get("/queues/all/", {"q": wrong})) == []


def test_the_args_hash_prefix_search_reads_its_index(world):
    """On both databases: SQLite uses an index on an expression only for the same expression,
    so the search must read the hash's first characters exactly as the index keeps them."""
    make_unknown(world)
    lane = Attempt.objects.prefix_search("abcd", "args_hash").order_by("search_key").values("id")
    sql, params = lane.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql, params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = " | ".join(str(row[-1]) for row in cursor.fetchall())
    assert "attempt_args_hash16_idx" in plan, plan


def test_a_broad_prefix_with_more_matches_than_counted_exactly_is_estimated(
    world, clients, monkeypatch
):
    # Past COUNT_CAP matches PostgreSQL estimates the total from each lane's plan; a lane no
    # field can match (a key prefix is never an args hash) has no plan and is left out.
    monkeypatch.setattr(planner, "QUEUE_COUNT_CAP", 2)
    for _ in range(4):
        make_attempt(world, tool="charge_card")
    response = clients.viewer.get("/queues/all/", {"q": "acme:charge"})
    assert response.status_code == 200
    page = response.context["page"]
    assert len(page.rows) == 4 and page.total >= 2


def test_a_person_in_no_tenant_finds_nothing_by_prefix(world, clients):
    """No tenant, no lane: the search reads nothing and answers an empty page (an empty
    scope is not a query PostgreSQL can run as a filter)."""
    from django.contrib.auth import get_user_model

    make_unknown(world, key="acme:lonely:1")
    loner = get_user_model().objects.create_user("loner", password=PASSWORD)
    with CaptureQueriesContext(connection) as queries:
        response = login(loner).get("/queues/all/", {"q": "acme:lonely"})
    assert response.status_code == 200
    page = response.context["page"]
    assert page.rows == [] and page.total == 0 and page.total_exact
    assert not [q for q in queries.captured_queries if '"in_scope"' in q["sql"]]


def test_a_broad_prefix_reads_a_bounded_part_of_its_range(world, clients, monkeypatch):
    """A prefix search reads at most PREFIX_SCAN entries of each identifier's range, so a
    broad prefix whose matches are rare in a narrow state costs a bounded read. What lies past
    them is said: the total is a lower bound (what the walk found), and the page says the
    search was cut."""
    monkeypatch.setattr(planner, "PREFIX_SCAN", 3)
    early = [make_attempt(world, key=f"acme:bulk:{n}") for n in range(4)]  # not UNKNOWN
    late = make_unknown(world, key="acme:bulk:9")  # past the first three keys
    with CaptureQueriesContext(connection) as queries:
        response = clients.viewer.get("/queues/unknown/", {"q": "acme:bulk"})
    page = response.context["page"]
    # What the walk found is all that is known: a lower bound, not an estimate, on both.
    assert page.rows == [] and page.search_cut and not page.total_exact and page.total_at_least
    body = response.content.decode()
    assert 'data-testid="search-cut"' in body
    assert "at least 0 attempts" in body
    assert late.attempt_id not in body
    # Each lane's range is read in its index's order, at most PREFIX_SCAN + 1 entries of it.
    walks = [q["sql"] for q in queries.captured_queries if 'LIMIT 4) AS "walk"' in q["sql"]]
    assert len(walks) == len(planner.PREFIX_FIELDS) - 1, walks  # no hash starts "acme:"

    # A range within the bound is read whole: exact, not cut.
    monkeypatch.setattr(planner, "PREFIX_SCAN", 10)
    page = clients.viewer.get("/queues/unknown/", {"q": "acme:bulk"}).context["page"]
    assert [row["attempt_id"] for row in page.rows] == [late.attempt_id]
    assert page.total == 1 and page.total_exact and not page.search_cut
    # Every state: the matches among the first PREFIX_SCAN + 1 keys, in key order.
    monkeypatch.setattr(planner, "PREFIX_SCAN", 2)
    page = clients.viewer.get("/queues/all/", {"q": "acme:bulk"}).context["page"]
    assert {row["attempt_id"] for row in page.rows} == {a.attempt_id for a in early[:3]}
    assert page.search_cut and not page.total_exact and page.total_at_least
    assert page.total == 3


def test_a_queue_page_reads_the_tools_display_hints_once(world, clients):
    """The rows' arguments are read for tools that declare an amount, and the money tag shows
    them: both from one read of the display hints per request."""
    from attempts.models import Tool

    Tool.objects.filter(name="charge_card").update(amount_arg="amount", currency="EUR")
    make_unknown(world, tool="charge_card", args={"amount": 1250})
    with CaptureQueriesContext(connection) as queries:
        response = clients.viewer.get("/queues/unknown/")
    assert 'data-testid="money"' in response.content.decode()
    hints = [q for q in queries.captured_queries if '"amount_arg"' in q["sql"]]
    assert len(hints) == 1, [q["sql"] for q in hints]
