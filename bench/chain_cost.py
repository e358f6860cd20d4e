#!/usr/bin/env python3
"""Benchmark: what the audit chain costs on the write path.

    .venv/bin/python bench/chain_cost.py [--ops 300] [--postgres]

One operation is the agent's safe order without the provider: record_intent + claim_dispatch +
confirm (three write transactions, three history events). The same run measures, interleaved in
rounds so machine load hits both alike:

  chain     as shipped: each event hashes its RFC 8785 encoding with the attempt's chain head
            (which the compare-and-set already carries: no extra read, no lock);
  no-chain  the same writes with the hashing removed (a random hash in its place).

It runs on a scratch ledger (var/bench/chain.sqlite3, or a scratch PostgreSQL database that is
dropped afterwards) and prints operations per second, the cost per event and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scratch import one_tool_agent, record, scratch_ledger  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=300, help="operations per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help="run on a scratch PostgreSQL DB")
    args = parser.parse_args()
    with scratch_ledger("chain", postgres=args.postgres):
        run(args)


def run(args: argparse.Namespace) -> None:
    agent = one_tool_agent()
    from django.db import connection
    from django.utils import timezone

    from attempts import chain, ledger

    hashed = chain.event_hash

    def unhashed(row, *, dumps=None):
        """The chain step removed: no canonical encoding (``dumps`` unused), no SHA-256."""
        return uuid.uuid4().hex * 2

    variants = {"chain": hashed, "no-chain": unhashed}
    per_round = max(1, args.ops // args.rounds)
    timings: dict[str, list[float]] = {name: [] for name in variants}
    counter = 0
    for _ in range(args.rounds):
        for name, hasher in variants.items():
            chain.event_hash = hasher
            try:
                began = time.perf_counter()
                for _ in range(per_round):
                    counter += 1
                    attempt, _ = record(agent, f"bench:{counter}", counter)
                    attempt, _ = ledger.claim_dispatch(attempt, actor=agent)
                    ledger.confirm(attempt, result_ref=f"r{counter}", actor=agent)
                timings[name].append((time.perf_counter() - began) / per_round)
            finally:
                chain.event_hash = hashed

    # The hashing alone, for scale.
    sample = {
        "v": 2,
        "attempt_id": "att_01M8N6VA35YVMWWK1G02AGKY6Y",
        "action": "attempt.outcome_confirmed",
        "actor_kind": "agent",
        "actor": "bench",
        "from_state": "DISPATCHED",
        "to_state": "OUTCOME_CONFIRMED",
        "reason": "",
        "details": {"result_ref": "r1", "review_reason": ""},
        "created_at": timezone.now(),
        "prev_hash": "0" * 64,
    }
    began = time.perf_counter()
    for _ in range(2000):
        hashed(sample)
    hash_us = (time.perf_counter() - began) / 2000 * 1e6

    db = connection.vendor
    print(
        f"database: {db} ({'synchronous=FULL WAL' if db == 'sqlite' else 'synchronous_commit=on'})"
    )
    print(
        f"{args.rounds} rounds x {per_round} operations per variant, interleaved; "
        "1 op = record_intent + claim_dispatch + confirm (3 transactions, 3 events)"
    )
    base = statistics.median(timings["no-chain"])
    for name, values in timings.items():
        per_op = statistics.median(values)
        print(
            f"  {name:9} {1 / per_op:8.1f} ops/s  {per_op * 1e3:7.2f} ms/op  "
            f"({per_op / base:.3f}x no-chain)"
        )
    chain = statistics.median(timings["chain"])
    print(
        f"chain cost: {(chain - base) / 3 * 1e6:.0f} us per event "
        f"({(chain / base - 1) * 100:+.1f}% per operation); "
        f"RFC 8785 + SHA-256 alone: {hash_us:.0f} us per event"
    )


if __name__ == "__main__":
    main()
