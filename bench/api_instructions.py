"""Instructions per intent through the agent API, and per request of the minimal Django JSON
view, counted by callgrind: repeatable on a busy machine, where bench/api.py's rates are not.

    .venv/bin/python bench/api_instructions.py [--calls 100 300]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]

Sets up a fresh database as bench/api.py does (SQLite in ``var/bench/``; with --postgres, a
scratch database ``bench_api_instructions`` on that server), then runs this script under
``valgrind --tool=callgrind`` once per path and number of calls: each run sends its calls
through Django's WSGI application in process (the middleware, the view, the database; no HTTP
server), after 30 calls of warm-up. The difference between the two runs of a path, divided by
the difference in calls, is that path's instructions per request: start-up cancels out. Counts
the server process only (PostgreSQL's own work is in its backend, as in bench/api.py's CPU).
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
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.api import scratch_postgres, seeded_ledger  # noqa: E402

PATHS = {"minimal view": "/bench/echo", "intent": "/api/v1/attempts"}
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


def instructions(path: str, calls: int, token: str, env: dict, out: Path) -> int:
    """The instructions callgrind counted for one run of ``drive``."""
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--drive",
            path,
            str(calls),
            token,
        ],
        env=env,
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    match = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(match[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, nargs=2, default=[100, 300], help="calls of the two runs per path"
    )
    parser.add_argument("--postgres", metavar="URL", help="bench a scratch database there")
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
    data.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="bench.api_settings",
        LEDGERWEB_DATA_DIR=str(data),
        PYTHONPATH=str(REPO),
    )
    if options.postgres:
        env["DATABASE_URL"] = scratch_postgres(options.postgres, "bench_api_instructions")
    token = seeded_ledger(env)

    fewer, more = options.calls
    per_request = {}
    for name, path in PATHS.items():
        counts = [
            instructions(path, calls, token, env, data / f"callgrind.{name[0]}.{calls}")
            for calls in (fewer, more)
        ]
        per_request[name] = (counts[1] - counts[0]) / (more - fewer)
    database = "postgresql" if options.postgres else "sqlite"
    print(f"database: {database}; runs of {fewer} and {more} calls per path (callgrind)")
    for name, count in per_request.items():
        print(f"  {name:<13} {count / 1e6:6.2f}M instructions per request")
    view, intent = per_request["minimal view"], per_request["intent"]
    print(f"intent / minimal view: {intent / view:.2f}x the instructions")
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
