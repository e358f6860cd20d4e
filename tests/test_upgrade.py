"""Upgrading from a release: each release's code (its commit, RELEASES.toml, taken out of git
into a temporary folder) makes a ledger with its own ``migrate`` and some writes through its
agent API, seals a checkpoint; then the checkout's code migrates that ledger and
``verify_audit`` checks it, the kept checkpoint hash included. Every release is an upgrade
path: the newest (what the next release upgrades from) and the older ones an operator may still
run. On the database the suite runs on: SQLite (a file) or PostgreSQL (a database of its
own)."""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from tests.conftest import REPO

pytestmark = pytest.mark.slow

RELEASES = tomllib.loads((REPO / "RELEASES.toml").read_text())["release"]

# Runs inside the previous release's tree (first on sys.path): its migrate, its demo world, then
# attempts in every resting state through its HTTP API, and a checkpoint. Prints what it made.
SEED = r"""
import json, os, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerweb.settings")
django.setup()
from django.core.management import call_command
from django.test import Client

import attempts
from attempts import chain
from attempts.models import AgentToken, Attempt, AttemptEvent

call_command("migrate", interactive=False, verbosity=0)
call_command("seed_demo", provider_url="http://127.0.0.1:9", password="upgrade-pass-1", verbosity=0)
_, token = AgentToken.issue("upgrade-agent", ["acme"])
api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")


def post(path, body=None):
    answer = api.post(path, json.dumps(body or {}), content_type="application/json")
    assert answer.status_code in (200, 201, 202), (path, answer.status_code, answer.content)
    return answer.json()


tools = [t["name"] for t in json.loads(sys.argv[1])]
for n, tool in enumerate(tools * 2):
    made = post("/api/v1/attempts", {
        "tenant": "acme", "task_id": f"upgrade-{n}", "tool_name": tool,
        "idempotency_key": f"upgrade:{tool}:{n}", "args": {"n": n, "note": "before the upgrade"},
    })
    attempt = made["attempt"] if "attempt" in made else made
    attempt_id = attempt["attempt_id"]
    if n % 5 == 0 or attempt["state"] == "AWAITING_APPROVAL":
        continue  # stays INTENT_RECORDED (or held, from 0.2.0 on)
    post(f"/api/v1/attempts/{attempt_id}/dispatch")
    post(f"/api/v1/attempts/{attempt_id}/provider-request", {"provider_request_id": f"prv-{n}"})
    if n % 5 == 1:
        post(f"/api/v1/attempts/{attempt_id}/confirm", {"result_ref": f"receipt-{n}"})
    elif n % 5 == 2:
        post(f"/api/v1/attempts/{attempt_id}/fail", {"reason": "refused", "retryable": n % 2 == 0})
    elif n % 5 == 3:
        post(f"/api/v1/attempts/{attempt_id}/unknown", {"reason": "timed out"})
checkpoint = chain.seal()
print(json.dumps({
    "code": attempts.__file__,
    "attempts": Attempt.objects.count(),
    "events": AttemptEvent.objects.count(),
    "states": sorted(set(Attempt.objects.values_list("state", flat=True))),
    "checkpoint": checkpoint.hash,
}))
"""


@pytest.fixture(params=RELEASES, ids=[f"from-{r['version']}" for r in RELEASES])
def release(request) -> dict:
    return request.param


@pytest.fixture
def previous_tree(tmp_path: Path, release: dict) -> Path:
    commit = release["commit"]
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(
            f"release {release['version']}'s commit {commit[:12]} (RELEASES.toml) is not in this "
            "clone: a shallow clone? git fetch --unshallow, or fetch that commit"
        )
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=REPO, capture_output=True, timeout=120
    )
    assert archive.returncode == 0, archive.stderr.decode()
    tree = tmp_path / f"ledgerweb-{release['version']}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


@pytest.fixture
def database(tmp_path: Path):
    """Environment for both codes' processes: a data folder and a database of their own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_URL", "LEDGERWEB_", "PYTHON", "DJANGO"))
    }
    env["LEDGERWEB_DATA_DIR"] = str(tmp_path / "data")
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        yield env
        return
    import psycopg

    name = f"ledgerweb_upgrade_{secrets.token_hex(4)}"
    parts = urlsplit(os.environ["DATABASE_URL"])
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    try:
        yield env
    finally:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args[1:3]}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_a_ledger_of_the_previous_release_migrates_and_verifies(previous_tree, database) -> None:
    old_env = {**database, "PYTHONPATH": str(previous_tree)}
    demo = tomllib.loads((previous_tree / "reconciliation" / "demo.toml").read_text())
    tools = [{"name": tool["name"]} for tool in demo["tools"]]
    seed = previous_tree / "upgrade_seed.py"
    seed.write_text(SEED)
    made = json.loads(
        run([sys.executable, str(seed), json.dumps(tools)], previous_tree, old_env)
        .stdout.strip()
        .splitlines()[-1]
    )
    # The previous release's code made it, not the checkout's.
    assert made["code"].startswith(str(previous_tree))
    assert {"INTENT_RECORDED", "OUTCOME_CONFIRMED", "UNKNOWN", "DISPATCHED"} <= set(made["states"])

    manage = [sys.executable, str(REPO / "manage.py")]
    run([*manage, "migrate", "--no-input"], REPO, database)
    run([*manage, "migrate", "--check"], REPO, database)  # nothing left unapplied
    # Every history table still refuses changes (the migrations alone guard them).
    checked = run([*manage, "check", "--database", "default"], REPO, database)
    assert "attempts.E003" not in checked.stdout + checked.stderr
    verified = run([*manage, "verify_audit", "--expect-head", made["checkpoint"]], REPO, database)
    assert made["checkpoint"] in verified.stdout, verified.stdout

    # The rows are all there, and today's code reads them.
    counted = run(
        [
            *manage,
            "shell",
            "-c",
            "from attempts.models import Attempt, AttemptEvent, RecordedKey; "
            "print(Attempt.objects.count(), AttemptEvent.objects.count(), "
            "RecordedKey.objects.filter(args_hash__gt='').count())",
        ],
        REPO,
        database,
    )
    # The upgrade filled the permanent key index: every attempt's key, with its args hash.
    assert counted.stdout.split()[-3:] == [str(made[n]) for n in ("attempts", "events", "attempts")]
