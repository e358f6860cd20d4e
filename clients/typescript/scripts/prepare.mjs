// npm runs "prepare" when the package is installed from a path or from git: build dist/ there.
// From git, npm has installed the devDependencies first. From a path, npm links the folder
// without them, so the locked ones (package-lock.json: the TypeScript this client is tested
// with) are installed first, once.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");

function run(command, args) {
  const done = spawnSync(command, args, { cwd: root, stdio: "inherit" });
  if (done.error) throw done.error;
  if (done.status !== 0) {
    console.error(`ledgerweb-client prepare: ${[command, ...args].join(" ")} failed`);
    process.exit(done.status ?? 1);
  }
}

if (!existsSync(tsc)) {
  const npm = process.env.npm_execpath;
  const ci = ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"];
  if (npm && npm.endsWith(".js")) run(process.execPath, [npm, ...ci]);
  else run(npm || "npm", ci);
}
run(process.execPath, [tsc, "-p", "tsconfig.build.json"]);
