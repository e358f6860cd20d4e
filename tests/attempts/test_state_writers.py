"""Only the state machine writes an attempt's ``state`` or ``version`` (architecture, "Arrows"):
a scan of the server's source for every way a module could write them around ``states.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("attempts", "reconciliation", "ledgerweb")
# The state machine, and the SQL it runs (rows.py is called by states.py for the write path).
WRITERS = {"attempts/states.py", "attempts/rows.py"}
FIELDS = {"state", "version"}
# A new attempt row has a state; an update may set it (``**fields`` may hide it).
CREATE_METHODS = {"create", "bulk_create", "get_or_create", "update_or_create"}
WRITE_METHODS = CREATE_METHODS | {"update", "bulk_update"}
# Receivers that have a ``state`` or ``version`` of their own, not an attempt's: the state
# machine's API, other models, a template context.
NOT_ATTEMPTS = {"states", "SlaEscalation", "TerminalDayCount", "ArchivedAttempt", "context"}
SQL = re.compile(
    r"INSERT\s+INTO\s+\W?attempts_attempt\b"
    r"|UPDATE\s+\W?attempts_attempt\W?\s+SET\b(?:(?!\bWHERE\b).)*\b(state|version)\b",
    re.IGNORECASE | re.DOTALL,
)


def _root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)
    return ""


def _call(node: ast.Call) -> str | None:
    """Why this call writes an attempt's state (None when it does not)."""
    func = node.func
    if isinstance(func, ast.Name):
        named = node.args[1:2] and _text(node.args[1]) in FIELDS
        return "setattr of state" if func.id == "setattr" and named else None
    if not isinstance(func, ast.Attribute):
        return None
    keywords = {k.arg for k in node.keywords}
    root = _root(func)
    if func.attr in CREATE_METHODS and root == "Attempt":
        return f"{ast.unparse(func)}(): an attempt made outside the state machine"
    if func.attr in WRITE_METHODS and root == "Attempt" and None in keywords:
        return f"{ast.unparse(func)}(**...): fields the state machine does not see"
    if func.attr in WRITE_METHODS and keywords & FIELDS and root not in NOT_ATTEMPTS:
        return f"{ast.unparse(func)}(state or version=...)"
    if func.attr == "save":
        for keyword in node.keywords:
            names = {_text(n) for n in ast.walk(keyword.value)}
            if keyword.arg == "update_fields" and names & FIELDS:
                return "save(update_fields=[state or version])"
    return None


def _assigned_then_saved(function: ast.AST) -> list[tuple[int, str]]:
    """``x.state = ...`` in a function that also saves ``x`` (or bulk-updates a list)."""
    assigned: dict[str, int] = {}
    saved: set[str] = set()
    bulk = False
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in FIELDS:
                assigned.setdefault(ast.unparse(target.value), node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "save":
                saved.add(ast.unparse(node.func.value))
            bulk = bulk or node.func.attr == "bulk_update"
    return [
        (line, f"{name}.state assigned, then saved")
        for name, line in assigned.items()
        if name in saved or bulk
    ]


def state_writes(source: str) -> list[tuple[int, str]]:
    """Each place in ``source`` that writes an attempt's state or version: (line, how)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (why := _call(node)):
            found.append((node.lineno, why))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _assigned_then_saved(node)
        if (match := SQL.search(_text(node))) is not None:
            found.append((node.lineno, f"SQL {' '.join(match.group(0).split()[:3])}"))
    return sorted(set(found))


def test_only_the_state_machine_writes_state() -> None:
    outside = [
        f"{name}:{line}: {why}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (name := path.relative_to(ROOT).as_posix()) not in WRITERS
        for line, why in state_writes(path.read_text())
    ]
    assert outside == []


def test_the_scan_sees_each_way_of_writing_state() -> None:
    """Each of these writes state around the state machine, and the scan says so."""
    writes = {
        "Attempt.objects.filter(pk=1).update(state='FAILED')",
        "qs = Attempt.objects.all()\nqs.update(version=F('version') + 1)",
        "Attempt.objects.create(**row, sealed=False)",
        "Attempt.objects.bulk_create(rows)",
        "Attempt.objects.filter(pk=1).update(**changes)",
        "def f(a):\n    a.state = 'FAILED'\n    a.save()",
        "def f(a):\n    a.version += 1\n    a.save(update_fields=['version'])",
        "a.save(update_fields=['state'])",
        "setattr(a, 'state', 'FAILED')",
        "cursor.execute('UPDATE attempts_attempt SET state = %s WHERE id = %s', [s, pk])",
        'cursor.execute(f"UPDATE attempts_attempt SET version = {v} WHERE id = 1")',
        "cursor.execute('INSERT INTO attempts_attempt (state) VALUES (%s)', [s])",
    }
    assert [s for s in sorted(writes) if not state_writes(s)] == []
    harmless = {
        "Attempt.objects.filter(pk=1).update(sealed=True)",
        "states.create(state='INTENT_RECORDED', **fields)",
        "SlaEscalation.objects.get_or_create(attempt=a, state=a.state)",
        "def f(a):\n    a.state = ''\n    return a",
        "sql('UPDATE attempts_attempt SET parent_id = NULL WHERE state = %s', [s])",
    }
    assert [s for s in sorted(harmless) if state_writes(s)] == []
