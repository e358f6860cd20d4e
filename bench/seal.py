#!/usr/bin/env python3
"""Benchmark: whether the sealer and the transparency log keep up with the write path.

    .venv/bin/python bench/seal.py [--attempts 2000] [--postgres]

In one run, on a scratch ledger (var/bench/seal.sqlite3, or a scratch PostgreSQL database that is
dropped afterwards), with a signing key in a scratch folder:

  writes    the agent's write path: record_intent for ``--attempts`` attempts (one transaction
            and one event each); the baseline, in attempts per second;
  seal      the sealer over all of them: leaves appended to the log, stored subtree hashes,
            the checkpoint and its note, then the signature (attempts/log.py); leaves per second;
  proofs    inclusion proofs read from the stored hashes, per second, at that log size.

It prints each figure and the ratio seal/writes: above 1, sealing keeps up with writing; sealing
runs in the worker, never on the agent's path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scratch import one_tool_agent, record, scratch_ledger  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--postgres", action="store_true", help="run on a scratch PostgreSQL DB")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="lw-bench-seal-")
    key = Path(folder) / "log.key"
    os.environ["LEDGERWEB_TLOG_KEY_FILE"] = str(key)
    with scratch_ledger("seal", postgres=args.postgres):
        subprocess.run(
            [sys.executable, "manage.py", "ledger_log", "genkey", "--out", str(key)],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        run(args)


def run(args: argparse.Namespace) -> None:
    agent = one_tool_agent()
    from django.db import connection

    from attempts import chain, log

    began = time.perf_counter()
    for n in range(args.attempts):
        record(agent, f"seal:{n}", n)
    writes = args.attempts / (time.perf_counter() - began)

    began = time.perf_counter()
    checkpoints = 0
    while chain.seal() is not None:
        checkpoints += 1
    sealed = time.perf_counter() - began
    newest = log.newest_signed()
    assert newest is not None and newest.size == args.attempts, "the sealer left work"
    seal_rate = args.attempts / sealed

    count = min(500, args.attempts)
    began = time.perf_counter()
    for index in range(0, args.attempts, max(1, args.attempts // count)):
        log.inclusion_proof(index, newest.size)
    proofs = count / (time.perf_counter() - began)

    print(f"database: {connection.vendor}; {args.attempts} attempts, {checkpoints} checkpoints")
    print(f"writes (record_intent, baseline): {writes:,.0f} attempts/s")
    print(f"seal (log append + checkpoint + signature): {seal_rate:,.0f} leaves/s")
    print(f"proofs (inclusion, from stored hashes): {proofs:,.0f} /s at size {newest.size}")
    print(f"ratio seal/writes: {seal_rate / writes:.1f}")


if __name__ == "__main__":
    main()
