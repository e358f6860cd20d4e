"""The TypeScript client (clients/typescript) against the real API on 127.0.0.1: pytest starts the
server, ``npm test`` runs the client's own tests (Node's built-in runner) with its URL and a
token, and the ledger is checked afterwards for what the client should have recorded. What those
tests need beyond the ordinary world (an approval policy) they apply themselves, through
``manage.py ledger_config apply`` on this test's database, as they would against any server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from attempts.models import ApprovalPolicy, Attempt, State
from tests.api.conftest import Tokens
from tests.conftest import REPO, child_env

# The client's behaviour does not depend on the database: one pass runs it.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_database]

CLIENT = REPO / "clients" / "typescript"


def npm() -> str:
    found = shutil.which("npm")
    if found is None or not (CLIENT / "node_modules").is_dir():
        pytest.fail("the TypeScript client needs Node.js 20 and npm; run scripts/setup (npm ci)")
    return found


def test_typescript_client_against_the_live_api(live_server, tokens: Tokens) -> None:
    assert not ApprovalPolicy.objects.exists()
    env = child_env(
        LEDGERWEB_URL=live_server.url,
        LEDGERWEB_TOKEN=tokens.acme,
        LEDGERWEB_MANAGE=f"{sys.executable} {REPO / 'manage.py'}",
        LEDGERWEB_KEY_PREFIX="ts",
        NO_COLOR="1",
    )
    done = subprocess.run(
        [npm(), "test", "--silent"],
        cwd=CLIENT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# skipped 0" in done.stdout, done.stdout[-2000:]

    states = dict(Attempt.objects.values_list("idempotency_key", "state"))
    assert states["ts:charge:1"] == State.OUTCOME_CONFIRMED
    assert states["ts:unknown:ProviderTimeout"] == State.UNKNOWN
    assert states["ts:unknown:ProviderLostResponse"] == State.UNKNOWN
    assert states["ts:no-receipt"] == State.DISPATCHED
    assert states["ts:refused"] == State.FAILED
    assert states["ts:retryable"] == State.FAILED_RETRYABLE
    assert states["ts:crash"] == State.UNKNOWN
    assert states["ts:held"] == State.AWAITING_APPROVAL
    held = Attempt.objects.get(idempotency_key="ts:held")
    assert held.approval_policy.name == "ts-held-charges"
    confirmed = Attempt.objects.get(idempotency_key="ts:charge:1")
    assert (confirmed.send_count, confirmed.result_ref) == (1, "ch_ts_1")
    assert "globex" not in set(Attempt.objects.values_list("tenant_id", flat=True))


def test_the_documented_typescript_example_runs(live_server, tokens: Tokens, tmp_path) -> None:
    """The example of docs/integrations-stripe-ts.md, compiled against the built client (installed
    as the package ``ledgerweb-client``) and run against the live server."""
    text = (REPO / "docs" / "integrations-stripe-ts.md").read_text()
    [example] = [block.split("```", 1)[0] for block in text.split("```ts\n")[1:]]
    built = subprocess.run([npm(), "run", "build"], cwd=CLIENT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    modules = tmp_path / "node_modules"
    modules.mkdir()
    (modules / "ledgerweb-client").symlink_to(CLIENT)
    (modules / "@types").symlink_to(CLIENT / "node_modules" / "@types")
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "example.ts").write_text(example)
    node = shutil.which("node") or "node"
    tsc = CLIENT / "node_modules" / "typescript" / "bin" / "tsc"
    options = ["--strict", "--target", "es2022", "--module", "nodenext", "--skipLibCheck"]
    compiled = subprocess.run(
        [node, str(tsc), *options, "--types", "node", "example.ts"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    env = {**os.environ, "LEDGERWEB_URL": live_server.url, "LEDGERWEB_TOKEN": tokens.acme}
    ran = subprocess.run(
        [node, "example.js"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "OUTCOME_CONFIRMED true"
    attempt = Attempt.objects.get(idempotency_key="order:1001:charge")
    assert attempt.result_ref == f"receipt:{attempt.attempt_id}"
