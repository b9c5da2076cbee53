// Shared by the suites: the fleet's address and tokens (set by
// tests/fleet/clients/mod.rs), clients, and waits on conditions.

import assert from "node:assert/strict";

import { GliaClient, type GliaClientOptions } from "../src/index.js";

/** An environment variable the fleet sets; fails loudly when missing. */
export function env(name: string): string {
  const value = process.env[name];
  assert.ok(
    value !== undefined && value !== "",
    `${name} is not set: run this suite through \`cargo test -p glia-e2e --test fleet clients::typescript\`, which starts the fleet`,
  );
  return value;
}

/** A client of the fleet as tenant `acme` (admin), or `other`. */
export function client(tenant: "acme" | "other" = "acme", options: Partial<GliaClientOptions> = {}): GliaClient {
  return new GliaClient({
    baseUrl: env("GLIA_URL"),
    token: env(tenant === "acme" ? "GLIA_TOKEN" : "GLIA_TOKEN_OTHER"),
    ...options,
  });
}

/** A run config for script `name` (see tests/fleet/clients/mod.rs). */
export function scriptConfig(name: "answer" | "refund" | "slow", extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: `script:${name}`, ...extra };
}

/** The refund script's config with refunds waiting for a decision. */
export function refundWithApproval(): Record<string, unknown> {
  return scriptConfig("refund", {
    policies: [{ tool: "refund_order", action: { kind: "require_approval" } }],
    budget: { max_turns: 10, max_tool_calls: 10 },
  });
}

/** Poll `check` until it returns a value other than undefined, or fail after `timeoutMs` with `what`. */
export async function eventually<T>(what: string, check: () => Promise<T | undefined> | T | undefined, timeoutMs = 90_000): Promise<T> {
  const start = Date.now();
  for (;;) {
    const value = await check();
    if (value !== undefined) {
      return value;
    }
    if (Date.now() - start > timeoutMs) {
      assert.fail(`timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
