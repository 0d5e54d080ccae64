// An MCP client written with the official TypeScript SDK, for tests that drive the stopdesk MCP
// gateway with a client no one here wrote: v1 (@modelcontextprotocol/sdk, 2025-11-25 only) or v2
// (@modelcontextprotocol/client, which also speaks 2026-07-28 when asked to).
//
//   node ts_client.mjs URL STEPS_JSON [HEADERS_JSON] [SDK] [MODE]
//
// SDK is "v1" (the default) or "v2"; MODE, for v2, is "legacy" (its default) or "auto" (probe with
// server/discover, 2026-07-28 when the server offers it).
// STEPS_JSON is a list of steps run in order on one connection:
//   {"list": true}                                   tools/list
//   {"call": NAME, "arguments": {...}}               tools/call
//   {"call": NAME, "arguments": {...}, "abort_ms": N} tools/call, cancelled by the client after N ms
//                                                    (notifications/cancelled, or a closed stream)
// Each step prints one JSON line: {"step": i, "ok": true, "result": ...} or
// {"step": i, "ok": false, "code": ..., "message": ...}. A line {"ready": true, ...} comes first,
// once connected.
const [url, stepsJson, headersJson, sdk = "v1", mode = "legacy"] = process.argv.slice(2);
const steps = JSON.parse(stepsJson);
const headers = headersJson ? JSON.parse(headersJson) : {};

const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

let client;
let transport;
if (sdk === "v2") {
  const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
  client = new Client({ name: "ts-sdk-v2-test-client", version: "2.3.1" }, { versionNegotiation: { mode } });
  transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
} else {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  client = new Client({ name: "ts-sdk-test-client", version: "1.32.2" });
  transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
}
await client.connect(transport);
const negotiated = sdk === "v2" ? client.getNegotiatedProtocolVersion() : transport.protocolVersion;
say({ ready: true, protocolVersion: negotiated ?? null, sessionId: transport.sessionId ?? null });

for (const [i, step] of steps.entries()) {
  try {
    if (step.list) {
      const listing = await client.listTools();
      say({ step: i, ok: true, result: listing.tools.map((tool) => tool.name) });
      continue;
    }
    const options = { timeout: 60000 };
    if (step.abort_ms !== undefined) {
      const controller = new AbortController();
      setTimeout(() => controller.abort("the user cancelled"), step.abort_ms);
      options.signal = controller.signal;
    }
    const params = { name: step.call, arguments: step.arguments ?? {} };
    // v1 takes a result schema before the options; v2 only the options.
    const result = sdk === "v2" ? await client.callTool(params, options) : await client.callTool(params, undefined, options);
    say({ step: i, ok: true, result });
  } catch (error) {
    say({ step: i, ok: false, code: error?.code ?? null, message: String(error?.message ?? error) });
  }
}
await client.close();
