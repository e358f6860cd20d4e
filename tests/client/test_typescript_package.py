"""The TypeScript client as a package: a copy of its tracked sources (no dist/, no node_modules)
is ``npm install``-ed from its path into a scratch project outside the checkout, which builds it
(its ``prepare`` script); the project type-checks a program against the installed types with its
own TypeScript, runs it as ESM against a live server, and ``npm pack`` makes a publishable
tarball."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from attempts.models import AgentToken, Attempt
from attempts.models import State as ServerState
from tests.conftest import REPO

CLIENT = REPO / "clients" / "typescript"
PACKAGE = json.loads((CLIENT / "package.json").read_text())

# Exhaustive over the client's State: compiles only when `attempt.state` is the union of the
# protocol's states (a `string` would reach the `never` branch), AWAITING_APPROVAL among them.
CONSUMER = """
import { LedgerClient, STATES, TERMINAL_STATES, type Attempt, type State } from "ledgerweb-client";

function label(state: State): string {
  switch (state) {
    case "INTENT_RECORDED":
    case "AWAITING_APPROVAL":
    case "DISPATCHED":
    case "FAILED_RETRYABLE":
    case "UNKNOWN":
    case "MANUAL_REVIEW":
      return "open";
    case "OUTCOME_CONFIRMED":
    case "FAILED":
    case "RECONCILED":
      return "done";
    default: {
      const unreachable: never = state;
      return unreachable;
    }
  }
}

// @ts-expect-error: not a state of the protocol
const wrong: State = "SENT";
void wrong;
const held: State = "AWAITING_APPROVAL";

const ledger = new LedgerClient(process.env.LEDGERWEB_URL ?? "", process.env.LEDGERWEB_TOKEN ?? "");
const result = await ledger.call({
  tenant: "acme",
  task_id: "scratch",
  tool_name: "send_invoice_email",
  idempotency_key: "scratch:invoice:1",
  args: { to: "ap@acme.test" },
  send: async (attempt: Attempt) => ({ resultRef: `receipt:${attempt.attempt_id}` }),
});
const state: State = result.attempt.state;
console.log(state, label(state), result.sent, TERMINAL_STATES.has(state), STATES.includes(held));
"""


def npm() -> str:
    found = shutil.which("npm")
    if found is None:
        pytest.fail("the TypeScript client needs Node.js 20 and npm (.ci/run installs them)")
    return found


def run(args: list[str], cwd: Path, **extra) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, **extra)
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def tracked_copy(destination: Path) -> Path:
    """The client's files as a clone has them: tracked (or new, not ignored), nothing built."""
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "."], cwd=CLIENT
    )
    for name in filter(None, listed.stdout.split("\0")):
        source = CLIENT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    assert not (destination / "dist").exists() and not (destination / "node_modules").exists()
    return destination


def test_the_package_is_publishable_and_versioned_with_the_python_client() -> None:
    assert "private" not in PACKAGE
    assert PACKAGE["license"] == "Apache-2.0" and (CLIENT / "LICENSE").is_file()
    assert "Apache License" in (CLIENT / "LICENSE").read_text()
    python_client = tomllib.loads((REPO / "ledgerweb_client" / "pyproject.toml").read_text())
    assert PACKAGE["version"] == python_client["project"]["version"]
    api = json.loads((REPO / "docs" / "openapi.json").read_text())["info"]["version"]
    assert PACKAGE["version"].split(".")[:2] == api.split(".")[:2]
    assert PACKAGE["type"] == "module" and PACKAGE["scripts"]["prepare"]
    assert PACKAGE["exports"]["."]["types"].endswith(".d.ts")


def test_the_state_union_is_the_protocols_states() -> None:
    """The client's list holds every state the server has, and the approval hold (protocol
    sections 3 and 11) whether or not this server has it yet."""
    text = (CLIENT / "src" / "client.ts").read_text()
    block = text.split("export const STATES = [", 1)[1].split("] as const;", 1)[0]
    states = {line.strip().strip(",").strip('"') for line in block.splitlines() if line.strip()}
    assert states == set(ServerState.values) | {"AWAITING_APPROVAL"}


@pytest.mark.slow
@pytest.mark.one_database  # packaging does not depend on the database
@pytest.mark.django_db(transaction=True)
def test_installed_from_its_path_into_a_scratch_project(world, live_server, tmp_path) -> None:
    source = tracked_copy(tmp_path / "ledgerweb-client")
    project = tmp_path / "agent"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "scratch-agent", "private": True, "type": "module"})
    )
    dev = PACKAGE["devDependencies"]
    quiet = ["--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
    # The consumer's own TypeScript and Node types, the versions the client is built with.
    run(
        [
            npm(),
            "install",
            *quiet,
            str(source),
            f"typescript@{dev['typescript']}",
            f"@types/node@{dev['@types/node']}",
        ],
        cwd=project,
    )
    installed = project / "node_modules" / "ledgerweb-client"
    assert (installed / "dist" / "src" / "index.js").is_file(), "prepare did not build dist/"
    assert (installed / "dist" / "src" / "index.d.ts").is_file()

    (project / "agent.ts").write_text(CONSUMER)
    node = shutil.which("node") or "node"
    tsc = project / "node_modules" / "typescript" / "bin" / "tsc"
    # No skipLibCheck: the installed declarations are type-checked too.
    options = ["--strict", "--target", "es2022", "--module", "nodenext", "--types", "node"]
    run([node, str(tsc), *options, "agent.ts"], cwd=project)

    _, token = AgentToken.issue("scratch-agent", ["acme"])
    env = {**os.environ, "LEDGERWEB_URL": live_server.url, "LEDGERWEB_TOKEN": token}
    ran = run([node, "agent.js"], cwd=project, env=env)
    assert ran.stdout.split() == ["OUTCOME_CONFIRMED", "done", "true", "true", "true"]
    attempt = Attempt.objects.get(idempotency_key="scratch:invoice:1")
    assert attempt.result_ref == f"receipt:{attempt.attempt_id}"

    packed = run([npm(), "pack", "--dry-run", "--json", "--loglevel=error"], cwd=source)
    [manifest] = json.loads(packed.stdout)
    files = {entry["path"] for entry in manifest["files"]}
    assert {"LICENSE", "README.md", "package.json", "dist/src/index.js"} <= files
    assert {"dist/src/index.d.ts", "dist/src/openapi.d.ts"} <= files
    assert not any(name.startswith(("src/", "test/", "dist/test/")) for name in files)
    assert manifest["version"] == PACKAGE["version"]
