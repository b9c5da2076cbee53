// Retries through an outage, against a local server that plays the
// dispatcher: 503s then an answer, a refused connection, a POST that is not
// idempotent.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { test } from "node:test";

import { GliaClient, GliaError, GliaUnreachableError } from "../src/index.js";

/** A server answering each request with `answer(n, req)`, n from 1; records the requests. */
async function fake(
  answer: (n: number, req: IncomingMessage, res: ServerResponse) => void,
): Promise<{ url: string; requests: IncomingMessage[]; close: () => Promise<void> }> {
  const requests: IncomingMessage[] = [];
  const server = createServer((req, res) => {
    requests.push(req);
    req.resume();
    req.on("end", () => answer(requests.length, req, res));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  return {
    url: `http://127.0.0.1:${address.port}`,
    requests,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const RUN = {
  run_id: "0190a0a0-0000-7000-8000-000000000001",
  tenant: "acme",
  goal: "g",
  status: "runnable",
  phase: "idle",
  head_seq: 1,
  tags: [],
  metadata: {},
};

function unavailable(res: ServerResponse): void {
  res.writeHead(503, { "content-type": "application/json", "retry-after": "0" });
  res.end(JSON.stringify({ error: { code: "log_unavailable", message: "the event log is restarting" } }));
}

test("a submit retried through 503s keeps its Idempotency-Key", async () => {
  const server = await fake((n, _req, res) => {
    if (n <= 2) {
      unavailable(res);
      return;
    }
    res.writeHead(201, { "content-type": "application/json" });
    res.end(JSON.stringify(RUN));
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, token: "t", minDelayMs: 10, maxDelayMs: 50 });
    const run = await glia.submitRun({ goal: "g" });
    assert.equal(run.run_id, RUN.run_id);
    assert.equal(server.requests.length, 3);
    const keys = server.requests.map((r) => r.headers["idempotency-key"]);
    assert.ok(typeof keys[0] === "string" && keys[0].length > 0);
    assert.deepEqual(keys, [keys[0], keys[0], keys[0]]);
    assert.ok(server.requests.every((r) => r.headers.authorization === "Bearer t"));
  } finally {
    await server.close();
  }
});

test("a non-idempotent POST is sent once; a persistent 503 becomes its GliaError after the deadline", async () => {
  const server = await fake((_n, _req, res) => unavailable(res));
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20, maxOutageMs: 300 });
    await assert.rejects(glia.pauseBatch("0190a0a0-0000-7000-8000-000000000002"), (e: unknown) => {
      assert.ok(e instanceof GliaError);
      assert.equal(e.status, 503);
      assert.equal(e.code, "log_unavailable");
      return true;
    });
    assert.equal(server.requests.length, 1, "pause is not repeated");
    const before = server.requests.length;
    await assert.rejects(glia.getRun(RUN.run_id), (e: unknown) => e instanceof GliaError && e.code === "log_unavailable");
    assert.ok(server.requests.length - before > 2, `a read is retried until the deadline (${server.requests.length - before} attempts)`);
  } finally {
    await server.close();
  }
});

test("a decision whose answer was lost is reported as landed", async () => {
  // First attempt: the server takes the decision but the answer is a 502; the retry finds it decided.
  const server = await fake((n, _req, res) => {
    if (n === 1) {
      res.writeHead(502).end("bad gateway");
      return;
    }
    res.writeHead(409, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { code: "already_decided", message: "call c1 is already decided" } }));
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20 });
    const posted = await glia.approve(RUN.run_id, "c1");
    assert.equal(posted.repeated, true);
    assert.deepEqual(posted.inbox_ids, []);
    // Without a retry, the same 409 is an error.
    await assert.rejects(glia.approve(RUN.run_id, "c1"), (e: unknown) => e instanceof GliaError && e.code === "already_decided");
  } finally {
    await server.close();
  }
});

test("an unreachable dispatcher fails with GliaUnreachableError after the deadline", async () => {
  const server = await fake(() => undefined);
  const url = server.url;
  await server.close(); // nothing listens there now
  const glia = new GliaClient({ baseUrl: url, minDelayMs: 10, maxDelayMs: 20, maxOutageMs: 200 });
  const started = Date.now();
  await assert.rejects(glia.getRun(RUN.run_id), (e: unknown) => {
    assert.ok(e instanceof GliaUnreachableError, String(e));
    assert.ok(e.attempts > 1, `retried (${e.attempts} attempts)`);
    assert.match(e.last, /ECONNREFUSED|fetch failed/);
    return true;
  });
  assert.ok(Date.now() - started >= 200);
});

test("an abort stops the retries", async () => {
  const server = await fake((_n, _req, res) => unavailable(res));
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 50, maxDelayMs: 50 });
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("stop")), 200);
    await assert.rejects(glia.getRun(RUN.run_id, { signal: controller.signal }), /stop/);
  } finally {
    await server.close();
  }
});

test("a retried message is taken as landed only when the run received its text next", async () => {
  let received = "Yes, refund it.";
  const server = await fake((_n, req, res) => {
    if (req.method === "POST" && server.requests.filter((r) => r.method === "POST").length % 2 === 1) {
      res.writeHead(504).end("gateway timeout");
      return;
    }
    if (req.method === "POST") {
      res.writeHead(409, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "head_moved", message: "the run's head is 9, not 7" } }));
      return;
    }
    assert.match(req.url ?? "", /\/events\?after=7/);
    res.writeHead(200, { "content-type": "application/json" });
    const event = { run_id: RUN.run_id, seq: 8, at: "2026-12-07T00:00:00Z", type: "input.received", data: { text: received } };
    res.end(JSON.stringify({ events: [event], head_seq: 9, next_after: 8 }));
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20 });
    const posted = await glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 });
    assert.equal(posted.repeated, true);
    received = "Something someone else said.";
    await assert.rejects(
      glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 }),
      (e: unknown) => e instanceof GliaError && e.code === "head_moved",
    );
  } finally {
    await server.close();
  }
});
