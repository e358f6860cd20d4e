"""The tamper-evident history: how an event is linked into its attempt's chain, how the sealer
puts every chain head into a checkpoint, and the chain of configuration changes.

- Each attempt has its own hash chain: an event's ``prev_hash`` is the hash of the attempt's event
  before it (GENESIS for its first). The attempt row carries the newest hash (``chain_head``) and
  the count (``chain_length``), and ``states.move`` changes them in the same compare-and-set as
  the version, so a write waits for nobody but writers of the same attempt.
- The sealer (``seal``, run every few seconds by the reconcile worker) takes every attempt whose
  chain grew since it was last sealed, appends their (attempt id, length, head) leaves to the
  transparency log (``attempts.log``: one Merkle tree over every sealed leaf) and appends a
  ``Checkpoint`` (the log's size and root, format 2) that hashes the one before it; the log key
  signs it after the transaction. A sealed head commits to the
  attempt's whole history up to it; the newest checkpoint's hash, kept outside the database,
  commits to every checkpoint and so to every sealed event.
- Configuration changes that decide authority or review are ``ConfigEvent`` rows in one chain of
  their own, which every checkpoint seals too.

The hash formats live in ``attempts.verify_export``, the standalone verifier an auditor runs, so
the writer and every verifier share one implementation. See docs/audit-chain.md.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import rfc8785
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import Min, Q
from django.utils import timezone

from attempts import dbadapter, jcs, log
from attempts.canonical import InvalidArguments
from attempts.event_row import EventRow
from attempts.locking import named_lock, write_transaction
from attempts.models import Attempt, Checkpoint, CheckpointLeaf, ConfigEvent
from attempts.verify_export import (
    CHAIN_FORMAT,
    ERASED_TEXT,
    GENESIS,
    LOG_FORMAT,
    SALTED_FORMAT,
    args_commitment,
    checkpoint_hash,
    config_event_hash,
    event_hash,
    leaf_hash,
    text_digest,
)

if TYPE_CHECKING:
    from attempts.actors import Actor

logger = logging.getLogger(__name__)

# Attempts sealed into one checkpoint at most; a larger backlog takes several.
SEAL_BATCH = 5000
# How many (id, length) pairs one "mark sealed" UPDATE names.
_MARK_CHUNK = 200
# The authority digest's function (``use_authority_digest``).
_authority_digest: Callable[[], str] | None = None


def new_salt() -> str:
    """A fresh per-attempt salt for the salted digests of chain format 3 (256 random bits)."""
    return secrets.token_hex(32)


def args_digest(salt: str, args: Any, *, canonical: bytes | None = None) -> str:
    """The salted digest of normalized arguments a format-3 creation event records;
    ``canonical``: their RFC 8785 bytes, when the caller has them (``normalize_args``'s)."""
    return args_commitment(salt, args, dumps=jcs.dumps, canonical=canonical)


def attempt_event(
    attempt: Attempt,
    *,
    action: str,
    actor: Actor,
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    details: dict[str, Any] | None = None,
    now: dt.datetime,
) -> EventRow:
    """The attempt's next event, linked after its current chain head (not yet written).

    An attempt with a salt (``args_salt``) is chained in format 3: its free text (the reason
    and the details ``verify_export.PUBLIC_DETAILS`` does not name) is committed by a salted
    digest, so erasure can remove it. Raises InvalidArguments for details the chain could not
    hash reproducibly (not JSON)."""
    details = details or {}
    prev_hash = attempt.chain_head if attempt.chain_length else GENESIS
    salt = attempt.args_salt
    chain_format = SALTED_FORMAT if salt else CHAIN_FORMAT
    text = ""
    if salt:
        if reason == ERASED_TEXT:
            raise InvalidArguments(f"{ERASED_TEXT!r} is the erasure marker: write something else")
        try:
            text = text_digest(salt, reason, details, dumps=jcs.dumps)
        except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
            raise InvalidArguments(f"event details are not JSON: {exc}") from None
    row = {
        "v": chain_format,
        "attempt_id": attempt.attempt_id,
        "action": action,
        "actor_kind": actor.kind,
        "actor": actor.name,
        "from_state": from_state,
        "to_state": to_state,
        "reason": reason,
        "details": details,
        "created_at": now,
        "prev_hash": prev_hash,
        "text_digest": text,
    }
    try:
        digest = event_hash(row, dumps=jcs.dumps)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidArguments(f"event details are not JSON: {exc}") from None
    return EventRow(
        action,
        actor.kind,
        actor.name,
        from_state,
        to_state,
        reason,
        details,
        now,
        prev_hash,
        digest,
        chain_format,
        text,
    )


# ---------------------------------------------------------------------------------------------
# Sealing


def seal(*, limit: int = SEAL_BATCH, now: dt.datetime | None = None) -> Checkpoint | None:
    """Seal the chain heads written since the last checkpoint (up to ``limit`` attempts) and the
    config chain's head into a new checkpoint. Returns it, or None when nothing changed.

    Safe to run in any number of workers at once: checkpoints are appended under a lock only
    sealers take. An attempt written to while it is being sealed stays unsealed (its mark is a
    compare-and-set on its chain length) and goes into the next checkpoint."""
    now = now or timezone.now()
    with write_transaction():
        named_lock("ledgerweb:checkpoints")
        pending = Attempt.objects.filter(sealed=False).order_by("id")
        if connection.vendor == "postgresql":
            # Lock what is sealed and pass over rows a writer holds: the sealer then never waits
            # for a writer, so a writer (which may hold several rows) can never deadlock with it.
            # A skipped attempt goes into the next checkpoint.
            pending = pending.select_for_update(skip_locked=True)
        rows = list(pending.values_list("id", "attempt_id", "chain_length", "chain_head")[:limit])
        # Leaves sealed before the log existed (format-1 checkpoints) join it first, in the
        # order they were sealed, so every sealed head has an inclusion proof. Only those can
        # lack an entry (a later checkpoint's leaves get theirs in the transaction that makes
        # them), so the few old checkpoints are looked up first: asking every leaf whether it
        # has an entry read both tables whole on every seal (docs/scaling.md, "An idle seal").
        backlog = list(
            CheckpointLeaf.objects.filter(checkpoint__format__lt=LOG_FORMAT, log_entry__isnull=True)
            .order_by("checkpoint__seq", "position")
            .values_list("id", "attempt_id", "length", "head")[: max(0, limit - len(rows))]
        )
        last = Checkpoint.objects.order_by("-seq").first()
        config_length, config_head = config_head_now()
        if not rows and not backlog and _config_sealed(last, config_length, config_head):
            return None
        rows.sort(key=lambda row: row[1])
        leaves = [leaf_hash(attempt_id, length, head) for _, attempt_id, length, head in rows]
        old_size = log.log_size()
        size, root = log.append(
            [leaf_hash(a, length, head) for _, a, length, head in backlog] + leaves,
            size=old_size,
        )
        seq = last.seq + 1 if last else 1
        authority = _authority()
        fields = {
            "seq": seq,
            "prev_hash": last.hash if last else GENESIS,
            "root": root.hex(),
            "size": size,
            "config_length": config_length,
            "config_head": config_head,
            "sealed_at": now,
            "format": LOG_FORMAT,
            "authority": authority,
        }
        note = log.checkpoint_text(
            seq=seq,
            size=size,
            root=root,
            config_length=config_length,
            config_head=config_head,
            authority=authority,
        )
        checkpoint = Checkpoint.objects.create(**fields, note=note, hash=checkpoint_hash(fields))
        leaf_ids = [pk for pk, *_ in backlog] + _store_leaves(checkpoint, rows)
        log.record_entries(old_size, leaf_ids)
        _mark_sealed(rows)
    _sign(checkpoint)
    return checkpoint


def _config_sealed(last: Checkpoint | None, config_length: int, config_head: str) -> bool:
    """Whether the config chain is as the newest checkpoint sealed it (or empty, with none)."""
    if last is None:
        return config_length == 0
    return (last.config_length, last.config_head) == (config_length, config_head)


def _store_leaves(checkpoint: Checkpoint, rows: list[tuple]) -> list[int]:
    """The checkpoint's leaves, one per sealed head in ``rows``' order; returns their ids."""
    created = CheckpointLeaf.objects.bulk_create(
        [
            CheckpointLeaf(
                checkpoint=checkpoint,
                position=position,
                attempt_id=attempt_id,
                length=length,
                head=head,
            )
            for position, (_, attempt_id, length, head) in enumerate(rows)
        ],
        batch_size=1000,
    )
    ids = [leaf.pk for leaf in created]
    if None in ids:  # a backend that does not return ids from a bulk insert
        ids = list(
            CheckpointLeaf.objects.filter(checkpoint=checkpoint)
            .order_by("position")
            .values_list("pk", flat=True)
        )
    return ids


def _mark_sealed(rows: list[tuple]) -> None:
    """Mark each attempt sealed if its chain is still as long as what was sealed (a write since
    leaves it for the next checkpoint)."""
    for start in range(0, len(rows), _MARK_CHUNK):
        match = Q()
        for pk, _, length, _ in rows[start : start + _MARK_CHUNK]:
            match |= Q(pk=pk, chain_length=length)
        Attempt.objects.filter(match).update(sealed=True)


def use_authority_digest(digest: Callable[[], str]) -> None:
    """Give sealing the function whose answer each checkpoint records as its authority digest
    (``config_history.authority_digest``, given by ``AttemptsConfig.ready``). Passed in, not
    imported: config_history records its own changes through this module."""
    global _authority_digest
    _authority_digest = digest


def _authority() -> str:
    if _authority_digest is None:
        raise RuntimeError("sealing has no authority digest: AttemptsConfig.ready gives it one")
    return _authority_digest()


def _sign(checkpoint: Checkpoint) -> None:
    """Sign what was just sealed, after the sealer's transaction: a slow signing command never
    holds the sealer's lock or a writer. A failure leaves the checkpoint unsigned (never served
    as signed) and the worker's next turn retries it (``log.sign_pending``)."""
    try:
        log.sign_pending()
    except (log.LogKeyError, OSError) as exc:
        logger.warning("checkpoint %s stays unsigned for now: %s", checkpoint.seq, exc)


def config_head_now() -> tuple[int, str]:
    """(length, head hash) of the config chain."""
    newest = ConfigEvent.objects.order_by("-seq").values_list("seq", "hash").first()
    return newest if newest else (0, GENESIS)


def unsealed_window(now: dt.datetime | None = None) -> dict[str, Any]:
    """What no checkpoint covers yet: how many attempts have unsealed events, and how old the
    oldest such change is (seconds), beside the newest checkpoint and the sealing interval."""
    now = now or timezone.now()
    pending = Attempt.objects.filter(sealed=False)
    oldest = pending.aggregate(oldest=Min("updated_at"))["oldest"]
    last = Checkpoint.objects.order_by("-seq").values("seq", "hash", "sealed_at").first()
    config_length, _ = config_head_now()
    config_pending = config_length - (
        Checkpoint.objects.order_by("-seq").values_list("config_length", flat=True).first() or 0
    )
    return {
        "attempts": pending.count(),
        "config_changes": config_pending,
        "oldest_seconds": (now - oldest).total_seconds() if oldest else 0.0,
        "checkpoint": last,
        "seal_every": settings.LEDGER["SEAL_EVERY"],
    }


# ---------------------------------------------------------------------------------------------
# Configuration history


def _plain(value: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """``value`` as plain JSON (dates and decimals as text), refused if it cannot be hashed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict or None")
    plain = json.loads(json.dumps(value, cls=DjangoJSONEncoder))
    rfc8785.dumps(plain)  # raises for what the chain could not hash reproducibly
    return plain


def record_config_change(
    *,
    subject: str,
    action: str,
    actor: Actor,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    reason: str = "",
    now: dt.datetime | None = None,
) -> ConfigEvent:
    """Append one configuration change (who changed ``subject`` from ``before`` to ``after``) to
    the config chain. Call inside ``write_transaction()``, in the transaction that makes the
    change, so the change and its record commit together."""
    if not dbadapter.in_atomic_block(connection):
        raise RuntimeError("record_config_change() must run inside write_transaction()")
    if not subject or not action:
        raise ValueError("a config change needs a subject and an action")
    now = now or timezone.now()
    before, after = _plain(before, "before"), _plain(after, "after")
    named_lock("ledgerweb:config")
    length, head = config_head_now()
    row = {
        "seq": length + 1,
        "subject": subject,
        "action": action,
        "actor_kind": actor.kind,
        "actor": actor.name,
        "before": before,
        "after": after,
        "reason": reason,
        "created_at": now,
        "prev_hash": head,
    }
    event = ConfigEvent(**row, hash=config_event_hash(row))
    event.save(force_insert=True)
    return event
