"""Failure injection as a deployment gate: the machinery behind ``manage.py crashtest``.

Agents and reconcilers are real child processes, killed with SIGKILL at named crash points
(``attempts.faults``); the provider is a real separate process with its own durable record of
effects; recovery runs twice in a row and twice at once; then every invariant of protocol
section 7 is checked against the ledger and against the provider's record.

- ``harness``: scratch databases, the provider process, child processes, the scene of a case;
- ``invariants``: the section 7 checks, each with its evidence;
- ``cases``: cases A-F of section 8, and G-I of section 11 (approval before dispatch);
- ``fuzz``: random kills over many tool calls;
- ``report``: the table.
"""

from reconciliation.crashtest.cases import CASES, run_case
from reconciliation.crashtest.fuzz import run_fuzz
from reconciliation.crashtest.harness import (
    INVARIANTS,
    CaseReport,
    Harness,
    HarnessError,
    harness_run,
)
from reconciliation.crashtest.report import render_table

__all__ = [
    "CASES",
    "INVARIANTS",
    "CaseReport",
    "Harness",
    "HarnessError",
    "harness_run",
    "render_table",
    "run_case",
    "run_fuzz",
]
