// The client is typed from the document: the generated types match a fresh
// generation from schemas/openapi.json, and a path or method the document
// does not have does not type-check (tsc runs this file; a
// `@ts-expect-error` that finds no error fails the build).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { GliaClient } from "../src/index.js";

const packageDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

test("src/generated/openapi.ts matches schemas/openapi.json", () => {
  const dir = mkdtempSync(join(tmpdir(), "glia-ts-types-"));
  try {
    const fresh = join(dir, "openapi.ts");
    execFileSync(process.execPath, [join(packageDir, "scripts", "generate.mjs"), fresh], { stdio: "inherit" });
    const committed = readFileSync(join(packageDir, "src", "generated", "openapi.ts"), "utf8");
    assert.ok(
      readFileSync(fresh, "utf8") === committed,
      "clients/typescript/src/generated/openapi.ts differs from what schemas/openapi.json generates: " +
        "run `npm run generate --prefix clients/typescript` (after `cargo run -p glia-cli -- schemas` if the API changed) and commit the result",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("paths and methods outside the document do not type-check", () => {
  const glia = new GliaClient({ baseUrl: "http://127.0.0.1:9" });
  // Never called: tsc checks these lines.
  const unused = () => {
    // @ts-expect-error no such path in the document
    void glia.api.GET("/v1/no-such-path");
    // @ts-expect-error the document has no DELETE on /v1/approvals
    void glia.api.DELETE("/v1/approvals");
    // @ts-expect-error a run's body needs a goal
    void glia.submitRun({ config: {} });
    // @ts-expect-error an edit needs its input
    void glia.decide("r", "c", { decision: "edit" });
  };
  assert.equal(typeof unused, "function");
});
