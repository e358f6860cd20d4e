"""Benchmark: the dashboard's queue, detail and overview pages against the Django admin's
changelist of the same model, on the same SQLite data, in the same run.

Fills a database (default var/bench/queues.sqlite3) first with 100,000 attempts, measures,
then grows it to 1,000,000 attempts (50,000 UNKNOWN, 10,000 MANUAL_REVIEW, five tenants) and
measures again. Each figure is the median server time (the full Django request cycle through the
test client: middleware, queries, template) over --repeat requests after two warm-up requests.

    .venv/bin/python bench/queues.py            # build (once) and measure
    .venv/bin/python bench/queues.py --rebuild  # start from an empty database

Targets (issue 5): queue pages under 50 ms median, at least 10x faster than the admin
changelist, and nearly flat from 100,000 to 1,000,000 rows. Issue 14 adds prefix searches
(``prefix_*``: keys, provider request ids, task ids, args hashes; narrow and broad prefixes),
held to the same 50 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.world import TENANTS, TOOLS, seed_world  # noqa: E402

# Share of each state in the data (the attention states are fixed counts, see fill()).
TERMINAL_MIX = [("OUTCOME_CONFIRMED", 0.90), ("FAILED", 0.07), ("RECONCILED", 0.03)]
SPAN_DAYS = 60


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", default=str(REPO / "var" / "bench"), help="where the databases live"
    )
    parser.add_argument("--small", type=int, default=100_000, help="rows at the first measurement")
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows at the second measurement"
    )
    parser.add_argument("--repeat", type=int, default=15, help="timed requests per page per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per size")
    parser.add_argument("--rebuild", action="store_true", help="delete the databases first")
    parser.add_argument("--stage", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


ARGS = parse_args()


def db_path(rows: int) -> str:
    return str(Path(ARGS.dir) / f"queues-{rows}.sqlite3")


# A child process (--stage N) measures one database; the parent only runs the children and
# compares (it sets Django up too, for the imports, but never queries).
os.environ.pop("DATABASE_URL", None)
os.environ["LEDGERWEB_SQLITE_PATH"] = db_path(ARGS.stage or ARGS.small)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from attempts import ledger  # noqa: E402
from attempts.models import Attempt, Membership, Role  # noqa: E402
from attempts.states import Actor  # noqa: E402


def attention_counts(total: int) -> tuple[int, int]:
    """UNKNOWN and MANUAL_REVIEW rows for a database of ``total`` rows (5% and 1%)."""
    return total * 5 // 100, total // 100


def setup_world() -> User:
    user = seed_world()
    for name in ("alice", "bob", "carol"):
        if not User.objects.filter(username=name).exists():
            person = User.objects.create_user(name, f"{name}@example.test", "pw-not-used-123456")
            for slug in TENANTS:
                Membership.objects.create(user=person, tenant_id=slug, role=Role.REVIEWER)
    return user


def fill(target: int, owners: list[int]) -> None:
    """Grow the attempts table to ``target`` rows with raw batched inserts (fast), keeping the
    attention states at 5% UNKNOWN and 1% MANUAL_REVIEW of the final size."""
    have = Attempt.objects.count()
    if have >= target:
        return
    want_unknown, want_review = attention_counts(target)
    have_unknown = Attempt.objects.filter(state="UNKNOWN").count()
    have_review = Attempt.objects.filter(state="MANUAL_REVIEW").count()
    n_new = target - have
    special = (
        ["UNKNOWN"] * (want_unknown - have_unknown)
        + ["MANUAL_REVIEW"] * (want_review - have_review)
        + ["DISPATCHED"] * (n_new // 500)
        + ["INTENT_RECORDED"] * (n_new // 1000)
    )
    rng = random.Random(target)
    states = special + [
        rng.choices([s for s, _ in TERMINAL_MIX], [w for _, w in TERMINAL_MIX])[0]
        for _ in range(n_new - len(special))
    ]
    rng.shuffle(states)
    now = timezone.now()
    start = now - dt.timedelta(days=SPAN_DAYS)
    # New rows are spread over the whole span, like an older ledger that has been imported.
    step = dt.timedelta(days=SPAN_DAYS) / n_new
    adapt = connection.ops.adapt_datetimefield_value
    columns = (
        "attempt_id, tenant_id, task_id, tool_name, args, args_hash, idempotency_key, state, "
        "version, provider_request_id, result_ref, policy_version, credential_scope, parent_id, "
        "owner_id, review_reason, awaiting_approval, send_count, lookup_count, next_check_at, "
        "lease_owner, lease_until, created_at, updated_at, chain_head, chain_length, sealed"
    )
    sql = f"INSERT INTO attempts_attempt ({columns}) VALUES ({', '.join(['%s'] * 27)})"  # noqa: S608
    batch: list[tuple] = []
    began = time.perf_counter()
    for i, state in enumerate(states):
        n = have + i
        created = start + step * i + dt.timedelta(microseconds=rng.randrange(1000))
        tenant = TENANTS[n % len(TENANTS)]
        tool = TOOLS[(n // 7) % len(TOOLS)]
        args = {"to": f"customer-{n}@example.test", "amount": n % 9973, "ref": f"inv-{n}"}
        attention = state in ("UNKNOWN", "MANUAL_REVIEW")
        owner = (
            owners[n % len(owners)] if attention and (n % 4 or state == "MANUAL_REVIEW") else None
        )
        batch.append(
            (
                f"att_bench{n:017d}",
                tenant,
                f"task-{n // 3}",
                tool,
                json.dumps(args),
                hashlib.sha256(str(n).encode()).hexdigest(),
                f"{tenant}:{tool}:{n}",
                state,
                3,
                f"req_{n:012d}" if state != "INTENT_RECORDED" else "",
                f"rcpt_{n}" if state == "OUTCOME_CONFIRMED" else "",
                "v1",
                '["write"]',
                None,
                owner,
                "payload_mismatch" if state == "MANUAL_REVIEW" else "",
                False,
                1,
                2 if attention else 0,
                adapt(now + dt.timedelta(minutes=5)) if state == "UNKNOWN" else None,
                "",
                None,
                adapt(created),
                adapt(created + dt.timedelta(seconds=3)),
                # Rows without history: no chain yet, nothing for the sealer to do.
                "",
                0,
                True,
            )
        )
        if len(batch) == 20_000:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.executemany(sql, batch)
            batch.clear()
    if batch:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(sql, batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"  filled {n_new:,} rows in {time.perf_counter() - began:.1f} s", flush=True)


def real_unknown_attempt() -> Attempt:
    """One attempt made through the ledger (with real history) for the detail page."""
    existing = Attempt.objects.filter(idempotency_key="bench:detail:1").first()
    if existing is not None:
        return existing
    agent = Actor.agent("bench-agent")
    attempt, _ = ledger.record_intent(
        tenant="north",
        task_id="bench-task",
        tool_name="open_ticket",
        idempotency_key="bench:detail:1",
        args={"subject": "Printer on fire", "api_key": "sk_live_secret", "priority": 1},
        actor=agent,
    )
    attempt, _ = ledger.claim_dispatch(attempt, actor=agent)
    attempt = ledger.attach_provider_request(attempt, "req_bench_detail", actor=agent)
    return ledger.mark_unknown(attempt, reason="timeout", actor=agent)


def measure(
    client: Client,
    url: str,
    repeat: int,
    *,
    clear_cache: bool = False,
    headers: dict[str, str] | None = None,
) -> list[float]:
    """Milliseconds per GET of url, ``repeat`` times (after two warm-up requests)."""
    for _ in range(2):
        response = client.get(url, headers=headers or {})
        assert response.status_code == 200, (url, response.status_code)
    samples = []
    for _ in range(repeat):
        if clear_cache:
            cache.clear()
        began = time.perf_counter()
        response = client.get(url, headers=headers or {})
        samples.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return samples


def deep_cursor() -> tuple[str, int]:
    """A cursor 80% of the way into the UNKNOWN queue (oldest first), and its position."""
    from attempts.views.queues import encode_cursor

    total = Attempt.objects.filter(state="UNKNOWN").count()
    position = int(total * 0.8)
    row = (
        Attempt.objects.filter(state="UNKNOWN")
        .order_by("created_at", "id")
        .values("created_at", "id")[position : position + 1]
        .get()
    )
    return encode_cursor(row["created_at"], row["id"]), position


def run_stage(label: str, client: Client, repeat: int) -> dict[str, list[float]]:
    total = Attempt.objects.count()
    unknown = Attempt.objects.filter(state="UNKNOWN").count()
    review = Attempt.objects.filter(state="MANUAL_REVIEW").count()
    print(f"\n== {label}: {total:,} attempts ({unknown:,} UNKNOWN, {review:,} MANUAL_REVIEW)")
    detail = real_unknown_attempt()
    cursor, position = deep_cursor()
    admin_deep_page = max(1, int(unknown * 0.8) // 100)
    pages = {
        "queue_first": "/queues/unknown/",
        "queue_deep": f"/queues/unknown/?after={cursor}",
        "queue_filtered": "/queues/unknown/?tenant=north&owner=unassigned&tool=open_ticket",
        "queue_search": f"/queues/all/?q={detail.provider_request_id}",
        # Prefix searches (issue 14): narrow and broad, on each identifier.
        "prefix_key": "/queues/all/?q=north:open_ticket:12",
        "prefix_request": "/queues/all/?q=req_0000001",
        "prefix_task": "/queues/all/?q=task-123",
        "prefix_hash": f"/queues/all/?q={hashlib.sha256(b'4242').hexdigest()[:8]}",
        "prefix_broad": "/queues/all/?q=north:send",
        "prefix_broad_unknown": "/queues/unknown/?q=south:",
        "queue_all": "/queues/all/",
        "queue_poll": "/queues/unknown/",  # the htmx fragment the page polls
        "detail": f"/attempts/{detail.attempt_id}/",
        "overview_warm": "/",
        "admin_first": "/admin/attempts/attempt/?state__exact=UNKNOWN",
        "admin_deep": f"/admin/attempts/attempt/?state__exact=UNKNOWN&p={admin_deep_page}",
    }
    results: dict[str, list[float]] = {}
    for name, url in pages.items():
        headers = {"HX-Request": "true"} if name == "queue_poll" else {}
        results[name] = measure(client, url, repeat, headers=headers)
    # A reviewer's own work (owner = me), as a person who owns some of it.
    alice = Client()
    alice.force_login(User.objects.get(username="alice"))
    results["queue_mine"] = measure(alice, "/queues/unknown/?owner=me", repeat)
    results["overview_cold"] = measure(client, "/", max(3, repeat // 3), clear_cache=True)
    print(
        f"  deep page = row {position:,} of the UNKNOWN queue; admin deep = page {admin_deep_page}"
    )
    return results


def stage_main(rows: int) -> None:
    """Child process: build (once) the database of ``rows`` attempts and measure it."""
    call_command("migrate", verbosity=0)
    user = setup_world()
    owners = list(
        User.objects.filter(username__in=["alice", "bob", "carol"]).values_list("pk", flat=True)
    )
    client = Client()
    client.force_login(user)
    plain_static = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    with override_settings(
        ALLOWED_HOSTS=["testserver"],
        STORAGES={**django.conf.settings.STORAGES, "staticfiles": plain_static},
        DEBUG=False,
    ):
        print(f"database: {db_path(rows)} (SQLite {connection.Database.sqlite_version})")
        fill(rows, owners)
        results = run_stage(f"{rows:,} rows", client, ARGS.repeat)
        results = {name: [round(v, 3) for v in values] for name, values in results.items()}
    print("RESULTS " + json.dumps(results), flush=True)


def report(label: str, samples: dict[str, list[float]]) -> dict[str, float]:
    """Print median and best time per page; return the medians."""
    medians = {name: statistics.median(values) for name, values in samples.items()}
    width = max(len(k) for k in samples)
    print(f"\n== {label}: median and best of {len(samples['queue_first'])} requests per page")
    for name, values in samples.items():
        print(f"  {name:<{width}}  {medians[name]:8.2f} ms median  {min(values):8.2f} ms best")
    print(
        f"  admin_first / queue_first = {medians['admin_first'] / medians['queue_first']:.1f}x;"
        f"  admin_deep / queue_deep = {medians['admin_deep'] / medians['queue_deep']:.1f}x"
    )
    return medians


def main() -> None:
    import subprocess

    Path(ARGS.dir).mkdir(parents=True, exist_ok=True)
    samples: dict[int, dict[str, list[float]]] = {ARGS.small: {}, ARGS.rows: {}}
    if ARGS.rebuild:
        for rows in samples:
            for suffix in ("", "-wal", "-shm"):
                Path(db_path(rows) + suffix).unlink(missing_ok=True)
    # Rounds alternate the two sizes, so load from other processes on the machine falls on
    # both alike; samples of all rounds are pooled per page.
    for round_no in range(ARGS.rounds):
        for rows in samples:
            print(f"-- round {round_no + 1}/{ARGS.rounds}: {rows:,} rows", flush=True)
            command = [sys.executable, __file__, "--dir", ARGS.dir, "--repeat",
                       str(ARGS.repeat), "--stage", str(rows)]  # fmt: skip
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                if line.startswith("RESULTS "):
                    for name, values in json.loads(line[len("RESULTS ") :]).items():
                        samples[rows].setdefault(name, []).extend(values)
                elif line.strip():
                    print("  " + line.strip(), flush=True)
    small = report(f"{ARGS.small:,} rows", samples[ARGS.small])
    large = report(f"{ARGS.rows:,} rows", samples[ARGS.rows])
    print(f"\n== growth ({ARGS.rows:,} / {ARGS.small:,} rows, medians); 1.00 is perfectly flat")
    for name in small:
        best_small, best_large = min(samples[ARGS.small][name]), min(samples[ARGS.rows][name])
        print(
            f"  {name:<15} {small[name]:8.2f} -> {large[name]:8.2f} ms  x{large[name] / small[name]:.2f}"
            f"   (best {best_small:7.2f} -> {best_large:7.2f} ms  x{best_large / best_small:.2f})"
        )
    prefix_pages = [name for name in large if name.startswith("prefix_")]
    worst_prefix = max(large[name] for name in prefix_pages)
    print(
        f"target at {ARGS.rows:,} rows: prefix searches < 50 ms median: "
        f"{'MET' if worst_prefix < 50 else 'NOT MET'} (slowest {worst_prefix:.1f} ms)"
    )
    worst = max(large["queue_first"], large["queue_deep"])
    ratio = min(
        large["admin_first"] / large["queue_first"], large["admin_deep"] / large["queue_deep"]
    )
    print(
        f"\ntarget at {ARGS.rows:,} rows: queue pages < 50 ms median: "
        f"{'MET' if worst < 50 else 'NOT MET'} (slowest {worst:.1f} ms); "
        f">= 10x faster than the admin changelist: {'MET' if ratio >= 10 else 'NOT MET'} "
        f"(smallest ratio {ratio:.1f}x)"
    )
    load = os.getloadavg()
    print(f"machine load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    if ARGS.stage:
        stage_main(ARGS.stage)
    else:
        main()
