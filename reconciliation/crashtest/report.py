"""The crashtest report: cases by invariants, PASS or FAIL, and the evidence behind failures."""

from __future__ import annotations

from typing import Any

from reconciliation.crashtest.harness import INVARIANTS, CaseReport


def render_table(
    reports: list[CaseReport], fuzz: dict[str, Any] | None, *, vendor: str, seconds: float
) -> str:
    """Cases by invariants, PASS/FAIL, then the evidence behind every failure."""
    names = [name for name, _ in INVARIANTS]
    lines = [
        f"crashtest on {vendor}: {len(reports)} case(s) x {len(names)} invariants"
        + (f" + fuzz {fuzz['calls']}" if fuzz else "")
        + f", {seconds:.1f}s",
        "",
    ]
    header = f"{'case':<5}" + "".join(f"{n:<11}" for n in names) + "time"
    lines.append(header)
    failures: list[str] = []
    rows: list[tuple[str, dict[str, Any], float, str, bool]] = [
        (r.case, {n: c.passed for n, c in r.checks.items()}, r.seconds, r.error, bool(r.unmet))
        for r in reports
    ]
    if fuzz:
        rows.append(
            (
                "fuzz",
                {n: v["passed"] for n, v in fuzz["invariants"].items()},
                fuzz["seconds"],
                fuzz["error"],
                False,
            )
        )
    for case, passed, took, error, unmet in rows:
        cells = "".join(f"{('PASS' if passed[n] and not error else 'FAIL'):<11}" for n in names)
        lines.append(
            f"{case:<5}{cells}{took:.1f}s" + ("  FAIL: fault not reached" if unmet else "")
        )
        if error:
            failures.append(f"case {case}: could not run: {error}")
    for report in reports:
        failures += [f"case {report.case}: fault not reached: {u}" for u in report.unmet]
        for name, check in report.checks.items():
            failures += [f"case {report.case} / {name}: {e}" for e in check.evidence]
    if fuzz:
        for name, value in fuzz["invariants"].items():
            failures += [f"fuzz / {name}: {e}" for e in value["evidence"]]
    lines.append("")
    for number, (name, text) in enumerate(INVARIANTS, 1):
        lines.append(f"  {name:<10} {number}. {text}")
    if fuzz and "effects" in fuzz:
        lines += [
            "",
            f"fuzz: seed {fuzz['seed']}, {fuzz['calls']} calls, {fuzz['attempts']} attempts, "
            f"{fuzz['effects']} effects, {fuzz['agent_runs']} agent runs, "
            f"kills {sum(fuzz['kills'].values())} {fuzz['kills']}",
            f"  duplicate non-idempotent effects: {fuzz['duplicate_non_idempotent_effects']}, "
            f"effects without a ledger row: {fuzz['effects_without_ledger_row']}, "
            f"unsettled outside MANUAL_REVIEW: {fuzz['unsettled_outside_manual_review']} "
            f"(MANUAL_REVIEW: {fuzz['manual_review']})",
        ]
    all_passed = all(r.passed for r in reports) and (fuzz is None or fuzz["passed"])
    if failures:
        lines += ["", "Evidence:"] + [f"  - {f}" for f in failures]
    lines += ["", "RESULT: " + ("PASS" if all_passed else "FAIL")]
    return "\n".join(lines)
