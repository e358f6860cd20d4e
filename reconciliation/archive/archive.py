"""``ledgerweb archive run``: write what the retention rules say to an archive, check it where it
landed, record it in the history, then remove those attempts from the database.

The order is what makes it safe to stop at any point:

1. Each batch of eligible attempts (``retention.py``) becomes one gzip-compressed JSON Lines
   file: per attempt its row, its events, its approvals, its erasure requests (each one
   decided: an attempt with a pending request is not archived) and its receipt (the newest signed
   checkpoint and the inclusion proof of the attempt's sealed chain head in it). Then the
   manifest: counts, each file's SHA-256 and the checkpoint. Nothing in the database changes.
2. The archive is read back from the store and verified (``verify_export.check_archive``).
3. One short transaction records it: an ``Archive`` row and a configuration-history event
   ``archive:<name> archived`` carrying the manifest's SHA-256 (sealed by the next checkpoint).
4. Small transactions, one batch each, remove the attempts: each is re-read and removed only if
   it is unchanged since it was written (same chain head), listed first in ``ArchivedAttempt``
   (the row the events' append-only trigger checks: nothing else can delete an event).

A stop before 3 leaves files no history names (a later run writes a new archive); a stop during 4
leaves the rest of the batch in the database, where a later run archives it again. The log's
tree keeps every leaf: checkpoints that sealed removed attempts stay verifiable, and the archive
proves what they sealed.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import json
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.utils import timezone

from attempts import log
from attempts.actors import Actor
from attempts.chain import record_config_change
from attempts.locking import write_transaction
from attempts.models import (
    Approval,
    Archive,
    ArchivedAttempt,
    Attempt,
    AttemptEvent,
    Checkpoint,
    CheckpointLeaf,
    ErasureRequest,
    Notification,
    RetentionRule,
    SlaEscalation,
)
from attempts.verify_export import (
    ARCHIVE_FORMAT,
    ARCHIVE_MANIFEST,
    ARCHIVE_VERSION,
    chain_time,
    check_archive,
)
from reconciliation.archive.record import ATTEMPT_COLUMNS, EVENT_COLUMNS, to_line
from reconciliation.archive.retention import eligible_for
from reconciliation.archive.store import Store, StoreError

DEFAULT_BATCH = 500


class ArchiveError(Exception):
    """An archive run that cannot go on; nothing was removed from the database."""


@dataclass
class Written:
    """One attempt as written: what the removal re-checks before it deletes the row."""

    pk: int
    attempt_id: str
    tenant_id: str
    tool_name: str
    idempotency_key: str
    provider_request_id: str
    result_ref: str
    state: str
    chain_length: int
    chain_head: str
    created_at: dt.datetime
    erasure_requests: int  # in its line: a request made since keeps the attempt in place


@dataclass
class RunResult:
    name: str = ""
    location: str = ""
    manifest_sha256: str = ""
    attempts: int = 0
    events: int = 0
    removed: int = 0
    kept: int = 0  # changed since written, or not in a signed checkpoint yet: left in place
    by_rule: dict[str, int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def _when(value: dt.datetime | None) -> str | None:
    return chain_time(value) if value is not None else None


def records(
    batch: list[Attempt], checkpoint: Checkpoint, note: str
) -> list[tuple[Attempt, dict[str, Any] | None]]:
    """Each attempt of ``batch`` with its archive line: the attempt, its events, approvals and
    erasure requests, and its receipt into ``checkpoint`` (None when its current state is not
    in that checkpoint's tree). One query each for the batch's leaves, events, approvals and
    erasure requests."""
    ids = [a.attempt_id for a in batch]
    pks = [a.pk for a in batch]
    leaves: dict[str, tuple[int, str, int]] = {}
    for attempt_id, length, head, index in (
        CheckpointLeaf.objects.filter(attempt_id__in=ids, log_entry__isnull=False)
        .order_by("checkpoint__seq")
        .values_list("attempt_id", "length", "head", "log_entry__index")
    ):
        leaves[attempt_id] = (length, head, index)  # the newest checkpoint's last
    events = _per_attempt(
        pks,
        AttemptEvent.objects.filter(attempt_id__in=pks).order_by("attempt_id", "id"),
        lambda event: to_line(EVENT_COLUMNS, event, {"id": event.id}),
    )
    approvals = _per_attempt(
        pks,
        Approval.objects.filter(attempt_id__in=pks).select_related("approver", "policy"),
        _approval_line,
    )
    erasures = _per_attempt(
        pks,
        ErasureRequest.objects.filter(attempt_id__in=pks).select_related(
            "requested_by", "decided_by"
        ),
        _erasure_line,
    )
    proofs = log.inclusion_proofs(
        {leaf[2] for leaf in leaves.values() if leaf[2] < checkpoint.size}, checkpoint.size
    )
    out: list[tuple[Attempt, dict[str, Any] | None]] = []
    for attempt in batch:
        leaf = leaves.get(attempt.attempt_id)
        if (
            leaf is None
            or leaf[:2] != (attempt.chain_length, attempt.chain_head)
            or leaf[2] >= checkpoint.size
            or len(events[attempt.pk]) != attempt.chain_length
        ):
            out.append((attempt, None))
            continue
        line = _line(
            attempt,
            events[attempt.pk],
            approvals[attempt.pk],
            erasures[attempt.pk],
            leaf[2],
            proofs[leaf[2]],
        )
        line["receipt"]["tree_size"], line["receipt"]["checkpoint"] = checkpoint.size, note
        out.append((attempt, line))
    return out


def _per_attempt(
    pks: list[int], rows: Any, as_line: Callable[[Any], dict[str, Any]]
) -> dict[int, list[dict[str, Any]]]:
    """Each of ``pks`` with the lines of its ``rows`` (by their ``attempt_id``), in their order."""
    out: dict[int, list[dict[str, Any]]] = {pk: [] for pk in pks}
    for row in rows:
        out[row.attempt_id].append(as_line(row))
    return out


def _approval_line(approval: Approval) -> dict[str, Any]:
    return {
        "approver": approval.approver.get_username(),
        "args_hash": approval.args_hash,
        "policy": approval.policy.name,
        "policy_version": approval.policy_version,
        "created_at": _when(approval.created_at),
        "expires_at": _when(approval.expires_at),
    }


def _erasure_line(request: ErasureRequest) -> dict[str, Any]:
    """Who asked to erase the attempt, and who decided (the erasure event records the same of an
    erasure that was done; a withdrawn request is only here)."""
    return {
        "requested_by": request.requested_by.get_username(),
        "reason": request.reason,
        "requested_at": _when(request.requested_at),
        "status": request.status,
        "decided_by": request.decided_by.get_username() if request.decided_by else None,
        "decided_at": _when(request.decided_at),
    }


def _line(
    attempt: Attempt,
    events: list[dict[str, Any]],
    approvals: list[dict[str, Any]],
    erasures: list[dict[str, Any]],
    index: int,
    proof: list[bytes],
) -> dict[str, Any]:
    return {
        "attempt": to_line(
            ATTEMPT_COLUMNS,
            attempt,
            {
                "parent_attempt_id": attempt.parent.attempt_id if attempt.parent_id else None,
                "owner": attempt.owner.get_username() if attempt.owner_id else None,
                "approval_policy": (
                    attempt.approval_policy.name if attempt.approval_policy_id else None
                ),
            },
        ),
        "events": events,
        "approvals": approvals,
        "erasures": erasures,
        "receipt": {
            "leaf": {
                "attempt_id": attempt.attempt_id,
                "length": attempt.chain_length,
                "head": attempt.chain_head,
            },
            "index": index,
            "tree_size": None,
            "checkpoint": None,
            "inclusion_proof": [base64.b64encode(h).decode() for h in proof],
        },
    }


def plan(*, now: dt.datetime | None = None) -> list[tuple[RetentionRule, int]]:
    """Each retention rule with how many attempts it would archive now (``--dry-run``)."""
    now = now or timezone.now()
    rules = RetentionRule.objects.order_by("tenant_id", "tool_id")
    return [(rule, eligible_for(rule, now).count()) for rule in rules]


def run(
    *,
    store: Store,
    actor: Actor,
    batch_size: int = DEFAULT_BATCH,
    limit: int | None = None,
    now: dt.datetime | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> RunResult:
    """Archive and remove what the retention rules say (see the module's docstring). Raises
    ArchiveError (nothing removed) when there is no signed checkpoint or the store fails."""
    if batch_size < 1:
        raise ArchiveError("the batch size must be 1 or more")
    now = now or timezone.now()
    checkpoint = log.newest_signed()
    if checkpoint is None:
        raise ArchiveError(
            "no signed checkpoint: archived attempts carry receipts, which need the log's "
            "signing key (docs/audit-chain.md) and a reconcile worker that has sealed and signed"
        )
    note = log.signed_note(checkpoint)
    result = RunResult(name=now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4))
    written: list[Written] = []
    files: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    try:
        _write_files(
            store, result, written, files, rules, checkpoint=checkpoint, note=note, now=now,
            batch_size=batch_size, limit=limit, say=say,
        )  # fmt: skip
        result.attempts = len(written)
        if not written:
            result.lines.append("nothing to archive: no attempt is past its retention rule")
            return result
        manifest = _manifest(result, rules, files, checkpoint=checkpoint, note=note, now=now)
        raw = (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode()
        store.put(result.name, ARCHIVE_MANIFEST, raw)
        result.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        result.location = store.location(result.name)
        # What landed is what we meant to write, before anything is removed.
        check = check_archive(
            store.reader(result.name), name=result.name, expect_sha256=result.manifest_sha256
        )
    except StoreError as exc:
        raise ArchiveError(f"{exc} (nothing was removed from the database)") from None
    if not check.ok or len(check.leaves) != result.attempts:
        raise ArchiveError(
            f"the archive {result.location} does not verify where it was written: "
            f"{check.problems[0] if check.problems else 'attempts missing'} (nothing was removed)"
        )
    archive = _record(result, checkpoint, actor=actor, now=now)
    say(f"recorded archive {result.name} ({result.manifest_sha256}) in the history")
    for start in range(0, len(written), batch_size):
        removed, kept = _remove(archive, written[start : start + batch_size], now=now)
        result.removed += removed
        result.kept += kept
    result.lines.append(
        f"archived {result.attempts} attempts ({result.events} events) to {result.location}; "
        f"manifest SHA-256 {result.manifest_sha256}; removed {result.removed} from the database"
        + (f", left {result.kept} in place (not sealed in a signed checkpoint, or changed)")
        * bool(result.kept)
    )
    return result


def _write_files(
    store: Store,
    result: RunResult,
    written: list[Written],
    files: list[dict[str, Any]],
    rules: list[dict[str, Any]],
    *,
    checkpoint: Any,
    note: str,
    now: dt.datetime,
    batch_size: int,
    limit: int | None,
    say: Callable[[str], None],
) -> None:
    """Write the archive's files, rule by rule, in batches of ``batch_size`` attempts (up to
    ``limit``): what was written goes to ``written``, each file to ``files``, each rule to
    ``rules``."""
    for rule in RetentionRule.objects.order_by("tenant_id", "tool_id"):
        key = f"{rule.tenant_id}/{rule.tool_id}"
        rules.append(
            {
                "tenant": rule.tenant_id,
                "tool": rule.tool_id,
                "archive_after_days": rule.archive_after_days,
            }
        )
        result.by_rule[key] = 0
        last = 0
        while limit is None or len(written) < limit:
            size = batch_size if limit is None else min(batch_size, limit - len(written))
            batch = list(
                eligible_for(rule, now)
                .filter(pk__gt=last)
                .select_related("parent", "owner", "approval_policy")
                .order_by("pk")[:size]
            )
            if not batch:
                break
            last = batch[-1].pk
            lines, events = [], 0
            for attempt, record in records(batch, checkpoint, note):
                if record is None:
                    result.kept += 1
                    continue
                lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
                events += len(record["events"])
                written.append(_written(attempt, len(record["erasures"])))
            if not lines:
                continue
            data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
            name = f"attempts-{len(files) + 1:05d}.jsonl.gz"
            store.put(result.name, name, data)
            files.append(
                {
                    "name": name,
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data),
                    "attempts": len(lines),
                    "events": events,
                }
            )
            result.by_rule[key] += len(lines)
            result.events += events
            say(f"wrote {name}: {len(lines)} attempts of {key}")


def _manifest(
    result: RunResult,
    rules: list[dict[str, Any]],
    files: list[dict[str, Any]],
    *,
    checkpoint: Any,
    note: str,
    now: dt.datetime,
) -> dict[str, Any]:
    """The archive's manifest: what it holds, under which rules, and the signed checkpoint
    its receipts prove into."""
    return {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "name": result.name,
        "created_at": chain_time(now),
        "attempts": result.attempts,
        "events": result.events,
        "rules": rules,
        "checkpoint": {
            "seq": checkpoint.seq,
            "hash": checkpoint.hash,
            "size": checkpoint.size,
            "note": note,
        },
        "files": files,
    }


def _written(attempt: Attempt, erasure_requests: int) -> Written:
    return Written(
        pk=attempt.pk,
        attempt_id=attempt.attempt_id,
        tenant_id=attempt.tenant_id,
        tool_name=attempt.tool_name,
        idempotency_key=attempt.idempotency_key,
        provider_request_id=attempt.provider_request_id,
        result_ref=attempt.result_ref,
        state=attempt.state,
        chain_length=attempt.chain_length,
        chain_head=attempt.chain_head,
        created_at=attempt.created_at,
        erasure_requests=erasure_requests,
    )


def _record(result: RunResult, checkpoint: Checkpoint, *, actor: Actor, now) -> Archive:
    with write_transaction():
        archive = Archive.objects.create(
            name=result.name,
            location=result.location,
            manifest_sha256=result.manifest_sha256,
            attempts=result.attempts,
            events=result.events,
            checkpoint_seq=checkpoint.seq,
            created_at=now,
        )
        record_config_change(
            subject=f"archive:{result.name}",
            action="archived",
            actor=actor,
            before=None,
            after={
                "location": result.location,
                "manifest_sha256": result.manifest_sha256,
                "attempts": result.attempts,
                "events": result.events,
                "checkpoint_seq": checkpoint.seq,
                "checkpoint_hash": checkpoint.hash,
                "rules": result.by_rule,
            },
            reason="ledgerweb archive run",
            now=now,
        )
    return archive


def _remove(archive: Archive, batch: list[Written], *, now: dt.datetime) -> tuple[int, int]:
    """Remove one batch in one short transaction: only attempts unchanged since they were
    written (the same chain head and erasure requests) and with no linked attempt left.
    Returns (removed, kept)."""
    by_pk = {w.pk: w for w in batch}
    with write_transaction():
        rows = Attempt.objects.filter(pk__in=list(by_pk))
        if connection.vendor == "postgresql":
            rows = rows.select_for_update()
        current = {
            pk: (length, head, sealed)
            for pk, length, head, sealed in rows.values_list(
                "pk", "chain_length", "chain_head", "sealed"
            )
        }
        with_children = set(
            Attempt.objects.filter(parent_id__in=list(by_pk)).values_list("parent_id", flat=True)
        )
        requests = Counter(
            ErasureRequest.objects.filter(attempt_id__in=list(by_pk)).values_list(
                "attempt_id", flat=True
            )
        )
        gone = [
            w
            for w in batch
            if current.get(w.pk) == (w.chain_length, w.chain_head, True)
            and w.pk not in with_children
            and requests[w.pk] == w.erasure_requests
        ]
        pks = [w.pk for w in gone]
        if not pks:
            return 0, len(batch)
        ArchivedAttempt.objects.bulk_create(
            ArchivedAttempt(
                row_id=w.pk,
                attempt_id=w.attempt_id,
                archive=archive,
                tenant_id=w.tenant_id,
                tool_name=w.tool_name,
                idempotency_key=w.idempotency_key,
                provider_request_id=w.provider_request_id,
                result_ref=w.result_ref,
                state=w.state,
                chain_length=w.chain_length,
                chain_head=w.chain_head,
                created_at=w.created_at,
                archived_at=now,
            )
            for w in gone
        )
        Notification.objects.filter(attempt_id__in=pks).delete()
        SlaEscalation.objects.filter(attempt_id__in=pks).delete()
        marks = ", ".join(["%s"] * len(pks))
        with connection.cursor() as cursor:
            # Raw: the ORM's delete would collect (and refuse, PROTECT) what we remove here.
            cursor.execute(f"DELETE FROM attempts_approval WHERE attempt_id IN ({marks})", pks)  # noqa: S608
            requests_sql = f"DELETE FROM attempts_erasurerequest WHERE attempt_id IN ({marks})"  # noqa: S608
            cursor.execute(requests_sql, pks)
            cursor.execute(f"DELETE FROM attempts_attemptevent WHERE attempt_id IN ({marks})", pks)  # noqa: S608
            cursor.execute(f"DELETE FROM attempts_attempt WHERE id IN ({marks})", pks)  # noqa: S608
    return len(pks), len(batch) - len(pks)
