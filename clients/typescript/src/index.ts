/**
 * ledgerweb-client: record every side effect in the ledger before it happens.
 *
 * ```ts
 * import { LedgerClient, ProviderTimeout } from "ledgerweb-client";
 *
 * const ledger = new LedgerClient("https://ledger.example.com", token);
 * const result = await ledger.call({
 *   tenant: "acme", task_id: "task-42", tool_name: "send_invoice_email",
 *   idempotency_key: "invoice:acme:2026-08-11:send",
 *   args: { to: "billing@acme.test", template: "invoice" },
 *   send: async (attempt) => ({ providerRequestId: "msg_1", resultRef: "receipt:msg_1" }),
 * });
 * ```
 */

export {
  LedgerClient,
  STATES,
  TERMINAL_STATES,
  type Attempt,
  type CallOptions,
  type CallResult,
  type ClientOptions,
  type IntentRequest,
  type SendResult,
  type State,
} from "./client.js";
export {
  IdempotencyConflict,
  InvalidRequest,
  LedgerError,
  LedgerUnavailable,
  NotDispatchable,
  NotFound,
  ProviderError,
  ProviderLostResponse,
  ProviderOutcomeUnknown,
  ProviderRefused,
  ProviderTimeout,
  Refused,
  StateConflict,
  Unauthorized,
} from "./errors.js";
export type { components, paths } from "./openapi.js";
export {
  type Checkpoint,
  canonicalJson,
  checkHistory,
  consistent,
  inclusionRoot,
  LogView,
  leafHash,
  openCheckpoint,
  type Receipt,
  ReceiptError,
  type Sent,
  type TrustOptions,
  VerifierKey,
  verifyReceipt,
} from "./receipts.js";
