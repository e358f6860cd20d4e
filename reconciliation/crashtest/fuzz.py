"""Random kill fuzzing: many tool calls across effect classes, agents and reconcilers killed at
random named points or by timer, random provider faults; then recovery and every invariant."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from attempts.models import (
    Attempt,
    EffectClass,
    State,
)
from reconciliation.crashtest.cases import tool_call
from reconciliation.crashtest.harness import (
    IN_FLIGHT,
    SETTLED,
    TENANTS,
    TOOL_TIMEOUT,
    TOOLS,
    ChildResult,
    Harness,
    HarnessError,
    Scene,
    effect_key,
    root_key,
)
from reconciliation.crashtest.invariants import all_attempts, final_of, verify

AGENT_POINTS = (
    "intent_committed",
    "dispatch_claimed",
    "request_sent",
    "response_received",
    "request_id_attached",
)
RECONCILER_POINTS = ("reconcile_claimed", "reconcile_looked_up", "reconcile_resent")
PROVIDER_FAULTS = (
    "drop_after_effect",
    "hang_after_effect",
    "hang_before_effect",
    "error_5xx",
    "refuse_retryable",
    "refuse",
)
FUZZ_LANES = 2


def _agent_fault(rng: random.Random) -> dict[str, Any]:
    """A random way for the next agent process to die (or not)."""
    roll = rng.random()
    if roll < 0.15:
        return {}
    if roll < 0.6:
        return {"crash_at": rng.choice(AGENT_POINTS), "crash_after": rng.randint(1, 4)}
    return {"timer_ms": rng.randint(0, 80)}


def _resume_at(
    result: ChildResult,
    position: int,
    end: int,
    rng: random.Random,
    recorded: Callable[[int], bool],
) -> int:
    """Where a restarted agent carries on: after the last finished call, repeating the one it
    was killed in (same key, as a restarted agent would) half of the time, and always when its
    intent never reached the ledger (so every planned call gets its attempt)."""
    if not result.killed:
        return end
    started, done = result.started(), result.done()
    if not started:
        return position
    interrupted = started[-1]
    if done and done[-1] == interrupted:
        return interrupted + 1
    if not recorded(interrupted) or rng.random() < 0.5:
        return interrupted
    return interrupted + 1


def run_fuzz(harness: Harness, *, calls: int, seed: int) -> dict[str, Any]:
    """Random kills over ``calls`` tool calls across effect classes and both tenants, with random
    provider faults and random reconciler kills on the way; then recovery and every invariant."""
    rng = random.Random(seed)
    started = time.monotonic()
    harness.say(f"fuzz: {calls} tool calls, seed {seed} (replay with --fuzz {calls} --seed {seed})")
    scene = harness.scene("fuzz")
    tools = list(TOOLS)
    plan = [
        tool_call(rng.choice(tools), f"fz{seed}:{i}", i, tenant=rng.choice(TENANTS))
        for i in range(calls)
    ]
    lanes = [plan[i::FUZZ_LANES] for i in range(FUZZ_LANES)]
    positions = [0] * FUZZ_LANES
    agent_runs = provider_faults = reconciler_runs = rounds = 0
    error = ""
    figures: dict[str, Any] = {}
    try:
        scene.open()
        while any(pos < len(lane) for pos, lane in zip(positions, lanes, strict=True)):
            rounds += 1
            provider_faults += _provider_fault(scene, rng, tools)
            active = [i for i in range(FUZZ_LANES) if positions[i] < len(lanes[i])]
            chunks = {i: rng.randint(1, 6) for i in active}
            specs = [
                {
                    "calls": lanes[i],
                    "start": positions[i],
                    "count": chunks[i],
                    "name": f"fuzz-agent-{i}",
                    **_agent_fault(rng),
                }
                for i in active
            ]
            results = scene.agents(*specs)
            agent_runs += len(results)
            for i, result in zip(active, results, strict=True):
                lane = lanes[i]

                def recorded(index: int, lane: list[dict[str, Any]] = lane) -> bool:
                    key = lane[index]["idempotency_key"]
                    return Attempt.objects.using(scene.alias).filter(idempotency_key=key).exists()

                end = min(len(lane), positions[i] + chunks[i])
                positions[i] = _resume_at(result, positions[i], end, rng, recorded)
            if rounds % 4 == 0:
                scene.recover(**_reconciler_fault(rng))
                reconciler_runs += 1
            if rounds % 10 == 0:
                done = sum(positions)
                harness.say(
                    f"fuzz: {done}/{calls} calls, {agent_runs} agent runs, "
                    f"{sum(scene.kills.values())} kills"
                )
        harness.say("fuzz: all calls made; recovering")
        _recover_all(scene)
        verify(scene)
        figures = _fuzz_figures(scene)
        figures["stats"] = scene.stats()
    except HarnessError as exc:
        error = str(exc)
    finally:
        scene.close()
    passed = not error and all(c.passed for c in scene.checks.values())
    seconds = time.monotonic() - started
    harness.say(f"fuzz: {'PASS' if passed else 'FAIL'} in {seconds:.1f}s")
    return {
        "passed": passed,
        "error": error,
        "seed": seed,
        "calls": calls,
        "agent_runs": agent_runs,
        "reconciler_runs_with_faults": reconciler_runs,
        "provider_faults": provider_faults,
        "kills": dict(sorted(scene.kills.items())),
        "seconds": round(seconds, 1),
        **figures,
        "invariants": _invariants(scene),
    }


def _invariants(scene: Scene) -> dict[str, dict[str, Any]]:
    return {
        name: {"passed": check.passed, "evidence": check.evidence}
        for name, check in scene.checks.items()
    }


def _provider_fault(scene: Scene, rng: random.Random, tools: list[str]) -> int:
    """One time in five, the next send of a random tool fails a random way; 1 when it does."""
    if rng.random() >= 0.2:
        return 0
    tool = rng.choice(tools)
    mode = rng.choice(PROVIDER_FAULTS)
    scene.provider.control(
        tools={tool: {"send_mode": mode, "remaining_faults": 1, "hang_seconds": TOOL_TIMEOUT + 0.5}}
    )
    return 1


def _reconciler_fault(rng: random.Random) -> dict[str, Any]:
    """A reconciler on the way, killed at a random point or by timer (or not at all)."""
    roll = rng.random()
    if roll < 0.4:
        return {"crash_at": rng.choice(RECONCILER_POINTS)}
    if roll < 0.8:
        return {"timer_ms": rng.randint(0, 600)}
    return {}


def _recover_all(scene: Scene) -> None:
    """The provider as configured, then recovery until nothing is in flight (five rounds at
    most)."""
    scene.provider.reset()
    for tool, (effect_class, _critical) in TOOLS.items():
        scene.provider.control(
            tools={tool: {"honour_keys": effect_class == EffectClass.IDEMPOTENT}}
        )
    scene.recovery_round()
    for _ in range(5):
        if not Attempt.objects.using(scene.alias).filter(state__in=IN_FLIGHT).exists():
            break
        scene.wait_until_due()
        scene.recover()


def _fuzz_figures(scene: Scene) -> dict[str, int]:
    """The headline numbers: duplicate non-idempotent effects, effects without a ledger row,
    attempts left unsettled outside MANUAL_REVIEW."""
    effects = scene.provider.effects()
    attempts = all_attempts(scene)
    by_key = {a.idempotency_key: a for a in attempts}
    per_logical: Counter[tuple[str, str]] = Counter(
        (str(e.get("tool")), root_key(effect_key(e))) for e in effects
    )
    non_idempotent = {n for n, (c, _) in TOOLS.items() if c != EffectClass.IDEMPOTENT}
    children: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.parent_id:
            children[attempt.parent_id].append(attempt)
    unsettled = 0
    for attempt in attempts:
        final = final_of(attempt, children) if attempt.state == State.RECONCILED else attempt
        if final is None or final.state not in SETTLED:
            unsettled += 1
    return {
        "attempts": len(attempts),
        "effects": len(effects),
        "duplicate_non_idempotent_effects": sum(
            n - 1 for (tool, _), n in per_logical.items() if n > 1 and tool in non_idempotent
        ),
        "duplicate_effects_any_class": sum(n - 1 for n in per_logical.values() if n > 1),
        "effects_without_ledger_row": sum(1 for e in effects if effect_key(e) not in by_key),
        "unsettled_outside_manual_review": unsettled,
        "manual_review": sum(1 for a in attempts if a.state == State.MANUAL_REVIEW),
    }
