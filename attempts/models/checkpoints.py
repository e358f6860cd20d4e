"""Seals over the history: checkpoints, the transparency log's leaves and stored hashes, and
the signatures and witnesses of its checkpoints (attempts/chain.py, attempts/log.py).
"""

from __future__ import annotations

from django.db import models


class Checkpoint(models.Model):
    """A seal over the history: the Merkle root of the attempt chain heads written since the
    checkpoint before it (``CheckpointLeaf``), the config chain's head, and that checkpoint's hash.
    Keeping the newest checkpoint's hash outside the database is what makes rewriting everything
    up to it detectable (docs/audit-chain.md)."""

    seq = models.PositiveIntegerField(unique=True)
    prev_hash = models.CharField(max_length=64)
    root = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    config_length = models.PositiveIntegerField()
    config_head = models.CharField(max_length=64)
    sealed_at = models.DateTimeField()
    hash = models.CharField(max_length=64, unique=True)
    # Format 1: root and size of this checkpoint's own leaves. Format 2 (the transparency log,
    # attempts/log.py): root and size of the whole log, the authority digest, and the text of
    # its C2SP checkpoint note (signed after sealing, CheckpointSignature).
    format = models.PositiveSmallIntegerField(default=1)
    authority = models.CharField(max_length=64, blank=True, default="")
    note = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"checkpoint {self.seq} {self.hash[:12]}"


class CheckpointLeaf(models.Model):
    """One attempt's chain head as a checkpoint sealed it: the attempt's public id (kept as text,
    so a deleted attempt still shows), how many events its chain had and the newest one's hash."""

    # No index of its own: the unique (checkpoint, position) index starts with it.
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.PROTECT, related_name="leaves", db_index=False
    )
    position = models.PositiveIntegerField()
    attempt_id = models.CharField(max_length=32)
    length = models.PositiveIntegerField()
    head = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "position"], name="checkpointleaf_unique_position"
            )
        ]
        indexes = [models.Index(fields=["attempt_id", "checkpoint"], name="leaf_attempt_idx")]

    def __str__(self) -> str:
        return f"{self.attempt_id}@{self.length} in checkpoint {self.checkpoint_id}"


class LogEntry(models.Model):
    """A sealed chain head's place in the transparency log (attempts/log.py): leaf ``index``."""

    index = models.PositiveBigIntegerField(unique=True)
    leaf = models.OneToOneField(CheckpointLeaf, on_delete=models.PROTECT, related_name="log_entry")

    def __str__(self) -> str:
        return f"log leaf {self.index}"


class LogNode(models.Model):
    """A stored hash of the log: the root of the complete subtree of 2**level leaves starting at
    leaf ``index * 2**level`` (level 0: the leaf hashes). Proofs and tiles read these, never the
    whole log."""

    level = models.PositiveSmallIntegerField()
    index = models.PositiveBigIntegerField()
    hash = models.BinaryField(max_length=32)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["level", "index"], name="lognode_unique_place")
        ]

    def __str__(self) -> str:
        return f"log node {self.level}/{self.index}"


class CheckpointSignature(models.Model):
    """One signature line of a checkpoint note: the log's own (``log``) or a witness's
    cosignature (``witness``), kept exactly as the note carries it."""

    class Kind(models.TextChoices):
        LOG = "log", "log"
        WITNESS = "witness", "witness"

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="signatures")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=200)
    key_id = models.CharField(max_length=8)
    line = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "kind", "name", "key_id"], name="checkpointsig_unique_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} signature {self.name} on checkpoint {self.checkpoint_id}"


class WitnessState(models.Model):
    """What the publisher knows of one configured witness: the tree size it last cosigned, and
    how its newest submission went."""

    class Status(models.TextChoices):
        OK = "ok", "up to date"
        BEHIND = "behind", "behind"
        REFUSED = "refused", "refused"
        UNREACHABLE = "unreachable", "unreachable"

    name = models.CharField(max_length=200, unique=True)
    size = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.BEHIND)
    message = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"witness {self.name}: {self.status} at {self.size}"
