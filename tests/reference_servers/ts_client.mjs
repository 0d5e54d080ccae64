// An MCP client written with the official TypeScript SDK (@modelcontextprotocol/sdk), for tests
// that drive the stopdesk MCP gateway with a client no one here wrote.
//
//   node ts_client.mjs URL STEPS_JSON [HEADERS_JSON]
//
// STEPS_JSON is a list of steps run in order on one connection:
//   {"list": true}                                   tools/list
//   {"call": NAME, "arguments": {...}}               tools/call
//   {"call": NAME, "arguments": {...}, "abort_ms": N} tools/call, cancelled by the client after N ms
//                                                    (the SDK sends notifications/cancelled)
// Each step prints one JSON line: {"step": i, "ok": true, "result": ...} or
// {"step": i, "ok": false, "code": ..., "message": ...}. A line {"ready": true, ...} comes first,
// once connected, with the protocol version the SDK negotiated.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, stepsJson, headersJson] = process.argv.slice(2);
const steps = JSON.parse(stepsJson);
const headers = headersJson ? JSON.parse(headersJson) : {};

const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

const client = new Client({ name: "ts-sdk-test-client", version: "1.32.2" });
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
await client.connect(transport);
say({ ready: true, protocolVersion: transport.protocolVersion ?? null, sessionId: transport.sessionId ?? null });

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
    const result = await client.callTool({ name: step.call, arguments: step.arguments ?? {} }, undefined, options);
    say({ step: i, ok: true, result });
  } catch (error) {
    say({ step: i, ok: false, code: error?.code ?? null, message: String(error?.message ?? error) });
  }
}
await client.close();
