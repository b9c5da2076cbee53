// Agents: apply a definition (a repeat is the same version), run it by name.

import assert from "node:assert/strict";
import { test } from "node:test";

import { GliaError, type AgentDefinition } from "../src/index.js";
import { client } from "./helpers.js";

test("apply an agent and run it by name", async () => {
  const glia = client();
  const name = `ts-agent-${crypto.randomUUID().slice(0, 8)}`;
  const definition: AgentDefinition = { name, model: "script:answer", description: "Answers at once." };
  const first = await glia.applyAgent(definition);
  assert.equal(first.name, name);
  assert.equal(first.version, 1);
  assert.match(first.content_hash, /^sha256:[0-9a-f]{64}$/);
  const again = await glia.applyAgent(definition);
  assert.equal(again.version, 1, "the same content is the same version");
  const second = await glia.applyAgent({ ...definition, description: "Answers at once, again." });
  assert.equal(second.version, 2);
  assert.equal((await glia.getAgent(name)).version, 2);
  assert.equal((await glia.getAgent(name, { version: 1 })).content_hash, first.content_hash);
  assert.ok((await glia.listAgents()).some((a) => a.name === name));

  const run = await glia.submitRun({ goal: "Say you are done.", agent: `${name}@1` });
  const done = await glia.wait(run.run_id, { timeoutMs: 90_000 });
  assert.equal(done.agent, name);
  assert.equal(done.agent_version, 1);
  assert.equal(done.outcome?.answer, "Done: the goal is met.");

  await assert.rejects(glia.applyAgent({ ...definition, budget: { max_turns: -1 } }), (e: unknown) => {
    assert.ok(e instanceof GliaError);
    assert.equal(e.status, 422);
    assert.equal(e.field, "budget.max_turns");
    return true;
  });
  await assert.rejects(
    glia.submitRun({ goal: "x", agent: "no-such-agent" }),
    (e: unknown) => e instanceof GliaError && e.status === 404 && e.code === "agent_not_found",
  );
});
