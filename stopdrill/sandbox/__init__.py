"""The local sandbox: the external parties stopdesk's demo, drills and tests talk to.

Each party is a real HTTP server on 127.0.0.1 (no Django anywhere in this package):

- `openai_standin.OpenAIStandin`: the Responses API, background create/retrieve/cancel.
- `mcp_server.MCPToolServer`: an MCP tool server (official SDK) with slow, destructive and
  task-capable tools.
- `crm.CRM`: versioned records, idempotent create, If-Match archive.
- `outbox.Outbox`: irreversible sends, status lookup by idempotency key.

Start one with `server.BackgroundServer(party.app)`, or all four with `server.start_all()`.
Run `python -m stopdrill.sandbox` to serve them for a walkthrough.
"""
