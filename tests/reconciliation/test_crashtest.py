"""``manage.py crashtest`` end to end, as the deployment gate runs it: real agents, reconcilers
and provider processes on a scratch database of the current vendor (SQLite file, or a scratch
database on the PostgreSQL server of DATABASE_URL).

The mutation tests are the harness's own test: a deliberately broken ledger (dispatch claimed
after sending) or reconciler (a blind retry) must make crashtest fail, naming the invariant.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.conftest import REPO, manage

pytestmark = pytest.mark.slow
# The harness's own tests (a broken ledger or reconciler is caught, the table, bad use) do not
# depend on the database; the gate's cases run on each (scripts/test). They run in the
# PostgreSQL pass, which the browser tests leave the lighter.
ONE_DATABASE = pytest.mark.one_database("postgres")


def crashtest(*args: str, **env: str | None) -> tuple[int, Any, str]:
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "LEDGERWEB_FAULTS_ALLOWED": "1",
        **env,
    }
    environment = {name: value for name, value in environment.items() if value is not None}
    done = manage("crashtest", "--quiet", *args, env=environment, timeout=600)
    try:
        report = json.loads(done.stdout) if "--json" in args else done.stdout
    except ValueError:
        report = None
    return done.returncode, report, done.stderr


def failed_invariants(report: dict[str, Any], case: str) -> dict[str, list[str]]:
    [found] = [c for c in report["cases"] if c["case"] == case]
    return {n: v["evidence"] for n, v in found["invariants"].items() if not v["passed"]}


@pytest.mark.skipif(
    os.environ.get("LEDGERWEB_CRASH_GATE") == "1",
    reason="the crash gate scripts/test runs after the suite runs case D on this database",
)
def test_case_d_passes_every_invariant() -> None:
    code, report, stderr = crashtest("--cases", "D", "--json")
    assert code == 0, stderr
    assert report["passed"] is True
    [case] = report["cases"]
    assert case["case"] == "D"
    assert set(case["invariants"]) == {
        "once",
        "settled",
        "visible",
        "authority",
        "owned",
        "recovery",
        "approved",
    }
    assert all(v["passed"] for v in case["invariants"].values())
    assert case["stats"]["recovery_runs"] == 4  # once, again, and twice at once


@ONE_DATABASE
def test_claiming_the_dispatch_after_sending_is_caught() -> None:
    # Case C kills the agent after the provider answered: with the claim after the send, the
    # ledger still says "nothing was sent" and recovery sends a second time.
    code, report, stderr = crashtest("--cases", "C", "--json", "--mutation", "claim_after_send")
    assert code == 1, stderr
    assert report["passed"] is False
    evidence = failed_invariants(report, "C")
    assert "once" in evidence
    assert any("performed 2 times" in line for line in evidence["once"])
    # The broken path never reaches the request-id point: the report says so too.
    [case] = report["cases"]
    assert any("request_id_attached" in line for line in case["faults_not_reached"])


@ONE_DATABASE
def test_a_blind_retry_in_the_reconciler_is_caught() -> None:
    code, report, stderr = crashtest("--cases", "F", "--json", "--mutation", "blind_retry")
    assert code == 1, stderr
    evidence = failed_invariants(report, "F")
    assert any("while every lookup timed out" in line for line in evidence["once"])


@ONE_DATABASE
def test_fuzz_reports_its_seed_and_zero_violations() -> None:
    code, report, stderr = crashtest("--no-cases", "--fuzz", "12", "--seed", "7", "--json")
    assert code == 0, stderr
    fuzz = report["fuzz"]
    assert fuzz["seed"] == 7 and fuzz["calls"] == 12
    assert fuzz["attempts"] >= 12
    assert fuzz["duplicate_non_idempotent_effects"] == 0
    assert fuzz["effects_without_ledger_row"] == 0
    assert fuzz["unsettled_outside_manual_review"] == 0


@pytest.mark.skipif(
    os.environ.get("LEDGERWEB_CRASH_GATE") == "1",
    reason="the crash gate scripts/test runs after the suite runs these cases on this database",
)
@pytest.mark.parametrize("case", ["G", "H", "I"])
def test_approval_cases_pass_every_invariant(case: str) -> None:
    """Agents killed while waiting for approval, the worker killed mid-send of approved work, an
    approval expiring while claims race it: each held call sent at most once, and only with
    enough valid approvals at its claim."""
    code, report, stderr = crashtest("--cases", case, "--json")
    assert code == 0, stderr
    [found] = report["cases"]
    assert found["case"] == case and report["passed"] is True, failed_invariants(report, case)
    assert found["invariants"]["approved"]["passed"]


@ONE_DATABASE
def test_the_table_names_cases_and_invariants() -> None:
    code, table, stderr = crashtest("--cases", "A")
    assert code == 0, stderr
    assert (
        "case once       settled    visible    authority  owned      recovery   approved" in table
    )
    assert table.strip().endswith("RESULT: PASS")


@ONE_DATABASE
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--cases", "Z"), {}, "cases are letters"),
        (("--fuzz", "-1"), {}, "--fuzz must be 0 or more"),
        (("--no-cases",), {}, "--no-cases needs --fuzz N"),
        (
            ("--cases", "A"),
            {"LEDGERWEB_HTTPS": "1", "LEDGERWEB_FAULTS_ALLOWED": None},
            "off unless enabled for this process",
        ),
        (("--cases", "A"), {"LEDGERWEB_FAULTS_ALLOWED": None}, "off unless enabled"),
        (("--database-url", "mysql://a@localhost/x"), {}, "must be a postgres:// URL"),
        (("--database-url", "postgres://nobody@127.0.0.1:1/x"), {}, "cannot reach the PostgreSQL"),
    ],
)
def test_bad_use_is_a_clear_error(
    args: tuple[str, ...], env: dict[str, str | None], message: str
) -> None:
    code, _, stderr = crashtest(*args, **env)
    assert code != 0
    assert message in stderr
    assert "Traceback" not in stderr
