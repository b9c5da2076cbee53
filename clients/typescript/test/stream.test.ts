// The event stream through a TCP proxy that cuts the connection mid-stream:
// the client resumes with Last-Event-ID and yields every event once, in order.

import assert from "node:assert/strict";
import { createServer, connect, type Socket } from "node:net";
import { test } from "node:test";

import { GliaError, GliaUnreachableError, type Event } from "../src/index.js";
import { FaultyProxy, client, env, eventually, refundWithApproval } from "./helpers.js";

/** A TCP proxy to the dispatcher that records each connection's request head and can cut connections. */
class CuttingProxy {
  readonly heads: string[] = [];
  readonly #server = createServer((downstream) => this.#accept(downstream));
  readonly #target: URL;
  readonly #sockets = new Set<Socket>();
  /** Cut the first connection once it has forwarded the whole frame (up to its blank line) containing this text. */
  cutAfter: string | undefined;
  cuts = 0;

  constructor(target: string) {
    this.#target = new URL(target);
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    const address = this.#server.address();
    assert.ok(address !== null && typeof address === "object");
    return `http://127.0.0.1:${address.port}`;
  }

  #accept(downstream: Socket): void {
    const index = this.heads.length;
    this.heads.push("");
    const upstream = connect(Number(this.#target.port), this.#target.hostname);
    this.#sockets.add(downstream).add(upstream);
    const cut = () => {
      downstream.destroy();
      upstream.destroy();
    };
    downstream.on("data", (chunk: Buffer) => {
      this.heads[index] += chunk.toString("latin1");
      upstream.write(chunk);
    });
    let answered = "";
    upstream.on("data", (chunk: Buffer) => {
      downstream.write(chunk);
      answered += chunk.toString("utf8");
      const at = this.cutAfter === undefined ? -1 : answered.indexOf(this.cutAfter);
      // The frame ends at the blank line after the match: cut only once that has gone through.
      if (at >= 0 && this.cuts === 0 && answered.indexOf("\n\n", at) >= 0) {
        this.cuts++;
        // Let the chunk reach the client, then cut both sides mid-stream.
        downstream.once("drain", cut);
        if (downstream.writableLength === 0) {
          setImmediate(cut);
        }
      }
    });
    downstream.on("error", cut).on("close", cut);
    upstream.on("error", cut).on("close", cut);
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) {
      s.destroy();
    }
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/** The value of `name` in a raw HTTP request head, if present. */
function headerOf(head: string, name: string): string | undefined {
  const line = head.split("\r\n").find((l) => l.toLowerCase().startsWith(`${name.toLowerCase()}:`));
  return line?.slice(line.indexOf(":") + 1).trim();
}

test("a stream cut mid-way resumes with Last-Event-ID: every event once, in order", async () => {
  const proxy = new CuttingProxy(env("GLIA_URL"));
  const proxied = client("acme", { baseUrl: await proxy.listen() });
  const direct = client();
  try {
    // The refund waits for approval: the stream is cut once the request
    // reaches the client, and the approval is given while it reconnects.
    proxy.cutAfter = '"approval.requested"';
    const run = await direct.submitRun({ goal: "Refund order A1.", config: refundWithApproval() });
    const seen: Event[] = [];
    const reconnects: number[] = [];
    for await (const event of proxied.streamEvents(run.run_id, { onReconnect: (last) => reconnects.push(last) })) {
      seen.push(event);
      if (event.type === "approval.requested") {
        const data = event.data as { call_id: string };
        await direct.approve(run.run_id, data.call_id);
      }
    }
    assert.equal(proxy.cuts, 1, "the proxy cut the stream once");
    assert.ok(reconnects.length >= 1, "the client reconnected");
    const requested = seen.find((e) => e.type === "approval.requested");
    assert.ok(requested, "the approval request was streamed");
    // Each event once, in order, from 1 to the end.
    assert.deepEqual(
      seen.map((e) => e.seq),
      seen.map((_, i) => i + 1),
    );
    assert.equal(seen.at(-1)?.type, "session.complete");
    // The same log as the events endpoint.
    const page = await direct.listEvents(run.run_id, { limit: 1000 });
    assert.deepEqual(
      seen.map((e) => [e.seq, e.type]),
      page.events.map((e) => [e.seq, e.type]),
    );
    // The first request sent no Last-Event-ID; the reconnection sent the last seq seen before the cut.
    const streams = proxy.heads.filter((h) => h.startsWith("GET ") && h.includes("/events/stream"));
    assert.ok(streams.length >= 2, `at least two stream requests, saw ${streams.length}`);
    assert.equal(headerOf(streams[0] ?? "", "last-event-id"), undefined);
    const resumedAfter = headerOf(streams[1] ?? "", "last-event-id");
    assert.equal(resumedAfter, String(reconnects[0]));
    assert.ok(Number(resumedAfter) >= requested.seq, `resumed after ${resumedAfter}, at or past the approval request ${requested.seq}`);
  } finally {
    await proxy.close();
  }
});

test("a stream started after a finished run's last event ends at once", async () => {
  const glia = client();
  const run = await glia.submitRun({ goal: "Say you are done.", config: { model: "script:answer" } });
  const done = await glia.wait(run.run_id, { timeoutMs: 90_000 });
  const rest: Event[] = [];
  for await (const e of glia.streamEvents(run.run_id, { after: done.head_seq })) {
    rest.push(e);
  }
  assert.deepEqual(rest, []);
  const tail: Event[] = [];
  for await (const e of glia.streamEvents(run.run_id, { after: done.head_seq - 1 })) {
    tail.push(e);
  }
  assert.deepEqual(
    tail.map((e) => e.type),
    ["session.complete"],
  );
});

test("a stream cut again and again while the run waits, with only keep-alives, is not an outage", async () => {
  // A gateway that cuts every answer after 3 s (the dispatcher answers every time).
  const proxy = new FaultyProxy(env("GLIA_URL"), (_method, url) =>
    url.includes("/events/stream") ? { kind: "forward", cutAfterMs: 3_000 } : { kind: "forward" },
  );
  // Outages end after 1 s; a connection open for 0.5 s shows the dispatcher is there.
  const proxied = client("acme", { baseUrl: await proxy.listen(), maxOutageMs: 1_000, streamHealthyMs: 500, minDelayMs: 10, maxDelayMs: 50 });
  const direct = client();
  try {
    const run = await direct.submitRun({ goal: "Refund order A1.", config: refundWithApproval() });
    const seen: Event[] = [];
    let approving: Promise<unknown> | undefined;
    for await (const event of proxied.streamEvents(run.run_id)) {
      seen.push(event);
      if (event.type === "approval.requested") {
        // Approve (beside the stream, which must go on reconnecting) only after
        // three more connections cut with no event: far past maxOutageMs.
        const streamsBefore = proxy.count("forward", "/events/stream");
        const callId = (event.data as { call_id: string }).call_id;
        approving = eventually("three more stream connections", () =>
          proxy.count("forward", "/events/stream") >= streamsBefore + 3 ? true : undefined,
        ).then(() => direct.approve(run.run_id, callId));
        approving.catch(() => undefined);
      }
    }
    assert.ok(approving, "the approval was requested");
    await approving;
    assert.equal(seen.at(-1)?.type, "session.complete");
    assert.deepEqual(
      seen.map((e) => e.seq),
      seen.map((_, i) => i + 1),
    );
    assert.deepEqual(proxy.failures, []);
  } finally {
    await proxy.close();
  }
});

test("wait goes on reading the run when its stream fails", async () => {
  // A gateway that refuses event streams (503) and passes everything else.
  const proxy = new FaultyProxy(env("GLIA_URL"), (_method, url) =>
    url.includes("/events/stream") ? { kind: "refuse" } : { kind: "forward" },
  );
  const proxied = client("acme", { baseUrl: await proxy.listen(), maxOutageMs: 500, minDelayMs: 10, maxDelayMs: 50 });
  const direct = client();
  try {
    const run = await direct.submitRun({ goal: "Refund order A1.", config: refundWithApproval() });
    const parked = await direct.wait(run.run_id, { timeoutMs: 90_000 });
    assert.equal(parked.pull_point?.kind, "awaiting_approval");
    // The stream alone gives up after maxOutageMs.
    await assert.rejects(
      proxied.streamEvents(run.run_id).next(),
      (e: unknown) => (e instanceof GliaError && e.status === 503) || e instanceof GliaUnreachableError,
    );
    let failed: unknown;
    const waiting = proxied.wait(run.run_id, { afterSeq: parked.head_seq, timeoutMs: 120_000 });
    waiting.catch((e: unknown) => {
      failed = e;
    });
    // Once its stream has failed (refused for longer than maxOutageMs), the run goes on.
    const refusedBefore = proxy.count("refuse", "/events/stream");
    await eventually("the wait's stream refused", () => (proxy.count("refuse", "/events/stream") > refusedBefore ? true : undefined));
    const firstRefusal = Date.now();
    await eventually("the wait's stream given up", () => (failed !== undefined || Date.now() - firstRefusal > 2_000 ? true : undefined));
    assert.equal(failed, undefined, `the wait failed: ${String(failed)}`);
    await direct.approve(run.run_id, parked.pull_point?.call_ids?.[0] ?? "");
    const done = await waiting;
    assert.equal(done.status, "done");
    assert.equal(done.outcome?.kind, "succeeded");
  } finally {
    await proxy.close();
  }
});
