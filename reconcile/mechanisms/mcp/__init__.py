"""MCP tool calls and tasks, over Streamable HTTP or stdio (the official SDK)."""
