// The TypeScript client against a live ledgerweb server (LEDGERWEB_URL, LEDGERWEB_TOKEN; the
// pytest test tests/api/test_typescript_client.py starts one on 127.0.0.1 and runs these).
// What the tests need beyond tenant acme with charge_card granted (the demo's world and the
// suite's), they add themselves: test/ledger.toml, applied with the ledger's manage.py.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  type Attempt,
  IdempotencyConflict,
  InvalidRequest,
  LedgerClient,
  LedgerUnavailable,
  NotFound,
  ProviderLostResponse,
  ProviderRefused,
  ProviderTimeout,
  Refused,
  type State,
  StateConflict,
  Unauthorized,
} from "../src/index.js";

const url = process.env.LEDGERWEB_URL;
const token = process.env.LEDGERWEB_TOKEN;
const live = url && token ? {} : { skip: "LEDGERWEB_URL and LEDGERWEB_TOKEN are not set" };

// The command that runs the ledger's management commands against the server's database:
// LEDGERWEB_MANAGE (e.g. "ledgerweb", or "/srv/ledgerweb/.venv/bin/python manage.py"), else this
// checkout's manage.py with its .venv, in this environment.
function manage(): string[] {
  const configured = process.env.LEDGERWEB_MANAGE?.trim();
  if (configured) return configured.split(/\s+/);
  const root = fileURLToPath(new URL("../../../../", import.meta.url)); // from dist/test/
  const python = `${root}.venv/bin/python`;
  return [existsSync(python) ? python : "python3", `${root}manage.py`];
}

function applyConfig(file: string): void {
  const [command = "", ...args] = manage();
  try {
    execFileSync(command, [...args, "ledger_config", "apply", file, "--reason", "TS live tests"], {
      stdio: "pipe",
      timeout: 120_000,
    });
  } catch (error) {
    const { stderr, stdout } = error as { stderr?: Buffer; stdout?: Buffer };
    const said = `${stderr ?? ""}${stdout ?? ""}`;
    throw new Error(
      `could not apply ${file} with "${manage().join(" ")} ledger_config apply" (set ` +
        `LEDGERWEB_MANAGE to a command that reaches the server's database): ${said}`,
    );
  }
}

// Each run's own keys (LEDGERWEB_KEY_PREFIX, else a new one), so that a second run against the
// same ledger records new attempts instead of finding the first run's.
const prefix = process.env.LEDGERWEB_KEY_PREFIX || `ts-${Date.now().toString(36)}`;
const keyOf = (name: string) => `${prefix}:${name}`;

function intent(name: string, extra: Record<string, unknown> = {}) {
  return {
    tenant: "acme",
    task_id: "task-ts",
    tool_name: "charge_card",
    idempotency_key: keyOf(name),
    args: { customer: "cus_1", amount_cents: 1200, currency: "EUR" },
    ...extra,
  };
}

describe("against a live ledger", live, () => {
  const ledger = new LedgerClient(url ?? "http://127.0.0.1:1", token ?? "unset");

  test("call runs the safe order, confirms, and never sends twice", async () => {
    const sent: string[] = [];
    const send = async (attempt: Attempt) => {
      sent.push(attempt.idempotency_key);
      return { providerRequestId: `prv_${prefix}_1`, resultRef: "ch_ts_1" };
    };
    const first = await ledger.call({ ...intent("charge:1"), send });
    assert.equal(first.sent, true);
    assert.equal(first.confirmed, true);
    const state: State = first.attempt.state;
    assert.equal(state, "OUTCOME_CONFIRMED");
    assert.equal(first.attempt.provider_request_id, `prv_${prefix}_1`);
    assert.equal(first.attempt.result_ref, "ch_ts_1");
    const again = await ledger.call({ ...intent("charge:1"), send });
    assert.equal(again.sent, false);
    assert.equal(again.confirmed, true);
    assert.deepEqual(sent, [keyOf("charge:1")]);
    const found = await ledger.find(keyOf("charge:1"));
    assert.deepEqual(
      found.map((a) => a.attempt_id),
      [first.attempt.attempt_id],
    );
  });

  for (const error of [new ProviderTimeout("read timed out"), new ProviderLostResponse("reset")]) {
    test(`${error.name} leaves the attempt UNKNOWN, and UNKNOWN is not sent again`, async () => {
      const name = `unknown:${error.name}`;
      const send = async (): Promise<never> => {
        throw error;
      };
      const result = await ledger.call({ ...intent(name), send });
      assert.equal(result.sent, true);
      assert.equal(result.attempt.state, "UNKNOWN");
      assert.equal(result.providerError, error);
      const again = await ledger.call({ ...intent(name), send });
      assert.equal(again.sent, false);
      assert.equal(again.attempt.state, "UNKNOWN");
    });
  }

  test("an answer without a receipt stays DISPATCHED with the provider id", async () => {
    const result = await ledger.call({
      ...intent("no-receipt"),
      send: async () => ({ providerRequestId: `prv_${prefix}_2` }),
    });
    assert.equal(result.attempt.state, "DISPATCHED");
    assert.equal(result.attempt.provider_request_id, `prv_${prefix}_2`);
  });

  test("refusals record FAILED or FAILED_RETRYABLE", async () => {
    const refuse = (retryable: boolean) => async (): Promise<never> => {
      throw new ProviderRefused("card declined", retryable);
    };
    const failed = await ledger.call({ ...intent("refused"), send: refuse(false) });
    assert.equal(failed.attempt.state, "FAILED");
    const retry = await ledger.call({ ...intent("retryable"), send: refuse(true) });
    assert.equal(retry.attempt.state, "FAILED_RETRYABLE");
  });

  test("an unexpected error marks the attempt UNKNOWN and is rethrown", async () => {
    const boom = new RangeError("bug in the send function");
    await assert.rejects(
      ledger.call({
        ...intent("crash"),
        send: async () => {
          throw boom;
        },
      }),
      (thrown) => thrown === boom,
    );
    const [attempt] = await ledger.find(keyOf("crash"));
    assert.equal(attempt?.state, "UNKNOWN");
  });

  test("the ledger's refusals are typed errors", async () => {
    const recorded = await ledger.recordIntent(intent("errors"));
    await assert.rejects(
      ledger.recordIntent(intent("errors", { args: { amount_cents: 1 } })),
      (e) => e instanceof IdempotencyConflict && e.status === 409,
    );
    await assert.rejects(
      ledger.recordIntent(intent("bad", { tool_name: "no_such_tool" })),
      (e) => e instanceof Refused && e.status === 403 && e.code === "unknown_tool",
    );
    await assert.rejects(
      ledger.recordIntent(intent("globex", { tenant: "globex" })),
      (e) => e instanceof Refused && e.code === "tenant_not_granted",
    );
    await assert.rejects(ledger.get("att_MISSING"), NotFound);
    await assert.rejects(ledger.confirm(recorded.attempt_id, "r"), StateConflict);
    const stranger = new LedgerClient(url ?? "", "lwt_wrong");
    await assert.rejects(stranger.get(recorded.attempt_id), Unauthorized);
    assert.equal(await ledger.dispatch(recorded.attempt_id), true);
    assert.equal(await ledger.dispatch(recorded.attempt_id), false);
  });

  test("a call an approval policy holds waits, then sends nothing while still held", async () => {
    // test/ledger.toml's policy holds this customer's charges for approval (docs/approvals.md).
    applyConfig(fileURLToPath(new URL("../../test/ledger.toml", import.meta.url)));
    const held = intent("held", { args: { customer: "cus_ts_held", amount_cents: 1200 } });
    let sent = 0;
    const started = Date.now();
    const result = await ledger.call({
      ...held,
      send: async () => {
        sent += 1;
        return {};
      },
      waitForApprovalMs: 1500,
    });
    assert.equal(result.sent, false);
    assert.equal(result.attempt.state, "AWAITING_APPROVAL");
    assert.equal(result.attempt.approval_policy, "ts-held-charges");
    assert.ok(Date.now() - started >= 1400);
    assert.equal(sent, 0);
    assert.equal(await ledger.dispatch(result.attempt.attempt_id), false);
    const plain = await ledger.recordIntent(intent("not-held"));
    const quick = Date.now();
    assert.equal((await ledger.waitForApproval(plain.attempt_id, 5000)).state, "INTENT_RECORDED");
    assert.ok(Date.now() - quick < 1000);
  });
});

test("an unreachable ledger is LedgerUnavailable", async () => {
  const port = await new Promise<number>((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
  const ledger = new LedgerClient(`http://127.0.0.1:${port}`, "lwt_x", { timeoutMs: 2000 });
  await assert.rejects(ledger.get("att_1"), LedgerUnavailable);
  assert.throws(() => new LedgerClient("ftp://x", "t"), TypeError);
});
