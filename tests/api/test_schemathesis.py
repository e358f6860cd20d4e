"""An outside schema fuzzer against the live API: schemathesis (all checks, stateful links) runs
against gunicorn serving the test database on 127.0.0.1, and finds nothing.

The OpenAPI document must then say exactly what the server accepts: every schema-valid request
is answered with a success or an authority refusal (never 422), every schema-violating one is
refused, no answer is a 500, and every answer matches its documented schema. The run lasts
LEDGERWEB_SCHEMATHESIS_SECONDS (default 30); its seed is printed on failure, and
LEDGERWEB_SCHEMATHESIS_SEED replays one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.api.conftest import Tokens
from tests.conftest import REPO, child_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(tokens: Tokens, tmp_path: Path):
    port = free_port()
    env = child_env(
        LEDGERWEB_BIND=f"127.0.0.1:{port}",
        LEDGERWEB_WORKERS="2",
        LEDGERWEB_THREADS="2",
        LEDGERWEB_ACCESS_LOG=str(tmp_path / "access.log"),
        LEDGERWEB_DATA_DIR=str(tmp_path),
        LEDGERWEB_LOG_LEVEL="WARNING",
    )
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [BIN / "gunicorn", "-c", "ledgerweb/gunicorn.conf.py", "ledgerweb.wsgi"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=2).read()  # noqa: S310
            break
        except OSError:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    yield base
    os.killpg(process.pid, 15)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()


def test_schemathesis_finds_nothing(server: str, tokens: Tokens, tmp_path: Path) -> None:
    seconds = os.environ.get("LEDGERWEB_SCHEMATHESIS_SECONDS", "30")
    command = [
        BIN / "schemathesis",
        "run",
        f"{server}/api/v1/openapi.json",
        "--url",
        f"{server}/api/v1",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--header",
        f"Authorization: Bearer {tokens.both}",
        "--max-time",
        seconds,
        "--workers",
        "2",
        "--request-timeout",
        "30",
    ]
    if os.environ.get("LEDGERWEB_SCHEMATHESIS_SEED"):
        command += ["--seed", os.environ["LEDGERWEB_SCHEMATHESIS_SEED"]]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
            "LEDGERWEB_FUZZ_TENANTS": "acme,globex",
            "LEDGERWEB_FUZZ_TOOLS": "update_crm,open_ticket,send_invoice_email,charge_card",
            "NO_COLOR": "1",
        },
        capture_output=True,
        text=True,
        timeout=int(seconds) + 240,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert "Stateful" in done.stdout
    assert " 0 covered /" not in done.stdout, "no API link was followed"
