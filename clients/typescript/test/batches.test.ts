// A 200-item batch: submitted as JSON Lines, followed to its end, every result read.

import assert from "node:assert/strict";
import { test } from "node:test";

import { GliaError, type BatchItem, type BatchView, type ItemResult } from "../src/index.js";
import { client, scriptConfig } from "./helpers.js";

test("a 200-item batch runs every item and yields every result in order", async () => {
  const glia = client();
  async function* items(): AsyncGenerator<BatchItem> {
    for (let i = 1; i <= 200; i++) {
      yield { custom_id: `item-${i}`, goal: "Answer item {{ n }}.", inputs: { n: i }, metadata: { n: String(i) } };
    }
  }
  const key = `ts-batch-${crypto.randomUUID()}`;
  const batch = await glia.submitBatch({ config: scriptConfig("answer"), options: { max_in_flight: 50 } }, items(), {
    idempotencyKey: key,
  });
  assert.equal(batch.status, "active");
  // The same key answers the same batch.
  const again = await glia.submitBatch({ config: scriptConfig("answer"), options: { max_in_flight: 50 } }, items(), {
    idempotencyKey: key,
  });
  assert.equal(again.id, batch.id);

  const views: BatchView[] = [];
  for await (const view of glia.batchProgress(batch.id)) {
    views.push(view);
  }
  const last = views.at(-1);
  assert.ok(last, "progress was reported");
  assert.equal(last.status, "completed", JSON.stringify(last));
  assert.equal(last.counts.succeeded, 200);

  const results: ItemResult[] = [];
  for await (const result of glia.batchResults(batch.id)) {
    results.push(result);
  }
  assert.equal(results.length, 200);
  assert.deepEqual(
    results.map((r) => r.custom_id),
    Array.from({ length: 200 }, (_, i) => `item-${i + 1}`),
  );
  for (const r of results) {
    assert.equal(r.status, "succeeded", JSON.stringify(r));
    assert.equal(r.answer, "Done: the goal is met.");
    assert.ok(r.run_id);
  }
  assert.equal(new Set(results.map((r) => r.run_id)).size, 200, "one run per item");
  const fetched = await glia.getBatch(batch.id);
  assert.equal(fetched.counts.succeeded, 200);
});

test("a bad line refuses the batch, naming the line, the item and the field", async () => {
  const glia = client();
  const items: BatchItem[] = [
    { custom_id: "ok", goal: "Fine." },
    { custom_id: "ok", goal: "A repeated custom_id." },
  ];
  await assert.rejects(glia.submitBatch({ config: scriptConfig("answer") }, items), (e: unknown) => {
    assert.ok(e instanceof GliaError, String(e));
    assert.equal(e.status, 422);
    // The dispatcher's line (1 is the spec), and the caller's item.
    assert.equal(e.line, 3);
    assert.equal(e.item, 2);
    assert.match(e.message, /\(line 3 is item 2\)$/);
    return true;
  });
  // A bad spec is line 1 and no item.
  await assert.rejects(
    glia.submitBatch({ config: scriptConfig("answer", { budget: { max_turns: -1 } }) }, [{ custom_id: "a", goal: "Fine." }]),
    (e: unknown) => {
      assert.ok(e instanceof GliaError, String(e));
      assert.equal(e.status, 422);
      assert.equal(e.line, 1, e.message);
      assert.equal(e.item, null);
      assert.doesNotMatch(e.message, /is item/);
      return true;
    },
  );
});
