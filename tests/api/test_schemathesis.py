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
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import Tokens
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BIN = Path(sys.executable).parent


def test_schemathesis_finds_nothing(gunicorn: str, tokens: Tokens, tmp_path: Path) -> None:
    seconds = os.environ.get("LEDGERWEB_SCHEMATHESIS_SECONDS", "30")
    command = [
        BIN / "schemathesis",
        "run",
        f"{gunicorn}/api/v1/openapi.json",
        "--url",
        f"{gunicorn}/api/v1",
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
