/**
 * The errors of the ledgerweb client, typed like the Python client's (`ledgerweb_client.errors`).
 *
 * `LedgerError` and its subclasses: the ledger refused a call, answered outside the contract, or
 * could not be reached. `ProviderError` and its subclasses: what a caller's `send` function throws
 * to describe the provider's answer.
 */

export interface LedgerErrorDetails {
  /** The HTTP status; `null` when no answer arrived. */
  status?: number | null;
  /** The machine-readable code of `{"error": {"code": ...}}`; `null` when there was none. */
  code?: string | null;
  cause?: unknown;
}

/** The ledger refused a call, answered outside the contract, or could not be reached. */
export class LedgerError extends Error {
  readonly status: number | null;
  readonly code: string | null;

  constructor(message: string, details: LedgerErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status ?? null;
    this.code = details.code ?? null;
  }
}

/** 409 `idempotency_conflict`: the key is recorded with other arguments, tenant or tool. Nothing
 * was overwritten: fix the key or the arguments, never retry with a fresh random key. */
export class IdempotencyConflict extends LedgerError {}

/** 409: the move is not legal from the attempt's current state, or conflicts with recorded data
 * (a different provider request id). */
export class StateConflict extends LedgerError {}

/** 409 `not_dispatchable`: this call did not claim the send, so the caller must not send. */
export class NotDispatchable extends StateConflict {}

/** 403: the token is not granted the tenant or the credential scope. */
export class Refused extends LedgerError {}

/** 401: the bearer token is missing, unknown or revoked. */
export class Unauthorized extends Refused {}

/** 400, 413 or 422 (or arguments that cannot be encoded as JSON): repeating it will not help. */
export class InvalidRequest extends LedgerError {}

/** 404: no such attempt, or it belongs to a tenant this token may not see. */
export class NotFound extends LedgerError {}

/** The ledger could not be reached or failed (connection error, timeout, 5xx, 408, 429). A
 * state-changing call may or may not have been committed; every ledger call is idempotent, so
 * repeating it later is safe. */
export class LedgerUnavailable extends LedgerError {}

/** Base of what a `send` function throws to describe the provider's answer. */
export class ProviderError extends Error {
  /** The provider's id for the request, when known although the send did not succeed. */
  readonly providerRequestId: string | null;

  constructor(message = "", options: { providerRequestId?: string | null; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.providerRequestId = options.providerRequestId ?? null;
  }
}

/** The send may or may not have taken effect: the attempt becomes UNKNOWN (never success, never
 * failure) and reconciliation looks it up. */
export class ProviderOutcomeUnknown extends ProviderError {}

/** The provider did not answer in time; the request may have been performed. */
export class ProviderTimeout extends ProviderOutcomeUnknown {}

/** The request left but the answer was lost. */
export class ProviderLostResponse extends ProviderOutcomeUnknown {}

/** The provider definitively did not perform the effect: FAILED_RETRYABLE when `retryable`
 * (it may be sent again with the same key), FAILED otherwise. When in doubt, throw
 * `ProviderLostResponse` instead. */
export class ProviderRefused extends ProviderError {
  readonly reason: string;
  readonly retryable: boolean;

  constructor(
    reason: string,
    retryable = false,
    options: { providerRequestId?: string | null; cause?: unknown } = {},
  ) {
    super(reason, options);
    this.reason = reason;
    this.retryable = retryable;
  }
}

/** The error class for a ledger answer with this status and code. */
export function errorClassFor(status: number, code: string | null): typeof LedgerError {
  if (status === 409) {
    if (code === "idempotency_conflict") return IdempotencyConflict;
    if (code === "not_dispatchable") return NotDispatchable;
    return StateConflict;
  }
  if (status === 400 || status === 413 || status === 422) return InvalidRequest;
  if (status === 401) return Unauthorized;
  if (status === 403) return Refused;
  if (status === 404) return NotFound;
  if (status === 408 || status === 429 || status >= 500) return LedgerUnavailable;
  return LedgerError;
}
