"""Agent tokens (only their hash is kept) and the throttle on failed log-ins."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q

from attempts.models.roles import Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who an authenticated API request acts as: the live token's id, agent name and tenants."""

    id: int
    name: str
    tenant_slugs: frozenset[str]
    # The username of whoever issued the token ("" when nobody did): a recorder of its intents.
    issuer: str = ""


class AgentToken(models.Model):
    """A bearer token for one agent identity, allowed a set of tenants. Only its hash is kept."""

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False)
    tenants = models.ManyToManyField(Tenant, related_name="agent_tokens")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    TOKEN_PREFIX = "lwt_"  # noqa: S105 (a public marker, not a secret)
    # Writing last_used_at costs a write per request; once a minute per token is enough.
    LAST_USED_RESOLUTION = 60

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_token(raw: str) -> str:
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    @classmethod
    def issue(
        cls, name: str, tenants: list[str], *, created_by: AbstractBaseUser | None = None
    ) -> tuple[AgentToken, str]:
        """Create a token for agent ``name`` allowed ``tenants``; returns (token, raw secret).

        The raw secret is shown once: only its SHA-256 is stored.
        """
        token = cls(name=name, created_by=created_by)
        raw = token.rotate_secret()
        with transaction.atomic():
            token.save(force_insert=True)
            token.tenants.set(tenants)
        return token, raw

    def rotate_secret(self) -> str:
        """Give an unsaved (admin-created) token its secret; returns the raw value, shown once."""
        raw = self.TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.token_hash = self.hash_token(raw)
        self.prefix = raw[: len(self.TOKEN_PREFIX) + 6]
        return raw

    def touch(self) -> None:
        """Record use, at most once per LAST_USED_RESOLUTION seconds per token."""
        from django.utils import timezone

        now = timezone.now()
        cutoff = now - dt.timedelta(seconds=self.LAST_USED_RESOLUTION)
        if self.last_used_at is not None and self.last_used_at > cutoff:
            return
        AgentToken.objects.filter(pk=self.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=cutoff)
        ).update(last_used_at=now)
        self.last_used_at = now

    def revoke(self) -> bool:
        """Revoke the token (idempotent). Returns whether this call revoked it."""
        from django.utils import timezone

        # A save, not a queryset update: the configuration history records it (signals).
        with transaction.atomic():
            token = AgentToken.objects.select_for_update().get(pk=self.pk)
            changed = token.revoked_at is None
            if changed:
                token.revoked_at = timezone.now()
                token.save(update_fields=["revoked_at"])
        self.revoked_at = token.revoked_at
        return changed


class LoginThrottle(models.Model):
    """Failed log-ins per (username, client address), for the dashboard's login throttling.

    Kept in the database rather than a per-process cache so every web worker sees the same count.
    ``key`` is a hash of the lowercased username and the address.
    """

    key = models.CharField(max_length=64, unique=True)
    # Who and from where, for the admin (an address-wide row has no username).
    username = models.CharField(max_length=150, blank=True, default="")
    address = models.CharField(max_length=64, blank=True, default="")
    failures = models.PositiveIntegerField(default=0)
    first_failure_at = models.DateTimeField()
    locked_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        who = self.username or "any user"
        return f"{who} from {self.address or '?'}: {self.failures} failures"
