"""The permanent indexes that outlive archiving: every idempotency key ever recorded, and which
attempt claimed each provider effect (protocol section 7).
"""

from __future__ import annotations

import hashlib

from django.db import models


def key_digest(idempotency_key: str) -> str:
    """The lowercase hex SHA-256 of an idempotency key's UTF-8: how ``RecordedKey`` names it."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class RecordedKey(models.Model):
    """The permanent index of every idempotency key ever recorded (protocol section 7,
    invariant 11), append-only: its primary key is THE uniqueness check of a new intent, live
    or archived. Kept as the key's digest, so a key that carries a person's data is not copied
    where erasure may never reach it. An empty ``args_hash``: archived before this index
    existed (migration 0018); such a key is refused, never sent again."""

    key_digest = models.CharField(max_length=64, primary_key=True)
    tenant_id = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=100)
    args_hash = models.CharField(max_length=64, blank=True)
    attempt_id = models.CharField(max_length=32)

    def __str__(self) -> str:
        return f"key {self.key_digest[:12]} -> {self.attempt_id}"


class ProviderEffect(models.Model):
    """Which attempt a provider's effect (its tool, its provider request id) belongs to: one
    effect is claimed by one attempt for the life of the ledger (protocol section 7, invariant
    12). Written by ``attempts.rows`` in the same statement or transaction as the move that
    first sets an attempt's ``provider_request_id``; its unique constraint is what makes two
    concurrent claims of one effect end with one winner (the other attempt goes to
    MANUAL_REVIEW, ``effect_claimed``). Append-only; it outlives archiving."""

    tool_name = models.CharField(max_length=100)
    provider_request_id = models.CharField(max_length=255)
    attempt_id = models.CharField(max_length=32)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tool_name", "provider_request_id"], name="provider_effect_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.provider_request_id} -> {self.attempt_id}"
