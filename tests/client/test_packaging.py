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
import venv
from pathlib import Path

import pytest
from django.db import connection

import ledgerweb_client
from attempts.models import AgentToken, Attempt
from tests.conftest import REPO

CLIENT = REPO / "ledgerweb_client"


def test_the_client_is_versioned_with_the_api() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["version"] == ledgerweb_client.__version__
    assert project.get("dependencies", []) == []  # standard library only
    api = json.loads((REPO / "docs" / "openapi.json").read_text())["info"]["version"]
    assert project["version"].split(".")[:2] == api.split(".")[:2]


def readme_client_example() -> str:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    examples = [block for block in blocks if "from ledgerweb_client import" in block]
    assert len(examples) == 1, "the README has one client example"
    return examples[0]


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_readme_example_runs_from_a_fresh_venv_without_django(
    world, live_server, tmp_path
) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("packaging does not depend on the database; the SQLite pass covers it")
    python = fresh_venv(tmp_path / "venv")
    source = tmp_path / "src" / "ledgerweb_client"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build"))
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "./ledgerweb_client",
        ],
        cwd=source.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    outside = tmp_path / "agent"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "PYTHON"))}
    no_django = subprocess.run(
        [python, "-c", "import django"], cwd=outside, env=env, capture_output=True, text=True
    )
    assert no_django.returncode != 0 and "No module named 'django'" in no_django.stderr

    _, token = AgentToken.issue("readme-agent", ["acme"])
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
    # The installed copy, not the checkout's, ran the example.
    where = subprocess.run(
        [python, "-c", "import ledgerweb_client as c; print(c.__file__, c.__version__)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
    )
    assert str(tmp_path / "venv") in where.stdout and ledgerweb_client.__version__ in where.stdout
    assert sys.prefix not in where.stdout
