"""The client as a package: ``pip install ./ledgerweb_client`` in a fresh virtualenv without
Django, and the README's example run as is against a live server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ledgerweb_client
from attempts.models import AgentToken, Attempt
from tests.conftest import REPO, pip_install

CLIENT = REPO / "ledgerweb_client"
# The Pythons the client supports (ledgerweb_client/pyproject.toml), oldest first.
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def test_the_client_is_versioned_with_the_api() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["version"] == ledgerweb_client.__version__
    assert project.get("dependencies", []) == []  # standard library only
    api = json.loads((REPO / "docs" / "openapi.json").read_text())["info"]["version"]
    assert project["version"].split(".")[:2] == api.split(".")[:2]


def test_the_client_supports_python_3_10_and_its_extras_take_ranges() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={SUPPORTED[0]}"
    classified = {
        c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if re.search(r":: 3\.\d+$", c)
    }
    assert classified == set(SUPPORTED)
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            # An exact pin would fight the user's own environment: a floor and a ceiling.
            spec = requirement.split(";")[0]
            assert "==" not in spec and ">=" in spec, f"{extra}: {requirement}"


def find_python(version: str) -> Path | None:
    """An interpreter of this MAJOR.MINOR: pyenv's versions first (its root from PYENV_ROOT,
    ``pyenv root`` or ~/.pyenv), then ``pythonX.Y`` on PATH; checked by running it."""
    roots = [os.environ.get("PYENV_ROOT", "")]
    if pyenv := shutil.which("pyenv"):
        found = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        roots.append(found.stdout.strip())
    roots.append(str(Path.home() / ".pyenv"))
    candidates = []
    for root in filter(None, roots):
        builds = sorted(
            Path(root, "versions").glob(f"{version}.*/bin/python3"),
            key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)],
        )
        candidates.extend(reversed(builds))
    if on_path := shutil.which(f"python{version}"):
        candidates.append(Path(on_path))
    for candidate in candidates:
        ran = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    return None


def readme_client_example() -> str:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    examples = [block for block in blocks if "from ledgerweb_client import" in block]
    assert len(examples) == 1, "the README has one client example"
    return examples[0]


# Checks what differs between Python versions: StrEnum's str() and format() (a backport on
# 3.10), an async guarded tool (asyncio), an exception note (none on 3.10), and that the installed
# modules without extras import.
VERSION_SMOKE = """
import asyncio, os, sys
import ledgerweb_client
import ledgerweb_client.integrations
from ledgerweb_client import LedgerClient, State
from ledgerweb_client.integrations import ledgered, use_ledger

assert str(State.UNKNOWN) == f"{State.UNKNOWN}" == "UNKNOWN" == State.UNKNOWN


@ledgered(tool_name="update_crm", key="crm:{tenant}:{args.contact}", receipt=True)
async def update_crm(contact: str) -> dict:
    return {"updated": contact}


async def main() -> dict:
    return await update_crm("c-%d%d" % sys.version_info[:2])


with LedgerClient(os.environ["LEDGERWEB_URL"], os.environ["LEDGERWEB_TOKEN"]) as client:
    with use_ledger(client, tenant="acme", task_id="smoke"):
        print(asyncio.run(main())["updated"])
    try:
        with client.attempt(
            tenant="acme", task_id="smoke", tool_name="open_ticket",
            idempotency_key="smoke:timeout", args={"n": 1},
        ) as call:
            client.close()
            client._port = 9  # nothing listens there: the ledger is gone when the outcome is due
            raise TimeoutError("provider timed out")
    except TimeoutError as exc:
        print(len(getattr(exc, "__notes__", [])))
"""


def fresh_venv(python: Path, path: Path) -> Path:
    """A venv of that interpreter, with the pip it bundles (pip's cache is shared between runs)."""
    made = subprocess.run(
        [python, "-m", "venv", "--clear", path], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return path / "bin" / "python"


@pytest.mark.slow
@pytest.mark.one_database  # packaging does not depend on the database
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("version", SUPPORTED)
def test_the_client_installs_and_runs_on_each_supported_python(
    version, world, live_server, tmp_path
) -> None:
    """``pip install ./ledgerweb_client`` (the standard-library package, no extras) in a fresh
    venv of each supported Python, without Django, then the README's example and a smoke run
    against a live server."""
    interpreter = find_python(version)
    if interpreter is None:
        pytest.skip(
            f"no Python {version} here (looked in pyenv's versions and for python{version} on "
            "PATH): install it (pyenv install) to test the client on it"
        )
    python = fresh_venv(interpreter, tmp_path / "venv")
    source = tmp_path / "src" / "ledgerweb_client"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PYTHON"))}
    pip_install(python, "./ledgerweb_client", cwd=source.parent, env=env, timeout=300)
    outside = tmp_path / "agent"
    outside.mkdir()
    no_django = subprocess.run(
        [python, "-c", "import django"], cwd=outside, env=env, capture_output=True, text=True
    )
    assert no_django.returncode != 0 and "No module named 'django'" in no_django.stderr

    _, token = AgentToken.issue(f"readme-agent-{version}", ["acme"])
    example = outside / "example.py"
    example.write_text(readme_client_example())
    env.update(LEDGERWEB_URL=live_server.url, LEDGERWEB_TOKEN=token)
    done = subprocess.run(
        [python, str(example)], cwd=outside, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    attempt_id, state = done.stdout.split()
    assert state == "OUTCOME_CONFIRMED"
    stored = Attempt.objects.get(attempt_id=attempt_id)
    assert (stored.tool_name, stored.result_ref) == ("send_invoice_email", "receipt:msg-7")

    smoke = outside / "smoke.py"
    smoke.write_text(VERSION_SMOKE)
    ran = subprocess.run(
        [python, str(smoke)], cwd=outside, env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    contact = "c-" + version.replace(".", "")
    assert ran.stdout.split() == [contact, "1"]
    assert Attempt.objects.get(tool_name="update_crm").state == "OUTCOME_CONFIRMED"
    assert Attempt.objects.get(idempotency_key="smoke:timeout").state == "DISPATCHED"

    # The installed copy, not the checkout's, ran, on the Python asked for.
    where = subprocess.run(
        [
            python,
            "-c",
            "import sys, ledgerweb_client as c; print(c.__file__, c.__version__, sys.version)",
        ],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
    )
    assert str(tmp_path / "venv") in where.stdout and ledgerweb_client.__version__ in where.stdout
    assert sys.prefix not in where.stdout
    assert where.stdout.split()[2].startswith(version + ".")
