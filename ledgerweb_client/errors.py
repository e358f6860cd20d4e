"""Exceptions of the ledgerweb client.

Two families live here, and they point in opposite directions:

* ``LedgerError`` and its subclasses are raised *by the client* when the ledger answers with an
  error, answers something that is not the contract, or cannot be reached.
* ``ProviderError`` and its subclasses are raised *by the caller's send function* (the code that
  talks to the email, ticket or payment provider) to tell the client what happened to the send:
  ``ProviderTimeout`` and ``ProviderLostResponse`` say the outcome is unknown, ``ProviderRefused``
  says the provider definitively did not perform the effect.
"""

from __future__ import annotations

__all__ = [
    "IdempotencyConflict",
    "InvalidRequest",
    "LedgerError",
    "LedgerUnavailable",
    "NotDispatchable",
    "NotFound",
    "ProviderError",
    "ProviderLostResponse",
    "ProviderOutcomeUnknown",
    "ProviderRefused",
    "ProviderTimeout",
    "Refused",
    "StateConflict",
    "Unauthorized",
]


class LedgerError(Exception):
    """The ledger refused a call, answered outside the contract, or could not be reached.

    ``status`` is the HTTP status (``None`` when no answer arrived), ``code`` the machine-readable
    error code from ``{"error": {"code": ...}}`` (``None`` when the answer carried none) and
    ``message`` the human-readable text.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.append(f"code={self.code}")
        if self.status is not None:
            parts.append(f"status={self.status}")
        if len(parts) == 1:
            return self.message
        return f"{parts[0]} ({', '.join(parts[1:])})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status={self.status!r}, code={self.code!r})"
        )


class IdempotencyConflict(LedgerError):
    """409 ``idempotency_conflict``: the key is recorded with other arguments, tenant or tool.

    Nothing was overwritten. The key names a *different* logical side effect than the caller
    thinks: fix the key or the arguments, never retry with a fresh random key.
    """


class StateConflict(LedgerError):
    """409: the move is not legal from the attempt's current state (or conflicts with recorded data,
    such as a different provider request id)."""


class NotDispatchable(StateConflict):
    """409 ``not_dispatchable``: this call did not claim the send, so the caller must not send.

    Someone else claimed it, it already has an outcome, or it is UNKNOWN (only reconciliation
    resends an UNKNOWN attempt, after looking it up). ``LedgerClient.dispatch`` turns this into
    ``False`` instead of raising.
    """


class Refused(LedgerError):
    """403: the token is not granted the tenant (``tenant_not_granted``) or the credential scope
    (``scope_not_granted``)."""


class Unauthorized(Refused):
    """401: the bearer token is missing, unknown or revoked."""


class InvalidRequest(LedgerError):
    """400 (malformed), 422 (invalid field, unknown tool) or 413 (too large).

    Also raised before anything is sent when the arguments cannot be encoded as JSON (``status``
    is then ``None``). Repeating the same request will not help.
    """


class NotFound(LedgerError):
    """404: no such attempt, or it belongs to a tenant this token may not see."""


class LedgerUnavailable(LedgerError):
    """The ledger itself could not be reached or failed: connection refused or dropped, timeout,
    5xx, 408 or 429.

    When this is raised by a state-changing call, the change may or may not have been committed.
    Every ledger call is idempotent, so repeating the same call later is safe; when in doubt,
    re-read the attempt with ``LedgerClient.get``.
    """


class ProviderError(Exception):
    """Base of the exceptions a caller's send function raises to describe the provider's answer.

    ``provider_request_id`` may carry the provider's id for the request when it is known even
    though the send did not succeed; the client then records it before recording the outcome.
    """

    def __init__(self, message: str = "", *, provider_request_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.provider_request_id = provider_request_id


class ProviderOutcomeUnknown(ProviderError):
    """The send may or may not have taken effect: the attempt becomes UNKNOWN.

    It is never recorded as a success and never as a failure; reconciliation looks it up later.
    """


class ProviderTimeout(ProviderOutcomeUnknown):
    """The provider did not answer in time; the request may have been performed."""


class ProviderLostResponse(ProviderOutcomeUnknown):
    """The request left but the answer was lost (connection dropped, unreadable response)."""


class ProviderRefused(ProviderError):
    """The provider definitively did not perform the effect.

    ``retryable=True`` records FAILED_RETRYABLE (it may be sent again with the same idempotency
    key); ``retryable=False`` records FAILED (it will not happen). Only raise this when the
    provider's answer proves nothing was done, e.g. a validation error or a 4xx it documents as
    side-effect free; when in doubt, raise ``ProviderLostResponse`` instead.
    """

    def __init__(
        self,
        reason: str,
        retryable: bool = False,
        *,
        provider_request_id: str | None = None,
    ):
        super().__init__(reason, provider_request_id=provider_request_id)
        self.reason = reason
        self.retryable = retryable

    def __repr__(self) -> str:
        return f"ProviderRefused({self.reason!r}, retryable={self.retryable!r})"
