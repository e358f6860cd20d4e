"""The provider adapter interface: how the ledger sends an effect and looks it up afterwards.

An adapter talks to one provider for one tool. It never touches the database: it receives a
``Call`` (a frozen snapshot of what the ledger recorded) and answers with a ``SendAnswer`` or a
``LookupAnswer``. Network trouble is an answer (UNCERTAIN, UNAVAILABLE), never an exception, so
the reconciler can apply the decision table of protocol section 6 to every outcome. Only a
misconfigured tool raises, with ``ProviderError``.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attempts.models import Attempt, EffectClass, Tool


class ProviderError(Exception):
    """The adapter cannot be built or used. ``permanent`` says whether retrying later can help
    (a missing URL will not fix itself; a registry that failed to import might)."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class Call:
    """What an adapter may know about an attempt: exactly what the ledger recorded."""

    attempt_id: str
    tenant: str
    tool_name: str
    idempotency_key: str
    args: dict[str, Any]
    args_hash: str
    provider_request_id: str = ""
    # When the intent was recorded: nothing of this attempt can have happened before it (a
    # lookup may read only what is newer, with some slack for clocks).
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, attempt: Attempt) -> Call:
        return cls(
            attempt_id=attempt.attempt_id,
            tenant=attempt.tenant_id,
            tool_name=attempt.tool_name,
            idempotency_key=attempt.idempotency_key,
            args=attempt.args,
            args_hash=attempt.args_hash,
            provider_request_id=attempt.provider_request_id,
            created_at=attempt.created_at,
        )


class SendStatus(enum.StrEnum):
    ACCEPTED = "accepted"  # the provider took it (2xx); confirmation still needs a lookup
    REFUSED = "refused"  # the provider definitively did not perform it
    UNCERTAIN = "uncertain"  # timeout, lost response, 5xx: it may have happened


class LookupStatus(enum.StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"  # error status, timeout, connection refused
    AMBIGUOUS = "ambiguous"  # an answer that cannot be read as found or not found


@dataclass(frozen=True, slots=True)
class SendAnswer:
    status: SendStatus
    provider_request_id: str = ""
    retryable: bool = False  # for REFUSED: may the same key be sent again later?
    detail: str = ""
    http_status: int | None = None
    latency_ms: int = 0
    # Seconds the provider asked us to wait (429/503 ``Retry-After``): backoff for it alone.
    retry_after: float | None = None
    # A 2xx whose id failed validation: why, and the raw answer as evidence (see LookupAnswer).
    invalid: str = ""
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    status: LookupStatus
    provider_request_id: str = ""
    args_hash: str = ""
    # How many effects the provider holds under this key (more than one: duplicates happened).
    count: int = 1
    result_ref: str = ""
    detail: str = ""
    http_status: int | None = None
    latency_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    # A provider answer that failed validation (bad id, too large, wrong types): the reason,
    # and the raw answer, truncated and escaped, kept as evidence and never as a fact.
    invalid: str = ""
    evidence: str = ""

    def as_details(self) -> dict[str, Any]:
        """The answer as recorded in the attempt's history (JSON, integers only)."""
        details: dict[str, Any] = {"answer": str(self.status), "latency_ms": int(self.latency_ms)}
        if self.http_status is not None:
            details["http_status"] = self.http_status
        if self.provider_request_id:
            details["provider_request_id"] = self.provider_request_id
        if self.args_hash:
            details["provider_args_hash"] = self.args_hash
        if self.status == LookupStatus.FOUND and self.count != 1:
            details["count"] = self.count
        if self.detail:
            details["detail"] = self.detail[:300]
        if self.retry_after is not None:
            details["retry_after"] = round(self.retry_after, 3)
        if self.invalid:
            details["invalid"] = self.invalid[:300]
            details["evidence"] = self.evidence
        return details


class Adapter:
    """One tool's provider. Subclass it for a custom provider, list it in
    ``LEDGER["ADAPTERS"]`` under a name (``LEDGERWEB_ADAPTERS``) and choose that name in
    ``Tool.adapter``; ``send`` and ``lookup`` must be safe to call from several threads.
    """

    # Set to False in a subclass whose provider has no lookup (the manual class).
    supports_lookup: ClassVar[bool] = True

    def __init__(self, tool: Tool) -> None:
        self.tool = tool

    @property
    def effect_class(self) -> str:
        return self.tool.effect_class

    @property
    def critical(self) -> bool:
        return self.tool.critical

    @property
    def timeout(self) -> float:
        return float(self.tool.timeout_seconds)

    @property
    def can_look_up(self) -> bool:
        return self.supports_lookup and self.effect_class != EffectClass.MANUAL

    def send(self, call: Call) -> SendAnswer:
        """Send the effect with ``call.idempotency_key``. Never raises for network trouble."""
        raise NotImplementedError

    def lookup(self, call: Call) -> LookupAnswer:
        """Look the effect up by key (or a correlation field). Never raises for network
        trouble: UNAVAILABLE says the provider could not be asked."""
        raise NotImplementedError

    @classmethod
    def close_shared(cls) -> None:
        """Close what instances of this adapter share across passes (pooled sessions); the
        reconcile worker calls it as it stops. Nothing by default."""

    @property
    def provider_key(self) -> str:
        """Which provider this tool talks to, for its bulkhead (concurrency cap, circuit
        breaker, ``Retry-After``): tools on one provider share them. Default: the tool."""
        return f"tool:{self.tool.name}"

    def endpoint(self, operation: str) -> str:
        """Where calls of ``operation`` (``send`` or ``lookup``) go, as far as they fail
        together: with the operation, the key of their bulkhead (reconciliation/bulkhead.py).
        Default: the provider."""
        return self.provider_key

    def check(self) -> list[str]:
        """Configuration problems of this tool for this adapter (empty when usable)."""
        return []
