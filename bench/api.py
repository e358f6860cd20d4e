"""Benchmark: intents recorded per second through the agent API, against a minimal Django JSON
view, both served by the same gunicorn configuration in the same run.

    .venv/bin/python bench/api.py [--seconds 10] [--clients 4] [--workers 3] [--threads 4]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]

Starts gunicorn (``ledgerweb/gunicorn.conf.py``) on a free 127.0.0.1 port over a fresh database
(SQLite in ``var/bench/``; with --postgres, a scratch database ``bench_api`` made afresh on that
server), then alternates phases: the
baseline POSTs the same JSON body to ``/bench/echo`` (no database), the API phase POSTs
``/api/v1/attempts`` with a new idempotency key each time. Client processes each keep one
keep-alive connection, spread evenly over the workers (a phase whose connections share fewer
workers is bound by fewer interpreter locks; each round prints the cores each worker used).
Afterwards every 201 intent must be in the database (no lost intents)
and no request may have failed. Prints both rates and their ratio. The old 0.5 target is retired
(issue 12): PostgreSQL is where throughput scales; on SQLite the ratio must not fall below 0.25.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def durable_commit_ceiling(directory: Path, seconds: float = 3.0) -> float:
    """Commits per second one writer gets from raw sqlite3 (WAL, synchronous=FULL) here: every
    intent is one such commit under the ledger's single write lock, so this bounds the API."""
    import sqlite3

    path = directory / "ceiling.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (body) VALUES (?)", ("x" * 400,))
        db.execute("COMMIT")
        n += 1
    db.close()
    return n / seconds


def placed_connection(
    port: int, placed: Any, lock: Any, workers: int
) -> http.client.HTTPConnection:
    """A keep-alive connection to a gunicorn worker chosen so that the phase's connections are
    spread as evenly as they can be (``placed``: connections by worker pid so far, shared by the
    clients): no worker serves a second before each serves one. Which worker accepts a
    connection is chance: four connections over three workers landed on one worker at times,
    so a phase measured one interpreter lock and not three."""
    for _ in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/bench/worker")
        pid = json.loads(connection.getresponse().read())["pid"]
        with lock:
            if placed.get(pid, 0) <= sum(placed.values()) // workers:
                placed[pid] = placed.get(pid, 0) + 1
                return connection
        connection.close()
    return connection  # not placed after that many tries: go on with the last one


def client_loop(args: tuple) -> dict:
    """One client process: POST as fast as answers come back, for ``seconds``."""
    port, path, token, seconds, number, phase, placed, lock, workers = args
    connection = placed_connection(port, placed, lock, workers)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    ok = errors = 0
    created: list[str] = []
    failures: list[str] = []
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n += 1
        body = {
            "tenant": "acme",
            "task_id": f"bench-{phase}-{number}",
            "tool_name": "open_ticket",
            "idempotency_key": f"bench:{phase}:{number}:{n}",
            "args": {"title": "Printer on fire", "priority": 2, "n": n},
        }
        try:
            connection.request("POST", path, body=json.dumps(body), headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            errors += 1
            failures.append(repr(exc))
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        if response.status == 201:
            ok += 1
            if path.startswith("/api/"):
                created.append(json.loads(raw)["attempt"]["attempt_id"])
        else:
            errors += 1
            failures.append(f"{response.status} {raw[:200]!r}")
    connection.close()
    return {"ok": ok, "errors": errors, "created": created, "failures": failures[:5]}


def scratch_postgres(url: str, name: str = "bench_api", template: str = "") -> str:
    """Drop and create the database ``name`` on the server of ``url`` (a copy of the database
    ``template`` when given); returns its URL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(urlunsplit((*parts[:2], "/postgres", *parts[3:])), autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return urlunsplit((*parts[:2], f"/{name}", *parts[3:]))


def seeded_ledger(env: dict[str, str]) -> str:
    """Migrate the ledger of ``env``, seed the demo tenants and tools, and issue an agent token
    for acme: the token."""
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--no-input", "-v", "0"], env=env, check=True, cwd=REPO)
    subprocess.run(
        [*manage, "seed_demo", "--provider-url", "http://127.0.0.1:9", "--password", "bench-pw-1"],
        env=env,
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    return subprocess.run(
        [*manage, "create_agent_token", f"bench-{os.getpid()}", "--tenant", "acme", "--quiet"],
        env=env,
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()


def cpu_times() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine so far, from /proc/stat (0, 0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tree_cpu_seconds(root: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by ``root`` and each of its live descendants
    (the gunicorn master and its workers), by process id."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    seconds, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            ticks = int(stats[pid][11]) + int(stats[pid][12])
            seconds[pid] = ticks / os.sysconf("SC_CLK_TCK")
        todo.extend(children.get(pid, []))
    return seconds


def run_phase(
    port: int,
    path: str,
    token: str,
    seconds: float,
    clients: int,
    phase: str,
    server: int,
    workers: int,
) -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(clients) as pool:
        # Start the clients, then measure: spawning the pool is not part of either phase.
        pool.map(time.sleep, [0] * clients)
        placed, lock = manager.dict(), manager.Lock()
        busy_before, total_before = cpu_times()
        server_before = tree_cpu_seconds(server)
        started = time.monotonic()
        results = pool.map(
            client_loop,
            [(port, path, token, seconds, n, phase, placed, lock, workers) for n in range(clients)],
        )
        elapsed = time.monotonic() - started
        busy_after, total_after = cpu_times()
        server_after = tree_cpu_seconds(server)
    total = {
        "ok": sum(r["ok"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "created": [i for r in results for i in r["created"]],
        "failures": [f for r in results for f in r["failures"]][:5],
    }
    total["rate"] = total["ok"] / seconds
    total["elapsed"] = elapsed
    ticks = total_after - total_before
    total["cpu_busy"] = (busy_after - busy_before) / ticks if ticks else float("nan")
    used = {pid: cpu - server_before.get(pid, 0.0) for pid, cpu in server_after.items()}
    total["server_ms"] = sum(used.values()) * 1000 / max(total["ok"], 1)
    # How the phase landed on the workers: each client keeps one connection, and a phase whose
    # connections share fewer workers is bound by fewer interpreter locks.
    workers = sorted((cpu for pid, cpu in used.items() if pid != server), reverse=True)
    total["workers"] = "/".join(f"{cpu / elapsed:.2f}" for cpu in workers)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="baseline/API phase pairs")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client processes")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="a PostgreSQL server (any database URL on it): bench a fresh bench_api database there",
    )
    options = parser.parse_args()
    if options.postgres:
        os.environ["DATABASE_URL"] = scratch_postgres(options.postgres)

    data = REPO / "var" / "bench" / f"api-{os.getpid()}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    port = free_port()
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.api_settings",
        LEDGERWEB_DATA_DIR=str(data),
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS=str(options.workers),
        LEDGERWEB_THREADS=str(options.threads),
        LEDGERWEB_ACCESS_LOG=str(data / "access.log"),
        PYTHONPATH=str(REPO),
    )
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    python = sys.executable
    manage = [python, str(REPO / "manage.py")]
    token = seeded_ledger(env)
    subprocess.run(
        [*manage, "collectstatic", "--no-input", "-v", "0"], env=env, check=True, cwd=REPO
    )

    import django

    django.setup()
    from django.db import connection

    from attempts.models import Attempt

    gunicorn = subprocess.Popen(
        [
            str(Path(python).parent / "gunicorn"),
            "-c",
            "ledgerweb/gunicorn.conf.py",
            "ledgerweb.wsgi",
        ],
        env=env,
        cwd=REPO,
        stdout=open(data / "gunicorn.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or gunicorn.poll() is not None:
                    raise SystemExit(f"gunicorn did not start; see {data}/gunicorn.log") from None
                time.sleep(0.2)
        serving = (gunicorn.pid, options.workers)
        # Warm up every worker (imports, connections) before measuring.
        run_phase(port, "/bench/echo", token, 1.0, options.clients, "warm", *serving)
        run_phase(port, "/api/v1/attempts", token, 1.0, options.clients, "warm", *serving)
        warm = Attempt.objects.count()

        baseline, api, ceilings = [], [], []
        for round_number in range(options.rounds):
            (data / f"ceiling-{round_number}").mkdir()
            ceilings.append(durable_commit_ceiling(data / f"ceiling-{round_number}"))
            baseline.append(
                run_phase(
                    port,
                    "/bench/echo",
                    token,
                    options.seconds,
                    options.clients,
                    f"b{round_number}",
                    *serving,
                )
            )
            api.append(
                run_phase(
                    port,
                    "/api/v1/attempts",
                    token,
                    options.seconds,
                    options.clients,
                    f"a{round_number}",
                    *serving,
                )
            )
    finally:
        gunicorn.send_signal(signal.SIGTERM)
        gunicorn.wait(timeout=30)

    created = [i for phase in api for i in phase["created"]]
    stored = Attempt.objects.count() - warm
    found = (
        Attempt.objects.filter(attempt_id__in=created).count()
        if len(created) < 30000
        else sum(
            Attempt.objects.filter(attempt_id__in=created[i : i + 5000]).count()
            for i in range(0, len(created), 5000)
        )
    )
    errors = sum(p["errors"] for p in baseline + api)
    base_rate = sum(p["rate"] for p in baseline) / len(baseline)
    api_rate = sum(p["rate"] for p in api) / len(api)
    ratio = api_rate / base_rate if base_rate else 0.0
    ceiling = sum(ceilings) / len(ceilings)

    print(
        f"database: {connection.vendor}; gunicorn {options.workers} workers x "
        f"{options.threads} threads; {options.clients} keep-alive client processes; "
        f"{options.rounds} x {options.seconds:.0f}s per phase; cores: {os.cpu_count()}"
    )
    for n, (b, a) in enumerate(zip(baseline, api, strict=True)):
        print(
            f"  round {n + 1}: minimal JSON view {b['rate']:8.1f} req/s (CPU busy "
            f"{b['cpu_busy']:.0%})   intents {a['rate']:8.1f} /s (CPU busy {a['cpu_busy']:.0%})"
        )
        print(f"           cores used by each worker: view {b['workers']}, intents {a['workers']}")
    base_ms = sum(p["server_ms"] for p in baseline) / len(baseline)
    api_ms = sum(p["server_ms"] for p in api) / len(api)
    print(
        f"server CPU per request (gunicorn master and workers): minimal view "
        f"{base_ms:.2f} ms, intent {api_ms:.2f} ms"
    )
    print(f"minimal Django JSON view (baseline): {base_rate:8.1f} requests/s")
    print(f"POST /api/v1/attempts (intents):     {api_rate:8.1f} intents/s")
    floor = " (floor on SQLite: 0.25)" if connection.vendor == "sqlite" else ""
    print(f"ratio intents/baseline:              {ratio:8.2f}{floor}")
    print(
        "durable commit ceiling (raw sqlite3 WAL synchronous=FULL, one writer, same disk): "
        f"{ceiling:.1f} commits/s; intents reach {api_rate / ceiling:.0%} of it"
    )
    print(
        f"errors: {errors}; intents answered 201: {len(created)}; in the database: {found} "
        f"(rows added: {stored}); lost: {len(created) - found}"
    )
    for phase in baseline + api:
        for failure in phase["failures"]:
            print("  failure:", failure)
    ok = errors == 0 and found == len(created) == stored
    if connection.vendor == "sqlite":
        shutil.rmtree(data, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
