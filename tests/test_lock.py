"""The lock files (scripts/lock) pin the server's whole dependency tree with hashes, and agree
with pyproject.toml: every dependency pyproject.toml pins is locked at that version, nothing is
locked as a direct dependency that pyproject.toml no longer names, and every locked package has
a hash. The Dockerfile installs requirements.lock and scripts/setup requirements-test.lock, both
with pip's --require-hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCKS = {
    "requirements.lock": PROJECT["dependencies"],
    "requirements-test.lock": PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"],
}
DIRECT = "ledgerweb (pyproject.toml)"


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: list[str]) -> dict[str, str]:
    """name -> version of each ``name[extras]==version`` requirement."""
    found = {}
    for requirement in requirements:
        match = re.fullmatch(
            r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)\s*", requirement
        )
        assert match, f"pyproject.toml pins the server's dependencies exactly: {requirement!r}"
        found[normal(match[1])] = match[3]
    return found


def parse_lock(path: Path) -> dict[str, dict]:
    """Each locked package: its version, hashes and what it is there for."""
    packages: dict[str, dict] = {}
    current = None
    in_via = False
    for line in path.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line):
            current = packages.setdefault(
                normal(match[1]), {"version": match[2], "hashes": [], "via": []}
            )
            in_via = False
        elif current is not None and (match := re.match(r"^\s+--hash=(sha256:[0-9a-f]{64})", line)):
            current["hashes"].append(match[1])
        elif current is not None and (match := re.match(r"^\s+# via(?: (.+))?$", line)):
            in_via = True
            if match[1]:
                current["via"].append(match[1].strip())
        elif current is not None and in_via and (match := re.match(r"^\s+#\s+(.+)$", line)):
            current["via"].append(match[1].strip())
    return packages


def problems(path: Path, requirements: list[str]) -> list[str]:
    """What is wrong with the lock at ``path`` for these requirements (nothing: [])."""
    locked = parse_lock(path)
    wanted = pins(requirements)
    found = []
    for name, version in wanted.items():
        if locked.get(name, {}).get("version") != version:
            found.append(f"{name}=={version} is locked as {locked.get(name, {}).get('version')}")
    for name, entry in sorted(locked.items()):
        if DIRECT in entry["via"] and name not in wanted:
            found.append(f"{name} is locked, but pyproject.toml no longer names it")
        if not entry["hashes"]:
            found.append(f"{name} has no hash")
        if not entry["via"]:
            found.append(f"nothing needs {name}")
    return found


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_the_lock_pins_what_pyproject_pins_with_hashes(lock: str) -> None:
    found = problems(REPO / lock, LOCKS[lock])
    assert not found, f"{lock} is stale (run scripts/lock): {found}"


def test_a_lock_behind_pyproject_is_reported(tmp_path: Path) -> None:
    behind = tmp_path / "requirements.lock"
    text = (REPO / "requirements.lock").read_text()
    version = pins(PROJECT["dependencies"])["django"]
    behind.write_text(text.replace(f"\ndjango=={version} ", "\ndjango==0.0.1 "))
    assert problems(behind, PROJECT["dependencies"]) == [f"django=={version} is locked as 0.0.1"]
    dropped = tmp_path / "dropped.lock"
    dropped.write_text(text)
    assert problems(dropped, PROJECT["dependencies"][1:]) == [
        f"{normal(PROJECT['dependencies'][0].split('==')[0])} is locked, but pyproject.toml "
        "no longer names it"
    ]


def test_the_server_lock_and_the_test_lock_agree() -> None:
    server = parse_lock(REPO / "requirements.lock")
    test = parse_lock(REPO / "requirements-test.lock")
    differ = {
        name: (entry["version"], test.get(name, {}).get("version"))
        for name, entry in server.items()
        if test.get(name, {}).get("version") != entry["version"]
    }
    assert not differ, f"the two locks pin differently: {differ}; run scripts/lock"


def test_the_image_and_the_setup_install_from_the_locks_with_hashes() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY requirements.lock" in dockerfile
    assert "--require-hashes --no-deps -r requirements.lock" in dockerfile
    setup = (REPO / "scripts" / "setup").read_text()
    assert "--require-hashes --no-deps -r requirements-test.lock" in setup
    assert "requirements.lock" in (REPO / ".dockerignore").read_text()
