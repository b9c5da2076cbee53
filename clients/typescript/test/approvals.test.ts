// Decide approvals: edit (the edited arguments run), bulk, and the first decision winning.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { GliaError, GliaTimeoutError, type Event } from "../src/index.js";
import { client, env, refundWithApproval } from "./helpers.js";

async function allEvents(runId: string): Promise<Event[]> {
  const glia = client();
  const events: Event[] = [];
  let after = 0;
  for (;;) {
    const page = await glia.listEvents(runId, { after });
    if (page.events.length === 0) {
      return events;
    }
    events.push(...page.events);
    after = page.next_after;
  }
}

test("approve with an edit: the edited arguments run", async () => {
  const glia = client();
  const run = await glia.submitRun({ goal: "Refund order A1.", config: refundWithApproval() });
  const parked = await glia.wait(run.run_id, { timeoutMs: 90_000 });
  assert.equal(parked.status, "parked");
  assert.equal(parked.pull_point?.kind, "awaiting_approval");
  // Waiting for a pull point it is not at ends with a timeout.
  await assert.rejects(glia.wait(run.run_id, { pullPoints: ["awaiting_input"], timeoutMs: 2_500 }), GliaTimeoutError);
  const queue = await glia.listApprovals({ run_id: run.run_id });
  assert.equal(queue.approvals.length, 1);
  const row = queue.approvals[0];
  assert.ok(row);
  assert.equal(row.tool, "refund_order");
  assert.deepEqual(row.input, { order_id: "A1" });

  const posted = await glia.edit(run.run_id, row.call_id, { order_id: "A2" }, { argsHash: row.args_hash });
  assert.deepEqual(posted.kinds, ["approval"]);
  assert.equal(posted.repeated, undefined);
  // The first decision wins (or the run has finished meanwhile).
  await assert.rejects(
    glia.approve(run.run_id, row.call_id),
    (e: unknown) => e instanceof GliaError && e.status === 409 && (e.code === "already_decided" || e.code === "run_finished"),
  );

  const done = await glia.wait(run.run_id, { timeoutMs: 90_000, afterSeq: parked.head_seq });
  assert.equal(done.outcome?.kind, "succeeded");
  const events = await allEvents(run.run_id);
  const result = events.find((e) => e.type === "tool.result" && (e.data as { call_id: string }).call_id === row.call_id);
  assert.ok(result, "the refund ran");
  const content = JSON.stringify((result.data as { content: unknown }).content);
  assert.match(content, /A2/, "with the edited order id");
  assert.doesNotMatch(content, /"order_id\\?":\\?"A1/);
  // The refund took effect once, under the call's idempotency key.
  const key = /idempotency_key\\?":\\?"([^"\\]+)/.exec(content)?.[1];
  assert.ok(key, `the result names its idempotency key: ${content}`);
  const effects = readFileSync(env("GLIA_EFFECTS_FILE"), "utf8").split("\n");
  assert.deepEqual(
    effects.filter((l) => l.endsWith(` ${key}`)),
    [`refund ${key}`],
  );
});

test("bulk decisions: reject one run's refund and approve another's", async () => {
  const glia = client();
  const runs = await Promise.all(
    ["first", "second"].map((n) => glia.submitRun({ goal: `Refund order A1 (${n}).`, config: refundWithApproval() })),
  );
  const parked = await Promise.all(runs.map((r) => glia.wait(r.run_id, { timeoutMs: 90_000 })));
  const calls = parked.map((r) => r.pull_point?.call_ids?.[0]);
  assert.ok(calls.every((c) => c !== undefined), JSON.stringify(parked.map((r) => r.pull_point)));
  const [a, b] = runs;
  const [callA, callB] = calls as [string, string];
  assert.ok(a && b);
  const results = await glia.decideMany([
    { run_id: a.run_id, call_id: callA, decision: "reject", reason: "not this one" },
    { run_id: b.run_id, call_id: callB, decision: "approve" },
    { run_id: b.run_id, call_id: "no-such-call", decision: "approve" },
  ]);
  assert.equal(results.results.length, 3);
  assert.equal(results.results[0]?.accepted?.run_id, a.run_id);
  assert.equal(results.results[1]?.accepted?.run_id, b.run_id);
  assert.ok(results.results[2]?.error, "an unknown call is refused on its own");
  const [doneA, doneB] = await Promise.all(
    parked.map((r) => glia.wait(r.run_id, { timeoutMs: 90_000, afterSeq: r.head_seq })),
  );
  assert.equal(doneA?.status, "done");
  assert.equal(doneB?.status, "done");
  const eventsA = await allEvents(a.run_id);
  assert.ok(!eventsA.some((e) => e.type === "tool.result" && (e.data as { call_id: string }).call_id === callA), "the rejected refund never ran");
  const eventsB = await allEvents(b.run_id);
  assert.ok(eventsB.some((e) => e.type === "tool.result" && (e.data as { call_id: string }).call_id === callB), "the approved refund ran");
});
