// Receipts checked by the TypeScript client with the log's verifier key alone. The pytest test
// tests/api/test_typescript_receipts.py seals and signs on a live server and writes what these
// tests need to LEDGERWEB_RECEIPT_FILE (a receipt, checkpoints before and after a rewrite).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import {
  canonicalJson,
  LedgerClient,
  LogView,
  openCheckpoint,
  type Receipt,
  ReceiptError,
  type Sent,
  StateConflict,
  verifyReceipt,
} from "../src/index.js";

// Registered only with a fixture: `npm test` alone (tests/api/test_typescript_client.py) runs
// the other suites and counts no skips.
const file = process.env.LEDGERWEB_RECEIPT_FILE;

interface Fixture {
  url: string;
  token: string;
  verifier: string;
  other_key: string;
  witness_key: string;
  attempt_id: string;
  unsealed_id: string;
  first: string;
  second: string;
  proof_first_second: string[];
  forked: string;
  proof_first_forked: string[];
  sent: Sent;
  jcs: [unknown, string][];
}

if (file) describe("receipts", () => {
  const data: Fixture = JSON.parse(readFileSync(file, "utf8"));
  const ledger = new LedgerClient(data.url ?? "http://127.0.0.1:1", data.token ?? "unset");

  test("a receipt from the API verifies with the key alone, and a forged one does not", async () => {
    const receipt = await ledger.receipt(data.attempt_id);
    const checkpoint = verifyReceipt(receipt, data.verifier, { witnessKeys: [data.witness_key], quorum: 1 });
    assert.equal(checkpoint.size, receipt.tree_size);
    assert.deepEqual(checkpoint.witnesses, receipt.witnesses);
    assert.ok(LedgerClient.verifyReceipt(receipt, [data.other_key, data.verifier]));
    const forged: Receipt = { ...receipt, leaf: { ...receipt.leaf, head: "0".repeat(64) } };
    assert.throws(() => verifyReceipt(forged, data.verifier), /do not hash to the leaf's head/);
    const elsewhere: Receipt = { ...receipt, index: receipt.index + 1 };
    assert.throws(() => verifyReceipt(elsewhere, data.verifier), /does not lead to the signed root/);
    assert.throws(() => verifyReceipt(receipt, data.other_key), ReceiptError);
    assert.throws(
      () => verifyReceipt(receipt, data.verifier, { witnessKeys: [data.witness_key], quorum: 2 }),
      /quorum is 2/,
    );
  });

  test("the events a receipt carries hash to its leaf and record what the agent sent", async () => {
    const receipt = await ledger.receipt(data.attempt_id);
    assert.equal(receipt.events.length, receipt.leaf.length);
    const sent: Sent = { ...data.sent };
    verifyReceipt(receipt, data.verifier, { sent });
    assert.throws(
      () => verifyReceipt(receipt, data.verifier, { sent: { ...sent, args: { ...sent.args, i: 99 } } }),
      /does not commit to the arguments sent/,
    );
    assert.throws(
      () => verifyReceipt(receipt, data.verifier, { sent: { ...sent, idempotency_key: "other" } }),
      /idempotency_key/,
    );
    const [first, ...rest] = receipt.events;
    const edited = { ...first, details: { ...(first?.details ?? {}), task_id: "t2" } };
    const cases: [Receipt, RegExp][] = [
      [{ ...receipt, events: rest }, /events for a leaf of/],
      [{ ...receipt, events: [edited, ...rest] as Receipt["events"] }, /leaf's head|does not follow/],
      [{ ...receipt, events: undefined as unknown as Receipt["events"] }, /carries no events/],
    ];
    for (const [bad, message] of cases) assert.throws(() => verifyReceipt(bad, data.verifier), message);
    // The server's own RFC 8785 text of tricky values, written by the Python reference.
    for (const [value, text] of data.jcs) assert.equal(canonicalJson(value), text);
  });

  test("an attempt not sealed yet has no receipt", async () => {
    await assert.rejects(ledger.receipt(data.unsealed_id), StateConflict);
  });

  test("a kept checkpoint accepts an extension and refuses a fork", async () => {
    const first = openCheckpoint(data.first, [data.verifier]);
    const view = new LogView();
    view.advance(first, []);
    const fromServer = await ledger.checkLog(view, data.verifier);
    assert.equal(view.size, fromServer.size);
    const kept = new LogView();
    kept.advance(first, []);
    const second = openCheckpoint(data.second, [data.verifier]);
    kept.advance(second, data.proof_first_second.map((h) => Buffer.from(h, "base64")));
    assert.equal(kept.size, second.size);
    const other = new LogView();
    other.advance(first, []);
    const forked = openCheckpoint(data.forked, [data.verifier]);
    assert.throws(
      () => other.advance(forked, data.proof_first_forked.map((h) => Buffer.from(h, "base64"))),
      /not consistent/,
    );
    assert.throws(() => kept.advance(first, []), /rolled back/);
  });
});
