"""The MCP Stop gateway: a Streamable HTTP endpoint per configured MCP server (`/mcp/<name>`)
that any MCP client points at instead of the server; every `tools/call` is an item of a stopdesk
task and passes the boundary before it is forwarded (`python -m stopdesk mcp-gateway`)."""
