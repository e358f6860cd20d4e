"""The suite in shards: each database's run split into parts that run side by side.

Much of the suite waits (on processes it starts, on a browser, on a database's clock): one run
per database left the machine's cores partly idle. ``scripts/test`` starts ``N`` runs per
database instead (``LEDGERWEB_TEST_SHARDS``, 2 by default), each with its own data folder and
its own test database, and each keeps the test files this module gives it
(``LEDGERWEB_TEST_SHARD=K/N``). The first shard also runs the crash gate (the cases scripts/test
runs after a suite): it starts the deal with the gate's seconds, so it gets less of the suite.

Files, not tests, are dealt out, so a module's fixtures are built once. The deal is the longest
first to the least loaded shard, by the seconds each file took in a recorded run
(``tests/shard_weights.json``); a file not recorded there counts as ``DEFAULT_SECONDS``.

Recording the weights again (after tests were added or made faster)::

    LEDGERWEB_TEST_TIMES=var/test-times scripts/test
    .venv/bin/python tests/shards.py merge var/test-times > tests/shard_weights.json

The same recording also holds each file's processor seconds (this process's and its children's),
which the deal does not use: the shards share the machine's cores, so work a file saves makes
every shard faster, and a file that only waits costs its own shard alone.
``tests/shards.py report var/test-times`` lists the files by processor seconds, beside their
seconds.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sys
from collections import defaultdict
from pathlib import Path

WEIGHTS = Path(__file__).with_name("shard_weights.json")
TESTS = Path(__file__).resolve().parent
DEFAULT_SECONDS = 5.0
GATE = "<crash gate>"


def database() -> str:
    return "postgres" if os.environ.get("DATABASE_URL") else "sqlite"


def weights(kind: str) -> dict[str, float]:
    try:
        recorded = json.loads(WEIGHTS.read_text())
    except FileNotFoundError:
        return {}
    return {name: float(seconds) for name, seconds in recorded.get(kind, {}).items()}


def deal(files: list[str], count: int, kind: str, *, gate: bool) -> dict[str, int]:
    """Each file's shard, from 1 to ``count``; with ``gate``, shard 1 starts with the crash
    gate's seconds. A file recorded in the other database's pass only (its tests run there
    alone: browser, one_database) weighs nothing here; one recorded in neither (new) weighs
    ``DEFAULT_SECONDS``."""
    known = weights(kind)
    elsewhere = weights("postgres" if kind == "sqlite" else "sqlite")

    def seconds(name: str) -> float:
        return known.get(name, 0.0 if name in elsewhere else DEFAULT_SECONDS)

    load = [0.0] * count
    if gate:
        load[0] = known.get(GATE, 0.0)
    dealt = {}
    for name in sorted(set(files), key=lambda name: (-seconds(name), name)):
        lightest = min(range(count), key=lambda shard: (load[shard], shard))
        load[lightest] += seconds(name)
        dealt[name] = lightest + 1
    return dealt


@functools.cache
def _suite(count: int, kind: str, gate: bool) -> dict[str, int]:
    """The deal of every test file of the suite (``tests/**/test_*.py``, named as in node
    ids), made before collection so that a shard never imports another's files."""
    files = [str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*.py")]
    return deal(files, count, kind, gate=gate)


def _gate() -> bool:
    return os.environ.get("LEDGERWEB_CRASH_GATE") == "1"


def elsewhere(path: Path, value: str) -> bool:
    """Whether the test file at ``path`` is another shard's (it is then not collected at all:
    collecting the whole suite costs every shard processor time it need not spend)."""
    shard, count = parse(value)
    try:
        name = str(path.resolve().relative_to(TESTS.parent))
    except ValueError:
        return False
    dealt = _suite(count, database(), _gate())
    return name in dealt and dealt[name] != shard


def parse(value: str) -> tuple[int, int]:
    """``K/N`` with 1 <= K <= N, or a ValueError that says what was given."""
    try:
        shard, count = (int(part) for part in value.split("/"))
    except ValueError:
        raise ValueError(f"LEDGERWEB_TEST_SHARD must be K/N (like 1/2), not {value!r}") from None
    if not 1 <= shard <= count:
        raise ValueError(f"LEDGERWEB_TEST_SHARD {value!r}: K must be from 1 to N")
    return shard, count


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def keep(items: list, value: str) -> tuple[list, list]:
    """The items of this shard's files, and the rest: the suite's deal (``elsewhere`` left the
    other shards' files uncollected), and for a file outside it, shard 1."""
    shard, count = parse(value)
    dealt = _suite(count, database(), _gate())
    mine, others = [], []
    for item in items:
        (mine if dealt.get(file_of(item.nodeid), 1) == shard else others).append(item)
    return mine, others


def cpu_seconds() -> float:
    """Processor seconds (user and system) of this process and of its children that ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Timer:
    """Seconds per test file (setup, call and teardown) of this run, and the processor seconds
    they took (a child's count when it ends), written as JSON at the end of the session to
    ``LEDGERWEB_TEST_TIMES/<database>-<shard>.json``."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.cpu_at_start = 0.0

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.cpu_at_start = cpu_seconds()

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.cpu[file_of(nodeid)] += cpu_seconds() - self.cpu_at_start

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        shard = os.environ.get("LEDGERWEB_TEST_SHARD", "1/1").replace("/", "of")
        out = self.folder / f"{database()}-{shard}.json"
        table = {
            "seconds": dict(sorted(self.seconds.items())),
            "cpu": dict(sorted(self.cpu.items())),
        }
        out.write_text(json.dumps(table, indent=1))


def recorded(folder: Path, table: str) -> dict[str, dict[str, float]]:
    """One of a recorded run's tables (``seconds`` or ``cpu``) per database, its shards'
    files together."""
    merged: dict[str, dict[str, float]] = {"sqlite": {}, "postgres": {}}
    for path in sorted(folder.glob("*.json")):
        kind = path.name.split("-", 1)[0]
        for name, seconds in json.loads(path.read_text())[table].items():
            merged[kind][name] = round(merged[kind].get(name, 0.0) + seconds, 1)
    return merged


def merge(folder: Path) -> dict[str, dict[str, float]]:
    """One weights table from a recorded run's files; the crash gate's seconds come from
    ``gate-<database>.txt`` where scripts/test wrote them."""
    merged = recorded(folder, "seconds")
    for kind in merged:
        gate = folder / f"gate-{kind}.txt"
        if gate.exists():
            merged[kind][GATE] = round(float(gate.read_text().strip()), 1)
    return merged


def report(folder: Path) -> str:
    """A recorded run's files, most processor seconds first: per database, its processor
    seconds and its seconds, then the totals."""
    seconds, cpu = recorded(folder, "seconds"), recorded(folder, "cpu")
    names = sorted(
        set(seconds["sqlite"]) | set(seconds["postgres"]),
        key=lambda name: (-cpu["sqlite"].get(name, 0.0) - cpu["postgres"].get(name, 0.0), name),
    )
    lines = [f"{'sqlite cpu':>10} {'seconds':>8} {'pg cpu':>8} {'seconds':>8}  file"]
    for name in [*names, "total"]:
        row = []
        for kind in ("sqlite", "postgres"):
            if name == "total":
                row += [sum(cpu[kind].values()), sum(seconds[kind].values())]
            else:
                row += [cpu[kind].get(name, 0.0), seconds[kind].get(name, 0.0)]
        lines.append(f"{row[0]:10.1f} {row[1]:8.1f} {row[2]:8.1f} {row[3]:8.1f}  {name}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("merge", "report"):
        folder = Path(argv[1])
        if not folder.is_dir():
            print(f"shards: {folder} is not a folder of recorded times", file=sys.stderr)
            return 2
        if argv[0] == "merge":
            print(json.dumps(merge(folder), indent=1, sort_keys=True))
        else:
            print(report(folder))
        return 0
    print(
        "usage: tests/shards.py merge FOLDER  (weights from a recorded run, as JSON)\n"
        "       tests/shards.py report FOLDER  (its files by processor seconds)"
    )
    return 0 if argv in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
