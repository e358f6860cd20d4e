"""An attempt's append-only, hash-chained history: its events and who acts."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import F, Q

from attempts import verify_export

# One person's approval, of a held intent or of a linked attempt or retry (recorded without a
# move): the only record an approval check reads (``Attempt.approval_verdicts``).
APPROVAL_ACTION = "attempt.approval"


# Field-only events that change what an operator decides on (an open form is stale after one).
DECISIVE_ACTIONS = (
    "attempt.owner_changed",
    "attempt.unassigned",
    APPROVAL_ACTION,
    "attempt.provider_request_attached",
)


# An event that changed its attempt's state: the one meaning of "a move" (approvals count from
# the last one; a form is stale after one).
MOVED = ~Q(from_state=F("to_state"))


class ActorKind(models.TextChoices):
    AGENT = "agent", "Agent"
    WORKER = "worker", "Reconciliation worker"
    USER = "user", "Person"
    SYSTEM = "system", "System"


class AttemptEvent(models.Model):
    """One entry of an attempt's history. Append-only (database triggers refuse UPDATE/DELETE),
    and chained: ``hash`` covers this event's canonical encoding and ``prev_hash``, the hash of the
    attempt's event before it (format 2; format 1, written before per-attempt chains, links to the
    event before it in the whole ledger), so any edit, deletion, insertion or reordering shows.
    See attempts/chain.py and docs/audit-chain.md.
    """

    # Looked up through event_attempt_idx (attempt, id); no second index on the column alone.
    attempt = models.ForeignKey(
        "Attempt", on_delete=models.PROTECT, related_name="events", db_index=False
    )
    action = models.CharField(max_length=64)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor = models.CharField(max_length=150)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    chain_format = models.PositiveSmallIntegerField(default=2, editable=False)
    # Format 3: the salted digest of the free text (reason and private details) the hash
    # covers instead of the text itself; kept when erasure replaces the text.
    text_digest = models.CharField(
        max_length=64, blank=True, default="", db_default="", editable=False
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["attempt", "id"], name="event_attempt_idx"),
            # The approvals alone (a few of the events): who waits for a reviewer's approval.
            models.Index(
                fields=["attempt", "id"],
                name="event_approval_idx",
                condition=Q(action=APPROVAL_ACTION),
            ),
            # The events written before per-attempt chains, which verify_audit walks in id
            # order as one chain: empty on a ledger begun since, instead of a scan of them all.
            models.Index(
                fields=["id"],
                name="event_legacy_chain_idx",
                condition=Q(chain_format=verify_export.LEGACY_FORMAT),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt_id} {self.action} {self.from_state}->{self.to_state}"

    def export_row(self, attempt_id: str) -> dict[str, Any]:
        """The event as the JSON Lines export writes it (``attempt_id``: its attempt's public
        id), before any rendering of its details: what ``verify_export`` hashes again."""
        row: dict[str, Any] = {"id": self.id, "attempt_id": attempt_id}
        row.update(
            (name, getattr(self, name))
            for name in (*verify_export.HASHED_FIELDS, "prev_hash", "hash")
            if name != "attempt_id"
        )
        row["v"] = self.chain_format
        row["text_digest"] = self.text_digest
        return row
