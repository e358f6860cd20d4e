#!/usr/bin/env python3
"""Profile one system of bench/pg_peers.py in one process: client CPU per call, and where it
goes function by function (cProfile with a CPU-time timer, after one warm-up call).

    .venv/bin/python bench/pg_peers.py --seconds 1 --rounds 1 --procs 1 \\
        --systems ledger,raw1 --database-prefix <p>          # prepares <p>_ledger, <p>_raw1
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<p>_ledger \\
        .venv/bin/python bench/profile_write_path.py ledger --calls 1000 [--sort cumulative]
    ... --no-profile                                         # CPU per call without the profiler

Drop the <p>_* databases afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.pg_peers as peers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=("ledger", "raw", "raw1"))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument("--filter", default="", help="only functions whose path matches this")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()

    def profiled(call, prefix: str, start_at: float, seconds: float) -> int:
        call(-1)  # warm: connections, prepared statements, imports
        profile = cProfile.Profile(time.process_time)
        cpu, wall = time.process_time(), time.perf_counter()
        if not args.no_profile:
            profile.enable()
        for i in range(args.calls):
            call(i)
        profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"{args.system}: {args.calls} calls, client CPU {cpu / args.calls * 1e3:.3f} ms/call,"
            f" wall {wall / args.calls * 1e3:.3f} ms/call"
            + (" (profiler off)" if args.no_profile else " (under the profiler)")
        )
        if not args.no_profile:
            stats = pstats.Stats(profile, stream=sys.stdout).sort_stats(args.sort)
            stats.print_stats(args.filter, args.top)
        return args.calls

    peers._timed = profiled
    peers.WORKERS[args.system](f"profile{int(time.time())}", 0.0, 0.0)


if __name__ == "__main__":
    main()
