"""Cases A-F of protocol section 8, and G-I of section 11 (approval before dispatch): real agents
and reconcilers killed at named points, then recovery once, again, and twice at once."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from attempts.models import ApprovalPolicy, Attempt, AttemptEvent, EffectClass, State
from reconciliation.crashtest.harness import (
    APPROVERS,
    CASE_TOOLS,
    SETTLED,
    TOOL_TIMEOUT,
    TOOLS,
    CaseReport,
    ChildResult,
    Harness,
    HarnessError,
    Scene,
)
from reconciliation.crashtest.invariants import checkpoint_owned, verify


def tool_call(tool: str, key: str, n: int, tenant: str = "acme") -> dict[str, Any]:
    """One planned call for the crashtest agent (its key names the logical effect)."""
    return {
        "tenant": tenant,
        "task_id": f"task-{key}",
        "tool_name": tool,
        "idempotency_key": key,
        "args": {"ref": key, "n": n, "note": "crashtest ✓"},
    }


def _expect_killed(scene: Scene, results: list[ChildResult], point: str) -> None:
    """A case proves little unless its agents really died where the case says."""
    wrong = [r.fault if r.killed else f"exit {r.returncode}" for r in results]
    wrong = [w for w in wrong if w != f"agent:{point}"]
    if wrong:
        scene.unmet.append(f"agents were to be killed at {point}, but: {', '.join(wrong)}")


def _kill_a_reconciler(scene: Scene, point: str) -> None:
    """One recovery worker dies at ``point`` before recovery proper begins; its leases lapse."""
    scene.wait_until_due()
    [result] = scene.recover(crash_at=point)
    if result.fault != f"reconcile:{point}":
        scene.unmet.append(
            f"the reconciler was to be killed at {point}, but: "
            f"{result.fault if result.killed else f'exit {result.returncode}'}"
        )


def case_a(scene: Scene) -> None:
    """Killed after the intent commit: nothing was sent; recovery finds a stale intent (and the
    first worker to resend it dies after the provider answered, before committing)."""
    results = scene.agents(
        *(
            {"calls": [tool_call(tool, f"a:{tool}", 1)], "crash_at": "intent_committed"}
            for tool in CASE_TOOLS
        )
    )
    _expect_killed(scene, results, "intent_committed")
    checkpoint_owned(scene, "after the kills")
    _kill_a_reconciler(scene, "reconcile_resent")
    scene.recovery_round()


def _agents_killed_at(scene: Scene, case: str, points: tuple[str, ...], seq: int) -> None:
    """One agent per tool and point, each SIGKILLed at its point; checks they all died there."""
    specs = [
        {"calls": [tool_call(tool, f"{case}:{point}:{tool}", seq)], "crash_at": point}
        for point in points
        for tool in CASE_TOOLS
    ]
    results = scene.agents(*specs)
    for point in points:
        _expect_killed(
            scene,
            [r for r, spec in zip(results, specs, strict=True) if spec["crash_at"] == point],
            point,
        )
    checkpoint_owned(scene, "after the kills")


def case_b(scene: Scene) -> None:
    """Killed after the dispatch claim (before the send, and after the request was sent); the
    first recovery worker dies after its lookups answered, before deciding."""
    _agents_killed_at(scene, "b", ("dispatch_claimed", "request_sent"), 2)
    _kill_a_reconciler(scene, "reconcile_looked_up")
    scene.recovery_round()


def case_c(scene: Scene) -> None:
    """Killed after the provider's response, before the outcome (and the request id) commit; the
    first recovery worker dies right after claiming its batch."""
    _agents_killed_at(scene, "c", ("response_received", "request_id_attached"), 3)
    _kill_a_reconciler(scene, "reconcile_claimed")
    scene.recovery_round()


def case_d(scene: Scene) -> None:
    """The same task delivered to two workers at once; one of each pair dies after the response
    if it is the one that sent."""
    not_before = time.time() + 3.0
    specs = []
    for tool in CASE_TOOLS:
        call = [tool_call(tool, f"d:{tool}", 4)]
        specs.append(
            {
                "calls": call,
                "not_before": not_before,
                "crash_at": "response_received",
                "name": "worker-1",
            }
        )
        specs.append({"calls": call, "not_before": not_before, "name": "worker-2"})
    scene.agents(*specs)
    checkpoint_owned(scene, "after the race")
    scene.recovery_round()


def case_e(scene: Scene) -> None:
    """Authority changes while attempts are UNKNOWN: the provider swallows the answer (with and
    without performing the effect), then the grant moves to a new policy with fewer scopes."""
    for mode in ("hang_before_effect", "drop_after_effect"):
        scene.provider.control(
            tools={
                tool: {
                    "send_mode": mode,
                    "hang_seconds": TOOL_TIMEOUT + 1,
                    "honour_keys": TOOLS[tool][0] == EffectClass.IDEMPOTENT,
                }
                for tool in CASE_TOOLS
            }
        )
        scene.agents(*({"calls": [tool_call(tool, f"e:{mode}:{tool}", 5)]} for tool in CASE_TOOLS))
    scene.provider.control(
        tools={
            tool: {"send_mode": "ok", "honour_keys": TOOLS[tool][0] == EffectClass.IDEMPOTENT}
            for tool in CASE_TOOLS
        }
    )
    unknown = Attempt.objects.using(scene.alias).filter(state=State.UNKNOWN).count()
    if unknown != 2 * len(CASE_TOOLS):
        scene.unmet.append(f"{2 * len(CASE_TOOLS)} attempts were to be UNKNOWN, {unknown} are")
    checkpoint_owned(scene, "while UNKNOWN")
    for tool in CASE_TOOLS:
        scene.change_grant("acme", tool, policy_version="v2", scopes=[f"{tool}:write"])
    scene.recovery_round()


def case_f(scene: Scene) -> None:
    """The provider's lookup times out: nothing may be resent or decided on a timeout; once the
    lookup answers again, recovery settles everything."""
    specs = []
    for point in ("dispatch_claimed", "request_sent"):
        for tool in CASE_TOOLS:
            specs.append({"calls": [tool_call(tool, f"f:{point}:{tool}", 6)], "crash_at": point})
    results = scene.agents(*specs)
    for point in ("dispatch_claimed", "request_sent"):
        _expect_killed(
            scene,
            [r for r, spec in zip(results, specs, strict=True) if spec["crash_at"] == point],
            point,
        )
    before = scene.provider.summary().get("total")
    scene.provider.control(lookup_mode="hang", hang_seconds=TOOL_TIMEOUT + 2)
    scene.recovery_round()
    checkpoint_owned(scene, "while lookups time out")
    looked = Attempt.objects.using(scene.alias).filter(state=State.UNKNOWN, lookup_count__gt=0)
    if looked.count() != 2 * (len(CASE_TOOLS) - 1):
        scene.unmet.append(
            f"{2 * (len(CASE_TOOLS) - 1)} attempts were to stay UNKNOWN after timed-out lookups, "
            f"{looked.count()} did"
        )
    after = scene.provider.summary().get("total")
    if after != before:
        scene.checks["once"].fail(
            f"the provider performed {after - before} effect(s) while every lookup timed out: "
            "something was resent without a lookup answer"
        )
    for attempt in Attempt.objects.using(scene.alias).filter(
        state__in=SETTLED | {State.RECONCILED}
    ):
        if attempt.state != State.MANUAL_REVIEW:
            scene.checks["settled"].fail(
                f"{attempt.attempt_id} was settled as {attempt.state} while every lookup timed out"
            )
    scene.provider.control(lookup_mode="ok")
    scene.recovery_round()


# ---------------------------------------------------------------------------------------------
# Approval before dispatch (protocol section 11)


def _hold_every_call(scene: Scene, *, ttl_seconds: int = 3600) -> None:
    """An approval policy on each case tool holding every call, for two approvers."""
    for tool in CASE_TOOLS:
        ApprovalPolicy.objects.using(scene.alias).create(
            name=f"hold-{tool}".replace("_", "-"),
            tool_id=tool,
            approvals_needed=2,
            approval_ttl=dt.timedelta(seconds=ttl_seconds),
        )


def _held_agents_killed_while_waiting(scene: Scene, case: str, seq: int) -> list[dict[str, Any]]:
    """One agent per tool records a held intent and is killed while it waits; returns the
    calls, for the agents that resume."""
    calls = [tool_call(tool, f"{case}:held:{tool}", seq) for tool in CASE_TOOLS]
    results = scene.agents(*({"calls": [c], "crash_at": "approval_waiting"} for c in calls))
    _expect_killed(scene, results, "approval_waiting")
    held = Attempt.objects.using(scene.alias).filter(state=State.AWAITING_APPROVAL).count()
    if held != len(calls):
        scene.unmet.append(f"{len(calls)} intents were to be held for approval, {held} are")
    return calls


def _finish_race(scene: Scene, agents: list[Any], worker: Any) -> None:
    for child in agents:
        result = child.wait()
        if result.returncode != 0:
            raise HarnessError(f"a resumed agent failed ({result.returncode}): {result.tail()}")
    result = worker.wait()
    scene.recovery_results.append(result)
    if result.returncode != 0:
        scene.checks["recovery"].fail(f"a recovery run exited {result.returncode}: {result.tail()}")


def case_g(scene: Scene) -> None:
    """Agents killed while they wait for approval; then approved by two people, the resumed
    agents and the worker race to send: each call is sent once, by whichever claims it."""
    _hold_every_call(scene)
    calls = _held_agents_killed_while_waiting(scene, "g", 7)
    checkpoint_owned(scene, "while held")
    for approver in APPROVERS:
        scene.approve_held(approver)
    time.sleep(1.1)  # past the grace: the worker may send too
    racers = [scene.start_agent([call]) for call in calls[:2]]
    worker = scene.start_recovery()
    _finish_race(scene, racers, worker)
    scene.recovery_round()


def case_h(scene: Scene) -> None:
    """Approved work whose agent is gone: the worker sends it and is killed after the provider
    answered, before committing; recovery finds the send and settles it without a second one."""
    _hold_every_call(scene)
    _held_agents_killed_while_waiting(scene, "h", 8)
    for approver in APPROVERS:
        scene.approve_held(approver)
    _kill_a_reconciler(scene, "reconcile_resent")
    sent = Attempt.objects.using(scene.alias).filter(send_count__gt=0).count()
    if sent == 0:
        scene.unmet.append("the killed worker sent none of the approved work")
    scene.recovery_round()


def case_i(scene: Scene) -> None:
    """An approval expires while claims race it: the agents and a worker claim at the moment
    the first approver's approvals expire. A claim before it sends; one after finds the approval
    void and the attempt waits again; a fresh approval then lets it be sent once."""
    ttl = 3
    _hold_every_call(scene, ttl_seconds=ttl)
    calls = _held_agents_killed_while_waiting(scene, "i", 9)
    scene.approve_held(APPROVERS[0])
    expires = time.time() + ttl
    scene.approve_held(APPROVERS[1])
    # Around the expiry: one agent just before it, one at it, one just after.
    racers = [
        scene.start_agent([call], not_before=expires + offset)
        for call, offset in zip(calls, (-0.05, 0.0, 0.05), strict=True)
    ]
    time.sleep(max(0.0, expires - time.time()))
    worker = scene.start_recovery()
    _finish_race(scene, racers, worker)
    void = AttemptEvent.objects.using(scene.alias).filter(action="attempt.approval_void").count()
    scene.harness.say(f"case I: {void} claim(s) found their approval void")
    # Approvals that count for an hour now (a new policy version: both approve again).
    for policy in ApprovalPolicy.objects.using(scene.alias).all():
        policy.approval_ttl = dt.timedelta(hours=1)
        policy.save(using=scene.alias)
    scene.approve_held(APPROVERS[0])
    scene.approve_held(APPROVERS[1])
    scene.recovery_round()


CASES: dict[str, tuple[str, Callable[[Scene], None]]] = {
    "A": ("kill after the intent commit, before dispatch", case_a),
    "B": ("kill after the dispatch claim and send, before local acknowledgment", case_b),
    "C": ("kill after the provider's response, before the outcome commit", case_c),
    "D": ("the same task delivered to two workers at once", case_d),
    "E": ("authorization changed while the attempt is UNKNOWN", case_e),
    "F": ("the provider's lookup times out", case_f),
    "G": ("the agent killed while waiting for approval, then approved", case_g),
    "H": ("the worker killed mid-send of approved work", case_h),
    "I": ("an approval expiring while a claim races it", case_i),
}


def run_case(harness: Harness, case: str) -> CaseReport:
    """Run one case in its own scene and check every invariant."""
    title, body = CASES[case]
    harness.say(f"case {case}: {title}")
    started = time.monotonic()
    scene = harness.scene(f"case_{case.lower()}")
    error = ""
    stats: dict[str, Any] = {}
    try:
        scene.open()
        body(scene)
        verify(scene)
        stats = scene.stats()
    except HarnessError as exc:
        error = str(exc)
    finally:
        scene.close()
    report = CaseReport(
        case, title, scene.checks, stats, time.monotonic() - started, error, scene.unmet
    )
    failed = [name for name, c in report.checks.items() if not c.passed]
    harness.say(
        f"case {case}: {'PASS' if report.passed else 'FAIL'} in {report.seconds:.1f}s"
        + (f" (failed: {', '.join(failed)})" if failed else "")
        + (f" (error: {error})" if error else "")
        + (f" (fault not reached: {'; '.join(scene.unmet)})" if scene.unmet else "")
    )
    return report
