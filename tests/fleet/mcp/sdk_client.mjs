// The official MCP TypeScript SDK client against glia's /mcp: list the
// agents, call one over streamable HTTP with the bearer token. Run by
// tests/fleet/mcp/sdk_client.rs with GLIA_MCP_URL and GLIA_TOKEN set; it
// prints one JSON line (what it saw) and exits 0, or throws.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.env.GLIA_MCP_URL);
const token = process.env.GLIA_TOKEN;

const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "glia-fleet-test", version: "0.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const progress = [];
const result = await client.callTool(
  // Wait for the run as long as the server allows (a loaded machine may
  // take longer than the default wait); the SDK's own timeout is longer.
  { name: "answerer", arguments: { goal: "Say done." }, _meta: { "glia/wait_ms": 600000 } },
  undefined,
  { onprogress: (p) => progress.push(p.message ?? String(p.progress)), timeout: 660000 },
);
let refused = null;
try {
  await client.callTool({ name: "answerer", arguments: {} });
} catch (e) {
  refused = { code: e.code, message: e.message, data: e.data ?? null };
}
await client.close();

console.log(JSON.stringify({
  server: client.getServerVersion(),
  tools: tools.map((t) => ({ name: t.name, description: t.description, inputSchema: t.inputSchema, hasOutputSchema: !!t.outputSchema })),
  result,
  progress,
  refused,
}));
