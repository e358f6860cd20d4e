#!/usr/bin/env python
"""Benchmark: what synchronous replication costs the write path.

One tool call is four durable commits (record the intent, claim the dispatch, attach the
provider request id, confirm: attempts.ledger, as bench/write_path.py runs them). This bench
makes a private PostgreSQL primary and streaming standby on this machine (bench/failover.py's
pair) and runs the same calls, one after another, in alternating rounds:

- local: ``synchronous_standby_names`` empty, so a commit waits for the primary's own disk only
  (what ``synchronous_commit=on`` means without a synchronous standby; the standby is asynchronous);
- synchronous: the standby named, so each commit also waits for the standby to have it on disk
  (``on``; the ledger's sessions' default, LEDGERWEB_PG_SYNCHRONOUS_COMMIT).

It prints the median milliseconds per tool call of each and their ratio. The standby is on the
same machine (loopback): over a network add a round trip per commit.

    .venv/bin/python bench/sync_commit.py [--calls 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.failover import STANDBY_NAME, Pair  # noqa: E402
from bench.write_path import api_calls  # noqa: E402


def synchronous(pair: Pair, on: bool) -> None:
    names = f"'{STANDBY_NAME}'" if on else "''"
    pair.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
    pair.primary.sql("SELECT pg_reload_conf()")
    want = "sync" if on else "async"
    deadline = time.monotonic() + 30
    while pair.primary.sql("SELECT sync_state FROM pg_stat_replication") != want:
        if time.monotonic() > deadline:
            raise SystemExit(f"the standby did not become {want}")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="tool calls per round (300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each, alternating (2)")
    options = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ledgerweb-synccommit-"))
    pair = Pair(root)
    try:
        pair.add_standby(synchronous=False)
        os.environ["DJANGO_SETTINGS_MODULE"] = "ledgerweb.settings"
        os.environ["DATABASE_URL"] = pair.url
        os.environ["LEDGERWEB_DATA_DIR"] = str(root)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from attempts.models import EffectClass, Grant, Tenant, Tool

        tenant = Tenant.objects.create(slug="acme", name="Acme")
        tool = Tool.objects.create(name="update_crm", effect_class=EffectClass.IDEMPOTENT)
        Grant.objects.create(tenant=tenant, tool=tool, policy_version="v1", allowed_scopes=["crm"])
        api_calls(50, "warm")
        times: dict[str, list[float]] = {"local": [], "synchronous": []}
        for r in range(options.rounds):
            for mode in ("local", "synchronous"):
                synchronous(pair, mode == "synchronous")
                seconds = api_calls(options.calls, f"{mode}-{r}")
                times[mode].append(seconds / options.calls * 1000)
                print(f"round {r + 1} {mode:12} {times[mode][-1]:.2f} ms per tool call", flush=True)
        local = statistics.median(times["local"])
        sync = statistics.median(times["synchronous"])
        print(f"median: local {local:.2f} ms, synchronous standby {sync:.2f} ms per tool call")
        print(f"ratio: {sync / local:.2f}x (+{sync - local:.2f} ms per call, 4 commits)")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
