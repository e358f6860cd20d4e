"""Each extra of the client makes its modules importable with nothing but the extra installed
(ledgerweb_client/pyproject.toml, ``[tool.ledgerweb-client.extras]``), and the core needs the
standard library alone.

Checked here without installing anything, on this Python: every import a module runs when it is
imported (its top-level import statements, following the client's own modules) is the standard
library, the client, or a distribution the extra's requirements bring (their dependencies as
installed here). Imports inside functions, ``if`` and ``try`` blocks are deliberate (lazy, or for
one Python) and are left to ``scripts/check-client-extras``, which pip-installs each extra on
Python 3.10-3.13 and imports its modules (minutes: not in the suite).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

# Does not depend on the database: one pass runs it.
pytestmark = pytest.mark.one_database("postgres")

CLIENT = REPO / "ledgerweb_client"
PROJECT = tomllib.loads((CLIENT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PROJECT["project"]["optional-dependencies"]
PURPOSES: dict[str, dict[str, object]] = PROJECT["tool"]["ledgerweb-client"]["extras"]
# The client's own modules that every extra builds on: standard library only.
CORE = ["ledgerweb_client", "ledgerweb_client.integrations", "ledgerweb_client.mcp_gateway"]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements bring, with their dependencies as installed here
    (markers evaluated for this Python; a requirement's own extras followed)."""
    found: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = _name(requirement.name)
        extras = {""} | set(requirement.extras)
        if name in found and not requirement.extras:
            continue
        found.add(name)
        try:
            needs = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend((Requirement(need), e) for need in needs for e in extras)
    return found


@cache
def _distributions() -> dict[str, set[str]]:
    return {
        module: {_name(d) for d in dists}
        for module, dists in importlib.metadata.packages_distributions().items()
    }


def top_level_imports(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for each import statement at the top of ``module``'s file,
    relative ones made absolute."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            out.append((base, node.lineno))
            base_spec = importlib.util.find_spec(base) if node.level else None
            if base_spec is not None and base_spec.submodule_search_locations:
                # ``from . import x``: x may be a module of the client's package.
                for alias in node.names:
                    if importlib.util.find_spec(f"{base}.{alias.name}") is not None:
                        out.append((f"{base}.{alias.name}", node.lineno))
    return out


def foreign_imports(modules: list[str], allowed: set[str]) -> list[str]:
    """The imports, run when ``modules`` are imported, of anything but the standard library,
    the client and the ``allowed`` distributions."""
    problems = []
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported, line in top_level_imports(module):
            top = imported.partition(".")[0]
            if top == "ledgerweb_client":
                todo.append(imported)
            elif top == "__future__" or top in sys.stdlib_module_names:
                continue
            elif not _distributions().get(top, set()) & allowed:
                owners = ", ".join(sorted(_distributions().get(top, {"nothing installed"})))
                problems.append(f"{module} line {line}: import {imported} ({owners})")
    return problems


def test_every_extra_says_what_it_is_for() -> None:
    assert set(PURPOSES) == set(EXTRAS)
    for extra, purpose in PURPOSES.items():
        assert purpose["python"] in ("3.10", "3.11", "3.12", "3.13"), extra
        assert purpose["modules"], extra


def test_the_core_imports_the_standard_library_alone() -> None:
    assert foreign_imports(CORE, set()) == []


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_an_extras_modules_import_only_what_it_installs(extra: str) -> None:
    for requirement in map(Requirement, EXTRAS[extra]):
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            try:
                importlib.metadata.version(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                pytest.skip(f"{requirement.name} is not installed here (the test extra has it)")
    allowed = closure(EXTRAS[extra])
    ours = [m for m in PURPOSES[extra]["modules"] if m.startswith("ledgerweb_client")]
    assert foreign_imports(ours, allowed) == []
