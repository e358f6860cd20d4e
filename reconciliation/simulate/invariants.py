"""What must hold after every step of a history (the cheap checks), and at intervals and after
every tampering (the verifiers, online and offline, and every receipt).

Each check has a name; a violation names its check. ``OPEN_BREAKS`` in driver.py lists the
checks and tamperings that fail on purpose until their fix lands (issue 39)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from attempts import audit_export, audit_verify, log, verify_export
from attempts.canonical import canonical_bytes, hash_bytes
from attempts.models import ArchivedAttempt, Attempt, AttemptEvent, State
from attempts.states import LEGAL_MOVES
from attempts.verify_export import ERASURE_ACTION

if TYPE_CHECKING:
    from reconciliation.simulate.history import History

S = State
CHEAP_CHECKS = (
    "one_effect_per_key",
    "effect_has_attempt",
    "one_attempt_per_effect",
    "acknowledged_kept",
    "attention_has_owner",
    "legal_moves",
    "args_hash_matches",
    "never_wider",
    "held_sent_with_approvals",
    "confirmed_was_performed",
    "failed_was_not_performed",
)
VERIFIER_CHECKS = ("verify_audit", "verify_export", "receipts")


def cheap(history: History, *, last_event: int) -> int:
    """The invariants read from the provider's record, the model and the ledger's rows.
    Returns the newest event id seen (legal moves are checked on events newer than
    ``last_event`` only)."""
    attempts = {a.idempotency_key: a for a in Attempt.objects.all()}
    archived = set(ArchivedAttempt.objects.values_list("idempotency_key", flat=True))

    _effects(history, attempts, archived)
    _attempt_rows(history, attempts)
    return _new_events(history, attempts, last_event)


def _effects(history: History, attempts: dict[str, Attempt], archived: set[str]) -> None:
    """One effect per key, each sent by its attempt; one attempt per effect; every
    acknowledged intent kept."""
    provider = history.provider
    skip = history.open_breaks
    # At most one effect per key at the provider, ever (archived or not).
    for (tool, key), effects in provider.per_key().items():
        if len(effects) > 1:
            history.violate(
                "one_effect_per_key",
                f"{tool} performed key {key!r} {len(effects)} times "
                f"({', '.join(e.id for e in effects)})",
            )
        # Every effect has its attempt, in the ledger or an archive, and was sent by it.
        if key not in attempts and key not in archived:
            history.violate("effect_has_attempt", f"effect under {key!r} has no attempt")
        elif key in attempts and any(e.attempt_id != attempts[key].attempt_id for e in effects):
            history.violate(
                "effect_has_attempt",
                f"effect under {key!r} was sent by another attempt than {attempts[key].attempt_id}",
            )

    # At most one attempt per provider effect.
    if "one_attempt_per_effect" not in skip:
        confirmed = Counter(
            (a.tool_name, a.provider_request_id)
            for a in attempts.values()
            if a.state == S.OUTCOME_CONFIRMED and a.provider_request_id
        )
        for (tool, request_id), count in confirmed.items():
            if count > 1:
                history.violate(
                    "one_attempt_per_effect",
                    f"{count} attempts of {tool} confirmed on provider effect {request_id}",
                )

    # Every acknowledged intent is in the ledger or an archive.
    for key in history.model.acked:
        if key not in attempts and key not in archived:
            history.violate("acknowledged_kept", f"acknowledged key {key!r} is gone")


def _attempt_rows(history: History, attempts: dict[str, Attempt]) -> None:
    """Attention work has an owner; a confirmed attempt was performed, a failed one not."""
    performed = history.provider.per_key()
    for attempt in attempts.values():
        if attempt.state in (S.MANUAL_REVIEW, S.AWAITING_APPROVAL) and attempt.owner_id is None:
            history.violate(
                "attention_has_owner", f"{attempt.attempt_id} is {attempt.state} without owner"
            )
        done = performed.get((attempt.tool_name, attempt.idempotency_key), [])
        if attempt.state == S.OUTCOME_CONFIRMED and not done:
            history.violate(
                "confirmed_was_performed",
                f"{attempt.attempt_id} is OUTCOME_CONFIRMED but the provider never performed "
                f"{attempt.idempotency_key!r}",
            )
        if attempt.state == S.FAILED and done:
            history.violate(
                "failed_was_not_performed",
                f"{attempt.attempt_id} is FAILED but the provider performed it ({done[0].id})",
            )


def _new_events(history: History, attempts: dict[str, Attempt], last_event: int) -> int:
    """Legal moves in the events newer than ``last_event``; the args hash and the never-wider
    rule of the attempts they touched, and each held attempt's approvals at its claim.
    Returns the newest event id seen."""
    new_events = list(
        AttemptEvent.objects.filter(id__gt=last_event)
        .order_by("id")
        .values_list("id", "attempt_id", "from_state", "to_state")
    )
    for _event_id, _attempt_pk, from_state, to_state in new_events:
        if from_state and to_state and from_state != to_state:
            if to_state not in LEGAL_MOVES.get(from_state, ()):
                history.violate("legal_moves", f"event moved {from_state} -> {to_state}")
    touched = {pk for _, pk, _, _ in new_events}
    newest = new_events[-1][0] if new_events else last_event

    by_pk = {a.pk: a for a in attempts.values()}
    erased = set(
        AttemptEvent.objects.filter(action=ERASURE_ACTION).values_list("attempt_id", flat=True)
    )
    for pk in touched:
        attempt = by_pk.get(pk)
        if attempt is None:
            continue
        if pk not in erased and hash_bytes(canonical_bytes(attempt.args)) != attempt.args_hash:
            history.violate(
                "args_hash_matches", f"{attempt.attempt_id}'s args do not hash to args_hash"
            )
        if attempt.parent_id is not None:
            parent = by_pk.get(attempt.parent_id)
            if parent is not None and (
                parent.tenant_id != attempt.tenant_id
                or not set(attempt.credential_scope or []) <= set(parent.credential_scope or [])
            ):
                history.violate("never_wider", f"{attempt.attempt_id} is wider than its parent")
        held_sent(history, attempt)
    return newest


def held_sent(history: History, attempt: Attempt) -> None:
    """Every held attempt that was sent had, at its claim, the approvals its policy version
    required, from distinct people, none of them its recorder (the model's own record)."""
    if attempt.approval_policy_id is None:
        return
    claim = (
        attempt.events.filter(to_state=S.DISPATCHED).order_by("id").values_list("created_at")
    ).first()
    if claim is None:
        return
    at = claim[0]
    version, needed = _policy_at(history, at)
    given = history.model.approvals.get(attempt.attempt_id, [])
    valid = {
        g.approver
        for g in given
        if g.args_hash == attempt.args_hash
        and g.policy_version == version
        and g.at <= at + dt.timedelta(seconds=1)
        and at < g.at + dt.timedelta(hours=1)
    }
    if len(valid) < needed:
        history.violate(
            "held_sent_with_approvals",
            f"{attempt.attempt_id} was claimed with {len(valid)} valid approvals of {needed} "
            f"(policy version {version}; given: {[(g.approver, g.policy_version) for g in given]})",
        )


def _policy_at(history: History, at: dt.datetime) -> tuple[int, int]:
    version, needed = history.model.policy_versions[0][1:]
    for when, v, n in history.model.policy_versions:
        if when <= at:
            version, needed = v, n
    return version, needed


def verifiers(history: History, folder: Path) -> dict[str, list[str]]:
    """Run verify_audit's checks, the standalone verifier on a whole-ledger export, and every
    receipt. Returns each verifier's problems as ``kind: message`` lines (empty: it passes)."""
    keys = history.keys.all()
    witness_keys = [history.env.witness.verifier]
    # What configuration says the newest checkpoint must carry (keys, witnesses, the signer's
    # memory), as verify_audit decides it.
    report = audit_verify.verify_django_database(
        log_keys=keys, witness_keys=witness_keys, trust=audit_verify.configured_trust()
    )
    found = {"verify_audit": [f"{p.kind}: {p}" for p in report.problems]}
    plan = audit_export.plan_export(user=None, filters=audit_export.ExportFilters())
    path = folder / "export.jsonl"
    with path.open("wb") as out:
        for chunk in audit_export.stream_jsonl(plan):
            out.write(chunk)
    trust = verify_export.LogTrust(log_keys=keys, witness_keys=witness_keys, quorum=log.quorum())
    exported = verify_export.verify_jsonl(path, trust=trust)
    found["verify_export"] = [f"{p.kind}: {p}" for p in exported.problems]
    receipts = []
    for attempt in Attempt.objects.filter(sealed=True).order_by("id")[:20]:
        try:
            body = log.receipt(attempt)
        except log.NotSealed:
            continue
        # As the agent that recorded it checks its receipt: against what it sent (the
        # arguments only while they are not erased: erasure replaces the salt).
        acked = history.model.acked.get(attempt.idempotency_key)
        sent = None
        if acked is not None and acked.attempt_id == attempt.attempt_id:
            sent = {
                "tenant": acked.tenant,
                "tool_name": acked.tool,
                "idempotency_key": acked.key,
                "task_id": f"task-{acked.key}",
            }
            if attempt.args != verify_export.ERASED_ARGS:
                sent["args"] = acked.args
        for problem in verify_export.receipt_problems(body, keys, sent=sent):
            receipts.append(f"receipt: {attempt.attempt_id}: {problem}")
    found["receipts"] = receipts
    return found
