// A payload retried after a lost answer counts as landed only when the
// run's log shows it (not another person's decision, result or message),
// against the real fleet through a proxy that refuses an attempt without
// forwarding it (503) or forwards it and loses the answer (502).

import assert from "node:assert/strict";
import { test } from "node:test";

import { GliaError, type Event, type GliaClient } from "../src/index.js";
import { FaultyProxy, bothCallsNeedApproval, client, env, externalLookup, type ProxyAction } from "./helpers.js";

async function allEvents(runId: string): Promise<Event[]> {
  const page = await client().listEvents(runId, { limit: 1000 });
  return page.events;
}

/**
 * `use` a client whose first POST to a path containing `part` gets `first`
 * from a {@link FaultyProxy} (every other request is forwarded); the proxy
 * is closed after.
 */
async function throughProxy<T>(part: string, first: ProxyAction, use: (glia: GliaClient, proxy: FaultyProxy) => Promise<T>): Promise<T> {
  let used = false;
  const proxy = new FaultyProxy(env("GLIA_URL"), (method, url) => {
    if (!used && method === "POST" && url.includes(part)) {
      used = true;
      return first;
    }
    return { kind: "forward" };
  });
  try {
    const result = await use(client("acme", { baseUrl: await proxy.listen(), minDelayMs: 10, maxDelayMs: 50 }), proxy);
    assert.equal(proxy.count(first.kind, part), 1, `the proxy did "${first.kind}" once`);
    assert.deepEqual(proxy.failures, []);
    return result;
  } finally {
    await proxy.close();
  }
}

/** An `assert.rejects` check: a {@link GliaError} with one of `codes`. */
function refusedWith(...codes: string[]): (e: unknown) => true {
  return (e) => {
    assert.ok(e instanceof GliaError, String(e));
    assert.ok(codes.includes(e.code), e.message);
    return true;
  };
}

/** The run's next parked (or done) state past `afterSeq`, or its first. */
function next(runId: string, afterSeq?: number): ReturnType<GliaClient["wait"]> {
  return client().wait(runId, { timeoutMs: 90_000, ...(afterSeq !== undefined ? { afterSeq } : {}) });
}

test("decisions: another's decision is not taken for a lost attempt's; a lost attempt's is, also once the run is done", async () => {
  const direct = client();
  const run = await direct.submitRun({ goal: "Refund order A1.", config: bothCallsNeedApproval() });
  const first = await next(run.run_id);
  assert.equal(first.pull_point?.kind, "awaiting_approval", JSON.stringify(first));
  const getOrder = first.pull_point?.call_ids?.[0];
  assert.ok(getOrder);

  // A's approval is refused without reaching the dispatcher; meanwhile B rejects. A's retry finds the call decided.
  await throughProxy("/approvals/", { kind: "refuse", first: () => direct.reject(run.run_id, getOrder, "B says no") }, (glia) =>
    assert.rejects(glia.approve(run.run_id, getOrder), refusedWith("already_decided")),
  );
  const resolved = (await allEvents(run.run_id)).filter((e) => e.type === "approval.resolved");
  assert.deepEqual(
    resolved.map((e) => (e.data as { decision: { kind: string } }).decision.kind),
    ["reject"],
  );

  // The refund waits next (the model goes on after the rejected lookup).
  const second = await next(run.run_id, first.head_seq);
  assert.equal(second.pull_point?.kind, "awaiting_approval", JSON.stringify(second));
  const refund = second.pull_point?.call_ids?.[0];
  assert.ok(refund && refund !== getOrder);

  // A's edit is forwarded and its answer lost; the retry comes once the run is done (409 run_finished).
  const edited = { order_id: "A7" };
  const posted = await throughProxy("/approvals/", { kind: "lose", then: () => next(run.run_id, second.head_seq) }, (glia) =>
    glia.edit(run.run_id, refund, edited),
  );
  assert.equal(posted.repeated, true, JSON.stringify(posted));
  assert.deepEqual(posted.inbox_ids, []);
  assert.equal((await direct.getRun(run.run_id)).status, "done");
  const edits = (await allEvents(run.run_id)).filter(
    (e) => e.type === "approval.resolved" && (e.data as { call_id: string }).call_id === refund,
  );
  assert.deepEqual(
    edits.map((e) => (e.data as { decision: unknown }).decision),
    [{ kind: "edit", input: edited }],
  );
});

test("a decision whose answer was lost while the call waits is landed; another kind of decision is not", async () => {
  const direct = client();
  const run = await direct.submitRun({ goal: "Refund order A1.", config: bothCallsNeedApproval() });
  const parked = await next(run.run_id);
  const getOrder = parked.pull_point?.call_ids?.[0];
  assert.ok(getOrder, JSON.stringify(parked));
  const posted = await throughProxy("/approvals/", { kind: "lose" }, (glia) => glia.approve(run.run_id, getOrder));
  assert.equal(posted.repeated, true, JSON.stringify(posted));
  // A reject of the next call refused on its way, which another person approved meanwhile.
  const waiting = await next(run.run_id, parked.head_seq);
  const refund = waiting.pull_point?.call_ids?.[0];
  assert.ok(refund, JSON.stringify(waiting));
  await throughProxy("/approvals/", { kind: "refuse", first: () => direct.approve(run.run_id, refund) }, (glia) =>
    assert.rejects(glia.reject(run.run_id, refund, "no"), refusedWith("already_decided", "run_finished")),
  );
});

test("external results: a lost attempt's is landed once the run moved on; another's is not", async () => {
  const direct = client();
  const run = await direct.submitRun({ goal: "Look orders up.", config: externalLookup() });
  const first = await next(run.run_id);
  assert.equal(first.pull_point?.kind, "awaiting_tool", JSON.stringify(first));
  const a1 = first.pull_point?.call_ids?.[0];
  assert.ok(a1);
  // A1's result lands, its answer is lost, and the retry comes once the run waits for B2's:
  // the call is no longer pending (404 call_not_found), and the log shows this result.
  const posted = await throughProxy("/tool-results/", { kind: "lose", then: () => next(run.run_id, first.head_seq) }, (glia) =>
    glia.postToolResult(run.run_id, a1, { content: "A1: delivered" }),
  );
  assert.equal(posted.repeated, true, JSON.stringify(posted));
  const second = await next(run.run_id, first.head_seq);
  assert.equal(second.pull_point?.kind, "awaiting_tool", JSON.stringify(second));
  const b2 = second.pull_point?.call_ids?.[0];
  assert.ok(b2 && b2 !== a1);
  // B2's result is refused without reaching the dispatcher; B posts another and the run ends: not landed.
  const bPosts = async () => {
    await direct.postToolResult(run.run_id, b2, { content: "B2: shipped (B's answer)" });
    await direct.wait(run.run_id, { pullPoints: [], timeoutMs: 90_000 });
  };
  await throughProxy("/tool-results/", { kind: "refuse", first: bPosts }, (glia) =>
    assert.rejects(glia.postToolResult(run.run_id, b2, { content: "B2: pending" }), refusedWith("run_finished")),
  );
  const results = (await allEvents(run.run_id)).filter((e) => e.type === "tool.result");
  assert.deepEqual(
    results.map((e) => (e.data as { content: unknown }).content),
    ["A1: delivered", "B2: shipped (B's answer)"],
  );

  // Another's result posted while this one's first attempt was refused: not landed, however far the run got.
  const other = await direct.submitRun({ goal: "Look orders up.", config: externalLookup() });
  const call = (await next(other.run_id)).pull_point?.call_ids?.[0];
  assert.ok(call);
  const theirs = () => direct.postToolResult(other.run_id, call, { content: "A1: shipped (B's answer)" });
  await throughProxy("/tool-results/", { kind: "refuse", first: theirs }, (glia) =>
    assert.rejects(glia.postToolResult(other.run_id, call, { content: "A1: pending" }), refusedWith("already_answered", "call_not_found")),
  );
});

test("a cancel whose answer was lost is landed once the run is cancelled; not once it finished on its own", async () => {
  const direct = client();
  const run = await direct.submitRun({ goal: "Refund order A1.", config: bothCallsNeedApproval() });
  const parked = await next(run.run_id);
  assert.equal(parked.pull_point?.kind, "awaiting_approval");
  const posted = await throughProxy("/cancel", { kind: "lose", then: () => next(run.run_id, parked.head_seq) }, (glia) =>
    glia.cancel(run.run_id, { reason: "lost answer" }),
  );
  assert.equal(posted.repeated, true, JSON.stringify(posted));
  assert.equal((await direct.getRun(run.run_id)).outcome?.kind, "cancelled");

  // A cancel refused without reaching the dispatcher, retried once the run has finished on its own: not landed.
  const answered = await direct.submitRun({ goal: "Say you are done.", config: { model: "script:answer" } });
  await throughProxy("/cancel", { kind: "refuse", first: () => next(answered.run_id) }, (glia) =>
    assert.rejects(glia.cancel(answered.run_id), refusedWith("run_finished")),
  );
  assert.equal((await direct.getRun(answered.run_id)).outcome?.kind, "succeeded");
});

test("a message whose answer was lost is landed once the run took it; another's message is not", async () => {
  const direct = client();
  const run = await direct.submitRun({ goal: "Hello.", config: { model: "script:chat", conversational: true } });
  const first = await next(run.run_id);
  assert.equal(first.pull_point?.kind, "awaiting_input", JSON.stringify(first));
  // Forwarded, answer lost, retried once the run answered it (the head moved).
  const posted = await throughProxy("/messages", { kind: "lose", then: () => next(run.run_id, first.head_seq) }, (glia) =>
    glia.postMessage(run.run_id, "And one more thing.", { headSeq: first.head_seq }),
  );
  assert.equal(posted.repeated, true, JSON.stringify(posted));
  const second = await next(run.run_id, first.head_seq);
  assert.equal(second.pull_point?.kind, "awaiting_input", JSON.stringify(second));
  // Refused on its way while another message is posted: whether that one waits or was taken, not landed.
  const theirs = () => direct.postMessage(run.run_id, "Someone else's words.", { headSeq: second.head_seq });
  await throughProxy("/messages", { kind: "refuse", first: theirs }, (glia) =>
    assert.rejects(
      glia.postMessage(run.run_id, "My words.", { headSeq: second.head_seq }),
      refusedWith("already_posted", "head_moved", "not_awaiting_input", "run_finished"),
    ),
  );
  await next(run.run_id, second.head_seq); // the other message taken
  const inputs = (await allEvents(run.run_id)).filter((e) => e.type === "input.received");
  assert.deepEqual(
    inputs.map((e) => (e.data as { text: string }).text),
    ["And one more thing.", "Someone else's words."],
  );
});
