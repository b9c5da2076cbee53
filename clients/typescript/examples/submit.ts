import { GliaClient } from "@glia/client";

// Submit a goal, follow its events as they happen, and print the answer.
const glia = new GliaClient({ baseUrl: process.env.GLIA_URL ?? "http://127.0.0.1:8080", token: process.env.GLIA_TOKEN });
const run = await glia.submitRun({ goal: process.argv[2] ?? "Say hello.", config: { model: process.env.GLIA_MODEL ?? "script:answer" } });
for await (const event of glia.streamEvents(run.run_id)) {
  console.error(`#${event.seq} ${event.type}`);
}
const done = await glia.getRun(run.run_id);
console.log(done.outcome?.answer ?? `${done.outcome?.kind}: ${done.error}`);
