// The wire types in src/openapi.ts are generated from docs/openapi.json and must be up to date.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

test("src/openapi.ts is what openapi-typescript makes of docs/openapi.json", () => {
  const require = createRequire(import.meta.url);
  const cli = join(dirname(require.resolve("openapi-typescript/package.json")), "bin", "cli.js");
  const run = spawnSync(
    process.execPath,
    [
      cli,
      "../../docs/openapi.json",
      "--empty-objects-unknown",
      "--output",
      "src/openapi.ts",
      "--check",
    ],
    { cwd: root, encoding: "utf8" },
  );
  assert.equal(run.status, 0, `stale generated types: run "npm run generate"\n${run.stderr}`);
});
