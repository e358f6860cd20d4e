"""Who or what acts on the ledger: recorded on every event and every configuration change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attempts.models import ActorKind


@dataclass(frozen=True, slots=True)
class Actor:
    """Who or what acts: recorded on every event."""

    kind: str
    name: str
    user_id: int | None = None
    # An agent token's issuer (username; empty when none): a recorder of what the token records.
    issuer: str = ""

    @classmethod
    def agent(cls, name: str, *, issuer: str = "") -> Actor:
        return cls(ActorKind.AGENT, name, issuer=issuer or "")

    @classmethod
    def worker(cls, name: str) -> Actor:
        return cls(ActorKind.WORKER, name)

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(ActorKind.USER, user.get_username(), user.pk)

    @classmethod
    def system(cls, name: str = "ledgerweb") -> Actor:
        return cls(ActorKind.SYSTEM, name)
