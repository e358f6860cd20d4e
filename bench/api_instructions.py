"""Instructions per intent through the agent API, and per request of the minimal Django JSON
view, counted by callgrind: repeatable on a busy machine, where bench/api.py's rates are not.

    .venv/bin/python bench/api_instructions.py [--calls 100 300] [--by-function 40]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]

Sets up a fresh database as bench/api.py does (SQLite in ``var/bench/``; with --postgres, a
scratch database ``bench_api_instructions`` on that server), then runs this script under
``valgrind --tool=callgrind`` once per path and number of calls, each run on a copy of that
same ledger (the data folder copied; on PostgreSQL a database made from it as a template) and
with one hash seed, so both runs of a path start alike (SQLite's WAL checkpoints). Each
run sends its calls through Django's WSGI application in process (the middleware, the view, the
database; no HTTP server), after 30 calls of warm-up. The difference between the two runs of a
path, divided by the difference in calls, is that path's instructions per request: start-up
cancels out. Counts the server process only (PostgreSQL's own work is in its backend, as in
bench/api.py's CPU).

``--by-function N`` adds two runs of intents under ``python -X perf``: each Python function then
runs through a trampoline of its own, named in ``/tmp/perf-<pid>.map``, which names callgrind's
``???:0x...`` entries; the N functions with the most instructions per intent (inclusive, from
``callgrind_annotate``) are printed. The trampolines add a few percent to those figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.api import scratch_postgres, seeded_ledger  # noqa: E402

PATHS = {"minimal view": "/bench/echo", "intent": "/api/v1/attempts"}
DATABASE = "bench_api_instructions"
WARM_UP = 30


def drive(path: str, calls: int, token: str) -> None:
    """Send ``WARM_UP`` and then ``calls`` POSTs to ``path`` through the WSGI application."""
    sys.path.insert(0, str(REPO))
    from ledgerweb.wsgi import application

    tag = uuid.uuid4().hex[:8]
    for n in range(WARM_UP + calls):
        body = json.dumps(
            {
                "tenant": "acme",
                "task_id": f"bench-{tag}",
                "tool_name": "open_ticket",
                "idempotency_key": f"bench:{tag}:{n}",
                "args": {"title": "Printer on fire", "priority": 2, "n": n},
            }
        ).encode()
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8000",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": f"Bearer {token}",
            "REMOTE_ADDR": "127.0.0.1",
            "wsgi.input": io.BytesIO(body),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        status: list[str] = []
        answer = application(environ, lambda s, headers, exc_info=None, got=status: got.append(s))
        content = b"".join(answer)
        answer.close()
        if not status[0].startswith("201"):
            raise SystemExit(f"{path} answered {status[0]}: {content[:200]!r}")


def instructions(
    path: str, calls: int, token: str, env: dict, out: Path, *, perf: bool = False
) -> int:
    """The instructions callgrind counted for one run of ``drive``; with ``perf``, under
    ``python -X perf``, its Python functions named in ``out`` (``name_functions``)."""
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    command += ["-X", "perf"] if perf else []
    run = subprocess.Popen(
        [*command, __file__, "--drive", path, str(calls), token],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if run.wait() != 0:
        raise SystemExit(f"{path}: the run of {calls} calls failed")
    text = out.read_text()
    if perf:  # valgrind runs the program in its own process: the map is named by that pid
        text = name_functions(text, Path(f"/tmp/perf-{run.pid}.map"))
        out.write_text(text)
    match = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(match[1])


def name_functions(text: str, perf_map: Path) -> str:
    """callgrind's output ``text`` with each perf trampoline's address replaced by the name of
    its Python function (``py::function:file``, from ``perf_map``)."""
    prefixes = [f"{sysconfig.get_paths()[kind]}/" for kind in ("purelib", "stdlib")]
    names = {}
    for line in perf_map.read_text().splitlines():
        address, _, name = line.split(" ", 2)
        for prefix in (*prefixes, f"{REPO}/"):
            name = name.replace(prefix, "")
        names[int(address, 16)] = name.replace(" ", "_")
    perf_map.unlink()

    def named(match: re.Match) -> str:
        return names.get(int(match[1], 16), match[0])

    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines):
        if line.startswith(("fn=", "cfn=")) and "0x" in line:
            lines[n] = re.sub(r"0x([0-9a-f]{16})", named, line)
    return "".join(lines)


def by_function(fewer: Path, more: Path, calls: int, top: int) -> list[tuple[float, str]]:
    """The ``top`` Python functions by inclusive instructions per call: ``more``'s run minus
    ``fewer``'s, divided by ``calls`` (their difference in calls)."""

    def inclusive(out: Path) -> dict[str, int]:
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found: dict[str, int] = {}
        for count, name in re.findall(r"^\s*([\d,]+) \([^)]*\)\s+\?\?\?:(py::\S+)", report, re.M):
            found[name] = found.get(name, 0) + int(count.replace(",", ""))
        return found

    before, after = inclusive(fewer), inclusive(more)
    # Recursive calls (callgrind's name') are counted in their first call; the driver is this
    # script.
    rows = [
        ((after[name] - before.get(name, 0)) / calls, name)
        for name in after
        if not re.search(r"'\d+$", name) and "bench/api_instructions.py" not in name
    ]
    return sorted(rows, reverse=True)[:top]


def fresh_copy(seed: Path, run: Path, env: dict, postgres: str | None) -> dict:
    """The environment of one run, on a copy of the seeded ledger."""
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(seed, run)
    # One hash seed for every run: the layout of dicts and sets, and so their collisions, move
    # a count by thousands of instructions from one seed to the next.
    copy = dict(env, LEDGERWEB_DATA_DIR=str(run), PYTHONHASHSEED="0")
    if postgres:
        copy["DATABASE_URL"] = scratch_postgres(postgres, f"{DATABASE}_run", template=DATABASE)
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, nargs=2, default=[100, 300], help="calls of the two runs per path"
    )
    parser.add_argument("--postgres", metavar="URL", help="bench a scratch database there")
    parser.add_argument(
        "--by-function", type=int, default=0, metavar="N", help="the top N Python functions"
    )
    parser.add_argument("--drive", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.drive:
        path, calls, token = options.drive
        drive(path, int(calls), token)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")

    data = REPO / "var" / "bench" / f"instructions-{os.getpid()}"
    shutil.rmtree(data, ignore_errors=True)
    seed = data / "seed"
    seed.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.api_settings",
        LEDGERWEB_DATA_DIR=str(seed),
        PYTHONPATH=str(REPO),
    )
    if options.postgres:
        env["DATABASE_URL"] = scratch_postgres(options.postgres, DATABASE)
    token = seeded_ledger(env)

    fewer, more = options.calls
    per_request = {}
    runs = [(name, path, False) for name, path in PATHS.items()]
    if options.by_function:
        runs.append(("intent", PATHS["intent"], True))
    outs: dict[int, Path] = {}
    for name, path, perf in runs:
        counts = []
        for calls in (fewer, more):
            run_env = fresh_copy(seed, data / "run", env, options.postgres)
            outs[calls] = data / f"callgrind.{name[0]}{'.perf' if perf else ''}.{calls}"
            counts.append(instructions(path, calls, token, run_env, outs[calls], perf=perf))
        if not perf:
            per_request[name] = (counts[1] - counts[0]) / (more - fewer)
    database = "postgresql" if options.postgres else "sqlite"
    print(f"database: {database}; runs of {fewer} and {more} calls per path (callgrind)")
    for name, count in per_request.items():
        print(f"  {name:<13} {count:11,.0f} instructions per request ({count / 1e6:.2f}M)")
    view, intent = per_request["minimal view"], per_request["intent"]
    print(f"intent / minimal view: {intent / view:.2f}x the instructions")
    if options.by_function:
        print("per intent, inclusive, by Python function (python -X perf):")
        for count, function in by_function(
            outs[fewer], outs[more], more - fewer, options.by_function
        ):
            print(f"  {count:10,.0f}  {function}")
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
