// Retries through an outage, against a local server that plays the
// dispatcher: 503s then an answer, a refused connection, a POST that is not
// idempotent, a retried payload checked against the run's log.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { test } from "node:test";

import { GliaClient, GliaConnectionLostError, GliaError, GliaUnreachableError } from "../src/index.js";

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

/** Answer a stream request with `events` (the run's log from seq 1) as server-sent events, then end. */
function sse(res: ServerResponse, events: { type: string; data: unknown }[]): void {
  res.writeHead(200, { "content-type": "text/event-stream" });
  events.forEach((e, i) => {
    const event = { run_id: RUN.run_id, seq: i + 1, at: "2026-12-07T00:00:00Z", type: e.type, data: e.data };
    res.write(`event: event\nid: ${i + 1}\ndata: ${JSON.stringify(event)}\n\n`);
  });
  res.end();
}

function conflict(res: ServerResponse, code: string): void {
  res.writeHead(409, { "content-type": "application/json" });
  res.end(JSON.stringify({ error: { code, message: code } }));
}

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

test("a decision whose answer was lost is landed only when the log holds the same decision", async () => {
  // Each decision's first attempt gets a 502; the retry finds the call decided. The log says how.
  let logged: unknown = { kind: "edit", input: { b: [1, { c: null }], a: "x" } };
  let posts = 0;
  const server = await fake((_n, req, res) => {
    if (req.method === "POST" && posts++ % 2 === 0) {
      res.writeHead(502).end("bad gateway");
    } else if (req.method === "POST") {
      conflict(res, "already_decided");
    } else {
      assert.match(req.url ?? "", /\/events\/stream$/);
      sse(res, [
        { type: "approval.requested", data: { call_id: "c1" } },
        { type: "approval.resolved", data: { call_id: "c0", decision: { kind: "reject", reason: "r" } } },
        { type: "approval.resolved", data: { call_id: "c1", decision: logged } },
      ]);
    }
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20 });
    // The same input in another key order is the same edit.
    const posted = await glia.edit(RUN.run_id, "c1", { a: "x", b: [1, { c: null }] });
    assert.equal(posted.repeated, true);
    assert.deepEqual(posted.inbox_ids, []);
    const anotherEdit = glia.edit(RUN.run_id, "c1", { a: "y", b: [1, { c: null }] });
    await assert.rejects(anotherEdit, (e: unknown) => e instanceof GliaError && e.code === "already_decided");
    await assert.rejects(glia.approve(RUN.run_id, "c1"), (e: unknown) => e instanceof GliaError && e.code === "already_decided");
    logged = { kind: "reject", reason: "too much" };
    await assert.rejects(glia.reject(RUN.run_id, "c1", "not now"), (e: unknown) => e instanceof GliaError && e.code === "already_decided");
    assert.equal((await glia.reject(RUN.run_id, "c1", "too much")).repeated, true);
    // Without a retry, the same 409 is an error.
    posts = 1;
    await assert.rejects(glia.reject(RUN.run_id, "c1", "too much"), (e: unknown) => e instanceof GliaError && e.code === "already_decided");
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

test("a retried message that finds a message waiting is landed only when the run then receives its text", async () => {
  let received = "Yes, refund it.";
  let posts = 0;
  const server = await fake((_n, req, res) => {
    if (req.method === "POST") {
      if (posts++ % 2 === 0) {
        unavailable(res);
      } else {
        conflict(res, "already_posted");
      }
      return;
    }
    if (req.url === `/v1/runs/${RUN.run_id}`) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ...RUN, status: "parked", head_seq: 7 }));
      return;
    }
    // Followed from the message's head_seq (7) until the run takes the waiting input.
    assert.match(req.url ?? "", /\/events\/stream$/);
    assert.equal(req.headers["last-event-id"], "7");
    res.writeHead(200, { "content-type": "text/event-stream" });
    const event = (seq: number, type: string, data: unknown) =>
      `event: event\nid: ${seq}\ndata: ${JSON.stringify({ run_id: RUN.run_id, seq, at: "2026-12-07T00:00:00Z", type, data })}\n\n`;
    res.write(event(8, "session.resume", { by: null }));
    res.end(event(9, "input.received", { text: received }));
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20 });
    assert.equal((await glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 })).repeated, true);
    received = "Another person's message.";
    await assert.rejects(
      glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 }),
      (e: unknown) => e instanceof GliaError && e.code === "already_posted",
    );
  } finally {
    await server.close();
  }
});

test("a non-idempotent request whose connection failed after sending is GliaConnectionLostError, not retried", async () => {
  const server = await fake((_n, req) => req.socket.destroy());
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20, maxOutageMs: 5_000 });
    await assert.rejects(glia.pauseBatch("0190a0a0-0000-7000-8000-000000000002"), (e: unknown) => {
      assert.ok(e instanceof GliaConnectionLostError, String(e));
      assert.equal(e.request, "POST /v1/batches/0190a0a0-0000-7000-8000-000000000002/pause");
      assert.match(e.message, /may have reached the dispatcher/);
      return true;
    });
    assert.equal(server.requests.length, 1, "the pause is not repeated");
    // The typed client's POSTs too; its reads are retried.
    await assert.rejects(glia.api.POST("/v1/webhooks", { body: { url: "http://127.0.0.1:1/h" } }), GliaConnectionLostError);
    assert.equal(server.requests.length, 2);
  } finally {
    await server.close();
  }
  // A connection never made sent nothing: even a request that is not idempotent is retried, then unreachable.
  const closed = await fake(() => undefined);
  await closed.close();
  const glia = new GliaClient({ baseUrl: closed.url, minDelayMs: 10, maxDelayMs: 20, maxOutageMs: 200 });
  await assert.rejects(glia.createWebhook({ url: "http://127.0.0.1:1/h" }), (e: unknown) => {
    assert.ok(e instanceof GliaUnreachableError, String(e));
    assert.ok(e.attempts > 1, `retried (${e.attempts} attempts)`);
    return true;
  });
});

test("a retried message is taken as landed only when the run received its text next", async () => {
  let received: { text: string; redactions?: unknown[] } = { text: "Yes, refund it." };
  let code = "head_moved";
  const server = await fake((_n, req, res) => {
    if (req.method === "POST" && server.requests.filter((r) => r.method === "POST").length % 2 === 1) {
      res.writeHead(504).end("gateway timeout");
      return;
    }
    if (req.method === "POST") {
      conflict(res, code);
      return;
    }
    // The log after the message's head_seq (7) as it is now: the input a worker took.
    const after = new URL(req.url ?? "", server.url).searchParams.get("after");
    assert.match(req.url ?? "", /\/events\?/);
    const events = after === "7" ? [{ run_id: RUN.run_id, seq: 8, at: "2026-12-07T00:00:00Z", type: "input.received", data: received }] : [];
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ events, head_seq: 9, next_after: 8 }));
  });
  try {
    const glia = new GliaClient({ baseUrl: server.url, minDelayMs: 10, maxDelayMs: 20 });
    // The run took the message and moved on, is mid-step, or is done.
    for (code of ["head_moved", "not_awaiting_input", "run_finished"]) {
      received = { text: "Yes, refund it." };
      const posted = await glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 });
      assert.equal(posted.repeated, true, code);
      received = { text: "Something someone else said." };
      await assert.rejects(
        glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 }),
        (e: unknown) => e instanceof GliaError && e.code === code,
      );
      // A redacted message is not this one either: its text is not this text.
      received = { text: "My card is [redacted].", redactions: [{ guardrail: "card", count: 1 }] };
      await assert.rejects(
        glia.postMessage(RUN.run_id, "Yes, refund it.", { headSeq: 7 }),
        (e: unknown) => e instanceof GliaError && e.code === code,
      );
    }
  } finally {
    await server.close();
  }
});
