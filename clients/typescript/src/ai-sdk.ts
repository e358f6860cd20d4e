/**
 * The Vercel AI SDK (`ai`, v7) with the ledger: `import { ... } from "ledgerweb-client/ai-sdk"`.
 *
 * - `ledgeredExecute(spec, execute)` wraps a tool's `execute`: every call is recorded, claimed,
 *   sent once and confirmed through `LedgerClient.call`; a repeated call answers from the
 *   ledger's record; after an edit-and-approve the corrected arguments are sent, never the
 *   original.
 * - `ledgerToolApproval(spec)` is a `toolApproval` rule: it records the call's intent (the same one
 *   the tool records: same key) and answers `user-approval` while an approval policy holds it,
 *   `denied` (with the ledger's reason) once it was rejected or expired, and `not-applicable`
 *   otherwise, so the tool runs.
 * - `ledgerApprovalResponses(requests, specs)` answers the run's `tool-approval-request`s with
 *   the ledger's decisions, as `tool-approval-response` parts for the next call (approved, or
 *   denied with the reason); the calls still held are returned as pending. Keep the messages and
 *   the requests (plain JSON) while a call is held: a restarted agent resumes from them, and the
 *   stable key sends the call once.
 *
 * Only types are imported from `ai`: the client itself needs no package at run time.
 */

import type { ToolApprovalStatus } from "ai";

import type { Attempt, IntentRequest, LedgerClient } from "./client.js";

/** How one tool's calls are recorded. */
export interface LedgerToolSpec<INPUT = Record<string, unknown>> {
  ledger: LedgerClient;
  tenant: string;
  taskId: string;
  /** The ledger's name for the tool. */
  toolName: string;
  /** The idempotency key of a call: the same input gives the same key, also after a restart. */
  key: (input: INPUT) => string;
  /** Keep the tool's output as the durable receipt (`json:` + JSON, as the Python client
   * does): it confirms the attempt and a repeated call returns it. Default true. */
  receipt?: boolean;
}

const JSON_RECEIPT_PREFIX = "json:";
const HELD = "AWAITING_APPROVAL";
const NOT_APPROVED = new Set(["approval_rejected", "approval_expired"]);

function intent<INPUT>(spec: LedgerToolSpec<INPUT>, input: INPUT) {
  return {
    tenant: spec.tenant,
    task_id: spec.taskId,
    tool_name: spec.toolName,
    idempotency_key: spec.key(input),
    args: input as unknown as IntentRequest["args"],
  };
}

function notApproved(attempt: Attempt): string | null {
  const reason = attempt.review_reason ?? "";
  if (attempt.state !== "FAILED" || !NOT_APPROVED.has(reason)) return null;
  return `ledgerweb approval_rejected: the ledger's approvers did not approve this call (${reason}); nothing was sent`;
}

function held(attempt: Attempt): string {
  return (
    "ledgerweb awaiting_approval: an approval policy holds this call until a person approves " +
    `it on the ledger; nothing was sent (attempt ${attempt.attempt_id})`
  );
}

/** Where the call stands on the ledger now (an edit-and-approve link followed). */
async function current<INPUT>(spec: LedgerToolSpec<INPUT>, input: INPUT): Promise<Attempt> {
  return spec.ledger.followLinks(await spec.ledger.recordIntent(intent(spec, input)));
}

/** A tool's `execute` whose every call goes through the ledger. What the model receives for a
 * call the ledger does not let through is a string starting `ledgerweb <code>:`. */
export function ledgeredExecute<INPUT, OUTPUT>(
  spec: LedgerToolSpec<INPUT>,
  execute: (input: INPUT) => Promise<OUTPUT>,
): (input: INPUT) => Promise<OUTPUT | string> {
  return async (input: INPUT) => {
    let output: OUTPUT | undefined;
    const done = await spec.ledger.call({
      ...intent(spec, input),
      // At least a moment, so that an edit-and-approve link is followed before sending.
      waitForApprovalMs: 1,
      send: async (attempt) => {
        output = await execute(attempt.args as INPUT); // the linked attempt's, after an edit
        const resultRef =
          spec.receipt === false ? null : JSON_RECEIPT_PREFIX + JSON.stringify(output ?? null);
        return { resultRef };
      },
    });
    if (done.sent) {
      if (done.providerError) return `ledgerweb outcome_unknown: ${done.providerError.message}`;
      return output as OUTPUT;
    }
    const attempt = done.attempt;
    const ref = attempt.result_ref ?? "";
    if (attempt.state === "OUTCOME_CONFIRMED" && ref.startsWith(JSON_RECEIPT_PREFIX)) {
      return JSON.parse(ref.slice(JSON_RECEIPT_PREFIX.length)) as OUTPUT;
    }
    if (attempt.state === HELD) return held(attempt);
    return notApproved(attempt) ?? `ledgerweb not_sent: the attempt is ${attempt.state}; nothing was sent`;
  };
}

/** A `toolApproval` rule for one tool: the ledger's approval policies decide. */
export function ledgerToolApproval<INPUT>(
  spec: LedgerToolSpec<INPUT>,
): (input: INPUT) => Promise<ToolApprovalStatus> {
  return async (input: INPUT) => {
    const attempt = await current(spec, input);
    if (attempt.state === HELD) {
      return { type: "user-approval", reason: held(attempt) };
    }
    const denied = notApproved(attempt);
    if (denied) return { type: "denied", reason: denied };
    return "not-applicable";
  };
}

/** A `tool-approval-request` of a run's content (the fields this needs). */
export interface ApprovalRequestPart {
  type: "tool-approval-request";
  approvalId: string;
  toolCall: { toolName: string; input: unknown };
}

/** A `tool-approval-response` part for the next call's `tool` message. */
export interface ApprovalResponsePart {
  type: "tool-approval-response";
  approvalId: string;
  approved: boolean;
  reason?: string;
}

/** The ledger's decisions on the run's approval requests: responses for the calls people
 * decided, and the requests still held after `waitMs` (or not the ledger's: no spec). */
export async function ledgerApprovalResponses(
  requests: readonly ApprovalRequestPart[],
  specs: Record<string, LedgerToolSpec<never>>,
  options: { waitMs?: number } = {},
): Promise<{ responses: ApprovalResponsePart[]; pending: ApprovalRequestPart[] }> {
  const responses: ApprovalResponsePart[] = [];
  const pending: ApprovalRequestPart[] = [];
  for (const request of requests) {
    const spec = specs[request.toolCall.toolName];
    if (!spec) {
      pending.push(request);
      continue;
    }
    let attempt = await current(spec, request.toolCall.input as never);
    if (attempt.state === HELD && options.waitMs) {
      attempt = await spec.ledger.waitForApproval(attempt.attempt_id, options.waitMs);
    }
    if (attempt.state === HELD) {
      pending.push(request);
      continue;
    }
    const denied = notApproved(attempt);
    responses.push(
      denied
        ? { type: "tool-approval-response", approvalId: request.approvalId, approved: false, reason: denied }
        : { type: "tool-approval-response", approvalId: request.approvalId, approved: true },
    );
  }
  return { responses, pending };
}
