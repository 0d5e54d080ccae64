"""A small MCP server over stdio, built with the SDK, for the stdio shim's tests.

    python -m tests.gateway.stdio_upstream JOURNAL

`read_value` (read-only) answers at once; `slow_lookup` (read-only) and `slow_write` (destructive)
take `seconds`. Each call appends a line to JOURNAL ("started", then "finished" or "interrupted",
with the tool and the process id), so a test sees whether a cancel reached the tool."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

READ_VALUE, SLOW_LOOKUP, SLOW_WRITE = "read_value", "slow_lookup", "slow_write"
SECONDS = {"type": "number", "minimum": 0}

TOOLS = [
    types.Tool(
        name=READ_VALUE,
        input_schema={"type": "object", "properties": {"key": {"type": "string"}}},
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    types.Tool(
        name=SLOW_LOOKUP,
        input_schema={"type": "object", "properties": {"query": {"type": "string"}, "seconds": SECONDS}},
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    types.Tool(
        name=SLOW_WRITE,
        input_schema={"type": "object", "properties": {"key": {"type": "string"}, "seconds": SECONDS}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False),
    ),
]


def journal(path: str, event: str, tool: str) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, "tool": tool, "pid": os.getpid()}) + "\n")


def build(path: str) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        journal(path, "started", params.name)
        try:
            await anyio.sleep(float(arguments.get("seconds", 0)))
        except anyio.get_cancelled_exc_class():
            journal(path, "interrupted", params.name)
            raise
        journal(path, "finished", params.name)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name} done")])

    return Server("stdio-upstream", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main(path: str) -> None:
    server = build(path)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
