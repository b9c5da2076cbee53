import { GliaClient } from "@glia/client";

// Approve every call waiting for a person, as the arguments were proposed.
const glia = new GliaClient({ baseUrl: process.env.GLIA_URL ?? "http://127.0.0.1:8080", token: process.env.GLIA_TOKEN });
const { approvals } = await glia.listApprovals({ status: "pending" });
for (const a of approvals) {
  console.log(`approving ${a.tool}(${JSON.stringify(a.input)}) in run ${a.run_id}`);
  await glia.approve(a.run_id, a.call_id, { argsHash: a.args_hash });
}
