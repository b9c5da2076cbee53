// Shared by the suites: the fleet's address and tokens (set by
// tests/fleet/clients/mod.rs), clients, and waits on conditions.

import assert from "node:assert/strict";
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from "node:http";

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
export function scriptConfig(name: "answer" | "refund" | "slow" | "lookup" | "chat", extra: Record<string, unknown> = {}): Record<string, unknown> {
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

/** The refund script's config with both of its calls (`get_order`, then `refund_order`) waiting for a decision. */
export function bothCallsNeedApproval(): Record<string, unknown> {
  return scriptConfig("refund", {
    policies: ["get_order", "refund_order"].map((tool) => ({ tool, action: { kind: "require_approval" } })),
    budget: { max_turns: 10, max_tool_calls: 10 },
  });
}

/** The lookup script's config: `lookup_order` is external (the caller posts each of its two results). */
export function externalLookup(): Record<string, unknown> {
  return scriptConfig("lookup", {
    external_tools: [
      { name: "lookup_order", description: "Look an order up (the caller's system).", input_schema: { type: "object" }, external: true },
    ],
  });
}

/**
 * What a {@link FaultyProxy} does with one request:
 * - `forward`: pass it to the dispatcher and its answer back (streamed);
 *   with `cutAfterMs`, cut the connection that long after the answer's
 *   headers went out;
 * - `refuse`: answer 503 without forwarding it, after `first` (the test's
 *   action while the request is held) resolved;
 * - `lose`: forward it, read the dispatcher's whole answer, run `then`, and
 *   answer 502 instead (the answer is lost on the way back).
 */
export type ProxyAction =
  | { kind: "forward"; cutAfterMs?: number }
  | { kind: "refuse"; first?: () => Promise<unknown> }
  | { kind: "lose"; then?: () => Promise<unknown> };

/** One request a {@link FaultyProxy} saw: method, URL, the action taken, and when (Date.now()). */
export interface ProxiedRequest {
  method: string;
  url: string;
  action: ProxyAction["kind"];
  at: number;
}

/** An HTTP proxy to the dispatcher that misbehaves on the requests `decide` picks. */
export class FaultyProxy {
  readonly seen: ProxiedRequest[] = [];
  readonly failures: unknown[] = [];
  readonly #server = createServer((req, res) => {
    this.#handle(req, res).catch((e: unknown) => {
      this.failures.push(e);
      res.destroy();
    });
  });
  readonly #target: URL;
  readonly #decide: (method: string, url: string) => ProxyAction;

  constructor(target: string, decide: (method: string, url: string) => ProxyAction) {
    this.#target = new URL(target);
    this.#decide = decide;
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    const address = this.#server.address();
    assert.ok(address !== null && typeof address === "object");
    return `http://127.0.0.1:${address.port}`;
  }

  /** The requests with `action` whose URL contains `part`. */
  count(action: ProxyAction["kind"], part: string): number {
    return this.seen.filter((r) => r.action === action && r.url.includes(part)).length;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) {
      chunks.push(chunk as Buffer);
    }
    const body = Buffer.concat(chunks);
    const method = req.method ?? "GET";
    const url = req.url ?? "/";
    const action = this.#decide(method, url);
    this.seen.push({ method, url, action: action.kind, at: Date.now() });
    if (action.kind === "refuse") {
      await action.first?.();
      res.writeHead(503, { "content-type": "application/json", "retry-after": "0" });
      res.end(JSON.stringify({ error: { code: "not_ready", message: "the proxy refuses this attempt" } }));
      return;
    }
    const upstream = await new Promise<IncomingMessage>((resolve, reject) => {
      const headers = { ...req.headers, host: this.#target.host };
      const out = httpRequest(
        { host: this.#target.hostname, port: this.#target.port, method, path: url, headers },
        resolve,
      );
      out.on("error", reject);
      out.end(body);
    });
    if (action.kind === "lose") {
      for await (const _ of upstream) {
        // The dispatcher's whole answer is read, then dropped.
      }
      await action.then?.();
      res.writeHead(502, { "content-type": "text/plain" }).end("the proxy lost the answer");
      return;
    }
    res.writeHead(upstream.statusCode ?? 502, upstream.headers);
    res.flushHeaders();
    if (action.cutAfterMs !== undefined) {
      const timer = setTimeout(() => {
        upstream.destroy();
        res.socket?.destroy();
      }, action.cutAfterMs);
      res.on("close", () => clearTimeout(timer));
    }
    upstream.pipe(res);
    upstream.on("error", () => res.destroy());
    res.on("close", () => upstream.destroy());
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
