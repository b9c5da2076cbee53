// Submit and read runs, idempotency, typed errors, tenant isolation.

import assert from "node:assert/strict";
import { test } from "node:test";

import { GliaError, type Event } from "../src/index.js";
import { client, refundWithApproval, scriptConfig } from "./helpers.js";

test("submit a run and get its answer", async () => {
  const glia = client();
  const run = await glia.submitRun({ goal: "Say you are done.", config: scriptConfig("answer"), tags: ["ts-client"] });
  assert.equal(run.goal, "Say you are done.");
  assert.match(run.run_id, /^[0-9a-f-]{36}$/);
  const done = await glia.wait(run.run_id, { timeoutMs: 90_000 });
  assert.equal(done.status, "done");
  assert.equal(done.outcome?.kind, "succeeded");
  assert.equal(done.outcome?.answer, "Done: the goal is met.");
  const fetched = await glia.getRun(run.run_id);
  assert.equal(fetched.run_id, run.run_id);
  assert.deepEqual(fetched.tags, ["ts-client"]);
  // The answer is the session.complete event's.
  const events: Event[] = [];
  let after = 0;
  for (;;) {
    const page = await glia.listEvents(run.run_id, { after, limit: 2 });
    events.push(...page.events);
    if (page.events.length === 0) {
      break;
    }
    after = page.next_after;
  }
  assert.deepEqual(
    events.map((e) => e.seq),
    events.map((_, i) => i + 1),
  );
  const complete = events.at(-1);
  assert.equal(complete?.type, "session.complete");
  assert.match(JSON.stringify(complete?.data), /Done: the goal is met\./);
  // Listed by its tag, newest first.
  const listed = [];
  for await (const r of glia.runs({ tag: ["ts-client"], limit: 1 })) {
    listed.push(r.run_id);
  }
  assert.ok(listed.includes(run.run_id), `${run.run_id} listed by tag`);
});

test("an idempotency key makes a second submit answer the first run", async () => {
  const glia = client();
  const key = `ts-${crypto.randomUUID()}`;
  const body = { goal: "Once only.", config: scriptConfig("answer") };
  const first = await glia.submitRun(body, { idempotencyKey: key });
  const second = await glia.submitRun(body, { idempotencyKey: key });
  assert.equal(second.run_id, first.run_id);
  await assert.rejects(
    glia.submitRun({ goal: "Something else.", config: scriptConfig("answer") }, { idempotencyKey: key }),
    (e: unknown) => e instanceof GliaError && e.status === 409 && e.code === "idempotency_conflict",
  );
});

test("errors carry the API's code, status and field", async () => {
  const glia = client();
  await assert.rejects(glia.getRun(crypto.randomUUID()), (e: unknown) => {
    assert.ok(e instanceof GliaError, `a GliaError, not ${String(e)}`);
    assert.equal(e.status, 404);
    assert.equal(e.code, "run_not_found");
    assert.match(e.message, /run_not_found/);
    return true;
  });
  await assert.rejects(
    glia.submitRun({ goal: "Bad budget.", config: { model: "script:answer", budget: { max_turns: -3 } } }),
    (e: unknown) => {
      assert.ok(e instanceof GliaError, `a GliaError, not ${String(e)}`);
      assert.equal(e.status, 422);
      assert.ok(e.code === "invalid_body" || e.code === "invalid_request", e.code);
      assert.equal(e.field, "config.budget.max_turns");
      return true;
    },
  );
  await assert.rejects(client("acme", { token: "not-a-token" }).listRuns(), (e: unknown) => {
    assert.ok(e instanceof GliaError);
    assert.equal(e.status, 401);
    assert.equal(e.code, "invalid_token");
    return true;
  });
});

test("another tenant cannot see acme's run", async () => {
  const acme = client("acme");
  const other = client("other");
  const run = await acme.submitRun({ goal: "Acme's secret goal.", config: scriptConfig("answer") });
  await assert.rejects(other.getRun(run.run_id), (e: unknown) => e instanceof GliaError && e.status === 404 && e.code === "run_not_found");
  await assert.rejects(
    other.listEvents(run.run_id),
    (e: unknown) => e instanceof GliaError && e.status === 404 && e.code === "run_not_found",
  );
  const stream = other.streamEvents(run.run_id);
  await assert.rejects(stream.next(), (e: unknown) => e instanceof GliaError && e.status === 404);
  await assert.rejects(other.cancel(run.run_id), (e: unknown) => e instanceof GliaError && e.status === 404);
  const theirs = await other.listRuns({ limit: 1000 });
  assert.ok(!theirs.runs.some((r) => r.run_id === run.run_id), "other's listing holds no acme run");
  assert.ok(theirs.runs.every((r) => r.tenant === "other"));
});

test("cancel a run mid-way", async () => {
  const glia = client();
  // Parked where only this test can let it go on (the refund waits for a decision), then cancelled.
  const run = await glia.submitRun({ goal: "Refund order A1.", config: refundWithApproval() });
  const parked = await glia.wait(run.run_id, { timeoutMs: 90_000 });
  assert.equal(parked.pull_point?.kind, "awaiting_approval", JSON.stringify(parked));
  const posted = await glia.cancel(run.run_id, { reason: "the test cancels it" });
  assert.deepEqual(posted.kinds, ["cancel"]);
  assert.equal(posted.repeated, undefined);
  // Until a worker takes the cancel up the run still shows its approval: wait for its end only.
  const done = await glia.wait(run.run_id, { pullPoints: [], timeoutMs: 90_000 });
  assert.equal(done.status, "done");
  assert.equal(done.outcome?.kind, "cancelled", JSON.stringify(done));
  assert.match(done.error ?? "", /the test cancels it/);
  await assert.rejects(glia.cancel(run.run_id), (e: unknown) => e instanceof GliaError && e.status === 409 && e.code === "run_finished");
});
