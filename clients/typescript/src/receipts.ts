// Check a ledgerweb receipt without the server: the checkpoint note is signed by the log's key
// (C2SP signed-note, Ed25519) and cosigned by enough witnesses (C2SP tlog-cosignature), and the
// attempt's sealed state is in its tree (RFC 9162 inclusion proof). A `LogView` keeps the newest
// checkpoint it verified and accepts a next one only with a consistency proof. The events a
// receipt carries are hashed again (RFC 8785 JSON, written here) up to the leaf, and checked
// against what the agent sent. Node's built-in crypto does Ed25519, SHA-256 and HMAC; nothing
// else is needed.
import { createHash, createHmac, createPublicKey, verify as cryptoVerify } from "node:crypto";

import type { components } from "./openapi.js";

export type Receipt = components["schemas"]["Receipt"];

const ALG_ED25519 = 0x01;
const ALG_COSIGNATURE_V1 = 0x04;

/** A receipt, checkpoint or key that is malformed or does not verify. */
export class ReceiptError extends Error {
  override name = "ReceiptError";
}

function sha256(...parts: Uint8Array[]): Buffer {
  const hash = createHash("sha256");
  for (const part of parts) hash.update(part);
  return hash.digest();
}

function node(left: Uint8Array, right: Uint8Array): Buffer {
  return sha256(Uint8Array.of(1), left, right);
}

function b64(text: string): Buffer {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) throw new ReceiptError(`not base64: ${text.slice(0, 40)}`);
  return Buffer.from(text, "base64");
}

function ed25519(publicKey: Uint8Array, message: Uint8Array, signature: Uint8Array): boolean {
  const key = createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(publicKey).toString("base64url") },
    format: "jwk",
  });
  try {
    return cryptoVerify(null, message, key, signature);
  } catch {
    return false;
  }
}

/** A signed-note verifier key `NAME+KEYID+BASE64(ALG || KEY)`. */
export class VerifierKey {
  private constructor(
    readonly name: string,
    readonly id: Buffer,
    readonly alg: number,
    readonly publicKey: Buffer,
  ) {}

  static parse(text: string | VerifierKey): VerifierKey {
    if (text instanceof VerifierKey) return text;
    const first = text.indexOf("+");
    const second = text.indexOf("+", first + 1);
    if (first <= 0 || second !== first + 9) throw new ReceiptError(`not a verifier key: ${text.slice(0, 60)}`);
    const name = text.slice(0, first);
    const id = Buffer.from(text.slice(first + 1, second), "hex");
    const raw = b64(text.slice(second + 1).trim());
    const alg = raw[0] ?? -1;
    if (id.length !== 4 || raw.length !== 33 || (alg !== ALG_ED25519 && alg !== ALG_COSIGNATURE_V1)) {
      throw new ReceiptError(`not an Ed25519 verifier key: ${text.slice(0, 60)}`);
    }
    if (!sha256(Buffer.from(`${name}\n`), raw).subarray(0, 4).equals(id)) {
      throw new ReceiptError(`the key id of ${name} does not match its key`);
    }
    return new VerifierKey(name, id, alg, raw.subarray(1));
  }

  signed(text: string, name: string, keyId: Buffer, signature: Buffer): boolean {
    if (name !== this.name || !keyId.equals(this.id)) return false;
    if (this.alg === ALG_ED25519) return ed25519(this.publicKey, Buffer.from(text), signature);
    if (signature.length !== 72) return false;
    const stamp = signature.readBigUInt64BE(0);
    const message = Buffer.from(`cosignature/v1\ntime ${stamp}\n${text}`);
    return ed25519(this.publicKey, message, signature.subarray(8));
  }
}

/** A verified checkpoint. */
export interface Checkpoint {
  origin: string;
  size: number;
  root: Buffer;
  extensions: string[];
  witnesses: string[];
  note: string;
}

export interface TrustOptions {
  witnessKeys?: readonly (string | VerifierKey)[];
  quorum?: number;
}

/** Verify a checkpoint note: signed by one of `verifierKeys`, cosigned by `quorum` witnesses. */
export function openCheckpoint(
  note: string,
  verifierKeys: readonly (string | VerifierKey)[],
  options: TrustOptions = {},
): Checkpoint {
  const cut = note.lastIndexOf("\n\n");
  if (cut < 0 || !note.endsWith("\n")) throw new ReceiptError("not a signed note");
  const text = note.slice(0, cut + 1);
  const signatures: [string, Buffer, Buffer][] = [];
  for (const line of note.slice(cut + 2).split("\n")) {
    if (!line) continue;
    const parts = line.split(" ");
    if (parts.length !== 3 || parts[0] !== "\u2014") throw new ReceiptError(`a malformed signature line: ${line.slice(0, 60)}`);
    const raw = b64(parts[2] ?? "");
    signatures.push([parts[1] ?? "", raw.subarray(0, 4), raw.subarray(4)]);
  }
  const lines = text.split("\n");
  if (lines.length < 4 || !/^(0|[1-9][0-9]*)$/.test(lines[1] ?? "")) {
    throw new ReceiptError("not a checkpoint (origin, size, root)");
  }
  const keys = verifierKeys.map((k) => VerifierKey.parse(k));
  if (!keys.some((k) => signatures.some((s) => k.signed(text, ...s)))) {
    throw new ReceiptError("the checkpoint is not signed by the log's verifier key");
  }
  const witnesses = (options.witnessKeys ?? []).map((k) => VerifierKey.parse(k));
  const cosigned = [...new Set(witnesses.filter((w) => signatures.some((s) => w.signed(text, ...s))).map((w) => w.name))].sort();
  const quorum = options.quorum ?? 0;
  if (cosigned.length < quorum) {
    throw new ReceiptError(`the checkpoint has ${cosigned.length} known witness cosignatures, quorum is ${quorum}`);
  }
  return {
    origin: lines[0] ?? "",
    size: Number(lines[1]),
    root: b64(lines[2] ?? ""),
    extensions: lines.slice(3, -1),
    witnesses: cosigned,
    note,
  };
}

/** The log's leaf for an attempt's sealed state: SHA-256(0x00 || RFC 8785 JSON). */
export function leafHash(attemptId: string, length: number, head: string): Buffer {
  // RFC 8785 of this object is its keys in order, compact: JSON.stringify writes it so.
  const text = JSON.stringify({ attempt_id: attemptId, head, length });
  return sha256(Uint8Array.of(0), Buffer.from(text));
}

/** RFC 9162, 2.1.3.2: the root an inclusion proof leads to, or null. */
export function inclusionRoot(leaf: Buffer, index: number, size: number, proof: Buffer[]): Buffer | null {
  if (!(index >= 0 && index < size)) return null;
  let fn = BigInt(index);
  let sn = BigInt(size - 1);
  let value = leaf;
  for (const sibling of proof) {
    if (sn === 0n) return null;
    if ((fn & 1n) === 1n || fn === sn) {
      value = node(sibling, value);
      while (fn !== 0n && (fn & 1n) === 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      value = node(value, sibling);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n ? value : null;
}

/** RFC 9162, 2.1.4.2: whether (oldSize, oldRoot) is a prefix of (newSize, newRoot). */
export function consistent(oldSize: number, oldRoot: Buffer, newSize: number, newRoot: Buffer, proof: Buffer[]): boolean {
  if (oldSize === newSize) return proof.length === 0 && oldRoot.equals(newRoot);
  if (oldSize === 0) return proof.length === 0;
  if (oldSize > newSize || proof.length === 0) return false;
  const path = (oldSize & (oldSize - 1)) === 0 ? [oldRoot, ...proof] : [...proof];
  let fn = BigInt(oldSize - 1);
  let sn = BigInt(newSize - 1);
  while ((fn & 1n) === 1n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  let fr = path[0] as Buffer;
  let sr = fr;
  for (const value of path.slice(1)) {
    if (sn === 0n) return false;
    if ((fn & 1n) === 1n || fn === sn) {
      fr = node(value, fr);
      sr = node(value, sr);
      while (fn !== 0n && (fn & 1n) === 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      sr = node(sr, value);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n && fr.equals(oldRoot) && sr.equals(newRoot);
}

export function hashes(values: readonly string[]): Buffer[] {
  return values.map((value) => {
    const raw = b64(value);
    if (raw.length !== 32) throw new ReceiptError("a proof hash is not 32 bytes");
    return raw;
  });
}

/** RFC 8785 (JCS) canonical JSON: what the server hashes. JSON.stringify writes numbers and
 * strings as RFC 8785 does; object keys are sorted by UTF-16 code units (JS's own order). */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value === "boolean" || typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new ReceiptError("NaN and infinities are not JSON");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  throw new ReceiptError(`not JSON: ${typeof value}`);
}

/** What the agent sent, to check a receipt's history against (any of the fields). */
export interface Sent {
  tenant?: string;
  task_id?: string;
  tool_name?: string;
  idempotency_key?: string;
  args?: Record<string, unknown>;
}

const GENESIS = "0".repeat(64);
const SALTED_FORMAT = 3;
const SENT_FIELDS = ["tenant", "task_id", "tool_name", "idempotency_key"] as const;

/** Recompute what the receipt's leaf commits to: each event it carries, as its hash covers it,
 * links to the one before it, and the last hashes to the leaf's head. With `sent`, the
 * creation event must record exactly what the agent sent (the arguments through their salted
 * digest). Throws ReceiptError. */
export function checkHistory(receipt: Receipt, sent?: Sent): void {
  const events = receipt.events as readonly Record<string, unknown>[] | undefined;
  if (!Array.isArray(events)) {
    throw new ReceiptError("the receipt carries no events (a server older than 0.2.0): what its leaf commits to cannot be checked");
  }
  const leaf = receipt.leaf;
  if (events.length !== leaf.length) {
    throw new ReceiptError(`the receipt carries ${events.length} events for a leaf of ${leaf.length}`);
  }
  let prev = GENESIS;
  events.forEach((event, i) => {
    if (event.attempt_id !== leaf.attempt_id) throw new ReceiptError(`event ${i + 1} of the receipt is another attempt's`);
    if (event.prev_hash !== prev) throw new ReceiptError(`event ${i + 1} of the receipt does not follow the one before it`);
    prev = createHash("sha256").update(canonicalJson(event)).digest("hex");
  });
  if (prev !== leaf.head) throw new ReceiptError("the receipt's events do not hash to the leaf's head");
  const created = events[0];
  if (!sent || !created) return;
  const details = created.details as Record<string, unknown> | undefined;
  if (created.action !== "attempt.created" || typeof details !== "object" || details === null) {
    throw new ReceiptError("the history's first event is not the attempt's creation");
  }
  for (const name of SENT_FIELDS) {
    if (sent[name] !== undefined && details[name] !== sent[name]) {
      throw new ReceiptError(`the history records ${name} ${JSON.stringify(details[name])}, not the ${JSON.stringify(sent[name])} sent`);
    }
  }
  if (sent.args === undefined) return;
  let matches: boolean;
  if (Number(created.v ?? 2) >= SALTED_FORMAT) {
    const salt = receipt.args_salt;
    if (!salt) throw new ReceiptError("the receipt carries no salt: the arguments cannot be checked");
    const digest = createHmac("sha256", Buffer.from(salt, "hex")).update(canonicalJson({ args: sent.args })).digest("hex");
    matches = details.args_digest === digest;
  } else {
    matches = details.args_hash === createHash("sha256").update(canonicalJson(sent.args)).digest("hex");
  }
  if (!matches) throw new ReceiptError("the history does not commit to the arguments sent");
}

/** Verify an attempt's receipt with the log's verifier key(s): the checkpoint is signed (and
 * cosigned), the leaf is in its tree, and the events the receipt carries hash to the leaf
 * (`checkHistory`; with `options.sent`, they record what the agent sent). Returns the
 * checkpoint. */
export function verifyReceipt(
  receipt: Receipt,
  verifierKey: string | VerifierKey | readonly (string | VerifierKey)[],
  options: TrustOptions & { sent?: Sent } = {},
): Checkpoint {
  const keys = Array.isArray(verifierKey) ? verifierKey : [verifierKey as string | VerifierKey];
  const checkpoint = openCheckpoint(receipt.checkpoint, keys, options);
  const leaf = receipt.leaf;
  if (leaf.attempt_id !== receipt.attempt_id) throw new ReceiptError("the receipt's leaf is another attempt's");
  checkHistory(receipt, options.sent);
  const root = inclusionRoot(
    leafHash(leaf.attempt_id, leaf.length, leaf.head),
    receipt.index,
    checkpoint.size,
    hashes(receipt.inclusion_proof),
  );
  if (root === null || !root.equals(checkpoint.root)) {
    throw new ReceiptError(
      "the inclusion proof does not lead to the signed root: the attempt's sealed state is not in the history the log signed",
    );
  }
  return checkpoint;
}

/** The newest checkpoint this client verified; `advance` needs a consistency proof. */
export class LogView {
  constructor(
    public size = 0,
    public root: Buffer = sha256(),
  ) {}

  advance(checkpoint: Checkpoint, proof: Buffer[]): void {
    if (checkpoint.size < this.size) {
      throw new ReceiptError(`the log shows ${checkpoint.size} leaves after ${this.size}: it was rolled back`);
    }
    if (!consistent(this.size, this.root, checkpoint.size, checkpoint.root, proof)) {
      throw new ReceiptError(
        `the checkpoint of size ${checkpoint.size} is not consistent with the one of size ${this.size} verified before: the history was rewritten (a fork)`,
      );
    }
    this.size = checkpoint.size;
    this.root = checkpoint.root;
  }
}
