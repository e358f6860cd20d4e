"""The invariants of protocol section 7, each checked against the scene's ledger and against
the provider's own record of effects; every failure carries its evidence."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections

from attempts import audit_verify, dbadapter
from attempts.models import (
    ATTENTION_STATES,
    Approval,
    Attempt,
    AttemptEvent,
    Membership,
    State,
    Tool,
)
from reconciliation.crashtest.harness import (
    SETTLED,
    Check,
    Scene,
    args_hash,
    effect_hash,
    effect_key,
    effect_time,
    root_key,
)


def all_attempts(scene: Scene) -> list[Attempt]:
    """Every attempt of the scene's ledger, oldest first, with its parent."""
    return list(Attempt.objects.using(scene.alias).select_related("parent").order_by("id"))


def check_once(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """1. No logical effect performed twice at the provider (a non-idempotent tool counts every
    send; linked attempts share their root's logical effect), and no effect without its row."""
    by_key = {a.idempotency_key: a for a in all_attempts(scene)}
    per_logical: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for effect in effects:
        key = effect_key(effect)
        per_logical[(str(effect.get("tool", "")), root_key(key))].append(effect)
        attempt = by_key.get(key)
        if attempt is None:
            check.fail(f"effect {effect.get('id')} under key {key!r} has no ledger attempt")
            continue
        if effect_hash(effect) != attempt.args_hash:
            check.fail(
                f"effect {effect.get('id')} under {key!r} has payload hash {effect_hash(effect)[:12]}"
                f" but the ledger recorded {attempt.args_hash[:12]}"
            )
        sender = effect.get("ledger_attempt_id")
        if sender and sender != attempt.attempt_id:
            check.fail(
                f"effect {effect.get('id')} under {key!r} was sent by {sender}, "
                f"not by its attempt {attempt.attempt_id}"
            )
    for (tool, logical), performed in sorted(per_logical.items()):
        if len(performed) > 1:
            ids = ", ".join(str(e.get("id")) for e in performed)
            check.fail(f"{tool} effect {logical!r} performed {len(performed)} times ({ids})")


def final_of(attempt: Attempt, children: dict[int, list[Attempt]]) -> Attempt | None:
    """Where a RECONCILED attempt's lineage ends (None: a broken or looping link)."""
    seen = set()
    current = attempt
    while current.state == State.RECONCILED:
        if current.pk in seen or not children.get(current.pk):
            return None
        seen.add(current.pk)
        current = children[current.pk][-1]
    return current


def check_settled(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """2. Every attempt is OUTCOME_CONFIRMED, FAILED or MANUAL_REVIEW (RECONCILED only with a
    link to one that is), and the ledger agrees with the provider: confirmed means performed
    with that payload, failed means not performed."""
    attempts = all_attempts(scene)
    children: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.parent_id:
            children[attempt.parent_id].append(attempt)
    performed = defaultdict(list)
    for effect in effects:
        performed[effect_key(effect)].append(effect)
    for attempt in attempts:
        if attempt.state == State.RECONCILED:
            final = final_of(attempt, children)
            if final is None or final.state not in SETTLED:
                check.fail(
                    f"{attempt.attempt_id} is RECONCILED but its lineage ends "
                    f"{'nowhere' if final is None else f'in {final.state}'}"
                )
        elif attempt.state not in SETTLED:
            check.fail(f"{attempt.attempt_id} ({attempt.tool_name}) was left {attempt.state}")
        done = performed.get(attempt.idempotency_key, [])
        if attempt.state == State.OUTCOME_CONFIRMED and not any(
            effect_hash(e) == attempt.args_hash for e in done
        ):
            check.fail(
                f"{attempt.attempt_id} is OUTCOME_CONFIRMED but the provider has no effect "
                f"under {attempt.idempotency_key!r} with its payload"
            )
        if attempt.state == State.FAILED and done:
            check.fail(
                f"{attempt.attempt_id} is FAILED but the provider performed it "
                f"({', '.join(str(e.get('id')) for e in done)})"
            )


def check_visible(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """3. Each attempt shows its key, args, a correct args hash, what identifies its effect once
    confirmed (the provider request id, or a receipt carrying it), and a full history whose
    hash chain is intact."""
    ids_by_key = {effect_key(e): str(e.get("id")) for e in effects}
    for attempt in all_attempts(scene):
        if not attempt.idempotency_key:
            check.fail(f"{attempt.attempt_id} has no idempotency key")
        if args_hash(attempt.args) != attempt.args_hash:
            check.fail(f"{attempt.attempt_id}: args hash does not match its normalized args")
        provider_id = ids_by_key.get(attempt.idempotency_key)
        if (
            attempt.state == State.OUTCOME_CONFIRMED
            and provider_id
            and not attempt.identifies_effect(provider_id)
        ):
            check.fail(
                f"{attempt.attempt_id} is confirmed but names neither the provider's id "
                f"{provider_id!r} (provider request id {attempt.provider_request_id!r}) nor, "
                f"without one, a receipt carrying it ({attempt.result_ref!r})"
            )
    # The one verifier of the history (attempts/audit_verify/), on this scene's database.
    connection = connections[scene.alias]
    report = audit_verify.verify_database(
        functools.partial(dbadapter.streaming_cursor, connection), vendor=connection.vendor
    )
    for problem in report.problems:
        check.fail(f"history does not verify: {problem}")
    moves: dict[str, list[str]] = defaultdict(list)
    for event in AttemptEvent.objects.using(scene.alias).select_related("attempt").order_by("id"):
        moves[event.attempt.attempt_id].append(event.to_state)
    for attempt in all_attempts(scene):
        history = moves.get(attempt.attempt_id, [])
        if not history or history[-1] != attempt.state:
            check.fail(
                f"{attempt.attempt_id} is {attempt.state} but its history ends in "
                f"{history[-1] if history else 'nothing'}"
            )


def check_authority(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """4. A linked attempt keeps its tenant and tool and never widens scope (within both its
    parent's and the grant of its day); every send happened under the authority in force then."""
    attempts = all_attempts(scene)
    for attempt in attempts:
        parent = attempt.parent
        if parent is not None:
            if attempt.tenant_id != parent.tenant_id or attempt.tool_name != parent.tool_name:
                check.fail(
                    f"linked {attempt.attempt_id} moved from {parent.tenant_id}/{parent.tool_name}"
                    f" to {attempt.tenant_id}/{attempt.tool_name}"
                )
            extra = set(attempt.credential_scope) - set(parent.credential_scope)
            if extra:
                check.fail(
                    f"linked {attempt.attempt_id} widened scope beyond its parent: {sorted(extra)}"
                )
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, attempt.created_at)
        if grant is not None:
            extra = set(attempt.credential_scope) - set(grant[1])
            if extra:
                check.fail(
                    f"{attempt.attempt_id} holds scopes its grant never gave: {sorted(extra)}"
                )
    by_id = {a.attempt_id: a for a in attempts}
    sends = (
        AttemptEvent.objects.using(scene.alias)
        .filter(to_state=State.DISPATCHED)
        .exclude(from_state=State.DISPATCHED)
    )
    for event in sends.select_related("attempt"):
        attempt = by_id[event.attempt.attempt_id]
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, event.created_at)
        if grant is None:
            check.fail(f"{attempt.attempt_id} was dispatched with no grant in force")
        elif grant[0] != attempt.policy_version or set(attempt.credential_scope) - set(grant[1]):
            check.fail(
                f"{attempt.attempt_id} was dispatched at {event.created_at:%H:%M:%S.%f} under "
                f"policy {attempt.policy_version} {attempt.credential_scope}, but the grant then "
                f"was {grant[0]} {grant[1]}"
            )
    by_key = {a.idempotency_key: a for a in attempts}
    for effect in effects:
        attempt = by_key.get(effect_key(effect))
        moment = effect_time(effect)
        if attempt is None or moment is None:
            continue
        grant = scene.grant_at(attempt.tenant_id, attempt.tool_name, moment)
        if grant is not None and grant[0] != attempt.policy_version:
            check.fail(
                f"effect {effect.get('id')} of {attempt.attempt_id} was performed at "
                f"{moment:%H:%M:%S.%f} under old policy {attempt.policy_version} "
                f"(in force: {grant[0]})"
            )


def check_owned(scene: Scene, check: Check, moment: str) -> None:
    """5. UNKNOWN and MANUAL_REVIEW attempts have an active owner who belongs to their tenant,
    and UNKNOWN ones are queued for another look (a next check time)."""
    members = set(Membership.objects.using(scene.alias).values_list("tenant_id", "user_id"))
    active = set(
        get_user_model()
        .objects.db_manager(scene.alias)
        .filter(is_active=True)
        .values_list("id", flat=True)
    )
    for attempt in Attempt.objects.using(scene.alias).filter(state__in=ATTENTION_STATES):
        if attempt.owner_id is None:
            check.fail(f"at {moment}: {attempt.attempt_id} is {attempt.state} with no owner")
        elif attempt.owner_id not in active or (attempt.tenant_id, attempt.owner_id) not in members:
            check.fail(
                f"at {moment}: {attempt.attempt_id} is owned by user {attempt.owner_id}, "
                f"who is not an active member of {attempt.tenant_id}"
            )
        if attempt.state == State.UNKNOWN and attempt.next_check_at is None:
            check.fail(f"at {moment}: {attempt.attempt_id} is UNKNOWN but not queued for a check")


def check_approved(scene: Scene, check: Check, effects: list[dict[str, Any]]) -> None:
    """9. Every claim of an attempt an approval policy held had enough valid approvals at that
    moment (distinct people, this args_hash and policy version, unexpired), and nothing held
    was performed without such a claim."""
    critical = dict(Tool.objects.using(scene.alias).values_list("name", "critical"))
    performed = defaultdict(list)
    for effect in effects:
        performed[effect_key(effect)].append(effect)
    held = Attempt.objects.using(scene.alias).filter(approval_policy__isnull=False)
    for attempt in held.select_related("approval_policy"):
        policy = attempt.approval_policy
        needed = max(policy.approvals_needed, 2 if critical.get(attempt.tool_name) else 1)
        approvals = list(Approval.objects.using(scene.alias).filter(attempt_id=attempt.pk))
        claims = list(
            AttemptEvent.objects.using(scene.alias).filter(
                attempt_id=attempt.pk, from_state=State.INTENT_RECORDED, to_state=State.DISPATCHED
            )
        )
        for claim in claims:
            # The policy version in force at the claim, as its event recorded it.
            version = (claim.details or {}).get("approvals", {}).get("policy_version")
            valid = {
                a.approver_id
                for a in approvals
                if a.args_hash == attempt.args_hash
                and a.policy_version == version
                and a.created_at <= claim.created_at < a.expires_at
            }
            if len(valid) < needed:
                check.fail(
                    f"{attempt.attempt_id} was claimed at {claim.created_at:%H:%M:%S.%f} by "
                    f"{claim.actor} with {len(valid)} valid approval(s) of {needed}"
                )
        if performed.get(attempt.idempotency_key) and not claims:
            check.fail(f"{attempt.attempt_id} was performed but never claimed after approval")


def checkpoint_owned(scene: Scene, moment: str) -> None:
    """Invariant 5 at a moment in the middle of a case (checked again at the end)."""
    check_owned(scene, scene.checks["owned"], moment)


def verify(scene: Scene) -> dict[str, Check]:
    """Check every invariant against the scene's ledger and its provider's record."""
    effects = scene.provider.effects()
    check_once(scene, scene.checks["once"], effects)
    check_settled(scene, scene.checks["settled"], effects)
    check_visible(scene, scene.checks["visible"], effects)
    check_authority(scene, scene.checks["authority"], effects)
    check_owned(scene, scene.checks["owned"], "the end")
    check_approved(scene, scene.checks["approved"], effects)
    if not scene.recovery_results:
        scene.checks["recovery"].fail("recovery never ran to completion")
    return scene.checks
