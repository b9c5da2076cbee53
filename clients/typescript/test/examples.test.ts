// The README's examples (examples/*.ts, compiled with the tests, quoted
// verbatim in README.md) run against the fleet. They run as tenant `other`,
// so approving "everything that waits" touches no other test's runs.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { client, env, refundWithApproval } from "./helpers.js";

const packageDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const run = promisify(execFile);

function asOther(): NodeJS.ProcessEnv {
  return { ...process.env, GLIA_URL: env("GLIA_URL"), GLIA_TOKEN: env("GLIA_TOKEN_OTHER") };
}

test("README.md quotes the examples verbatim", () => {
  const readme = readFileSync(join(packageDir, "README.md"), "utf8");
  for (const name of ["approve-waiting.ts", "submit.ts"]) {
    const code = readFileSync(join(packageDir, "examples", name), "utf8");
    assert.ok(readme.includes("```ts\n" + code + "```"), `README.md quotes examples/${name} as it is`);
  }
});

test("the example that approves what waits approves it", async () => {
  const other = client("other");
  const submitted = await Promise.all([1, 2].map(() => other.submitRun({ goal: "Refund order A1.", config: refundWithApproval() })));
  const parked = await Promise.all(submitted.map((r) => other.wait(r.run_id, { timeoutMs: 90_000 })));
  assert.ok(parked.every((r) => r.pull_point?.kind === "awaiting_approval"));
  const { stdout } = await run(process.execPath, [join(packageDir, "dist-test", "examples", "approve-waiting.js")], { env: asOther() });
  for (const r of submitted) {
    assert.match(stdout, new RegExp(`approving refund_order\\(\\{"order_id":"A1"\\}\\) in run ${r.run_id}`));
  }
  const done = await Promise.all(parked.map((r) => other.wait(r.run_id, { timeoutMs: 90_000, afterSeq: r.head_seq })));
  for (const r of done) {
    assert.equal(r.outcome?.answer, "Order A1 is refunded.");
  }
});

test("the submit example prints the answer", async () => {
  const { stdout, stderr } = await run(process.execPath, [join(packageDir, "dist-test", "examples", "submit.js"), "Say you are done."], {
    env: asOther(),
  });
  assert.equal(stdout, "Done: the goal is met.\n");
  assert.match(stderr, /#1 session\.start/);
  assert.match(stderr, /session\.complete/);
});
