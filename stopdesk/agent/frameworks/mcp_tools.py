"""Tools served by an MCP server, for frameworks without an MCP client of their own here
(pydantic-ai's `MCPToolset` needs `fastmcp`, LangChain's needs `langchain-mcp-adapters`; neither
is part of the extras). Built over the official `mcp` SDK's `Client`, so a call runs in the
caller's task: when Stop cancels the run, the SDK cancels the call's scope and sends
`notifications/cancelled` to the server (the MCP specification, "Cancellation").

    async with mcp_client("http://127.0.0.1:8000/mcp") as client:
        tools = await remote_tools(client, server="crm")

Each `RemoteTool` carries the server's annotations (with the spec's defaults for absent hints) and
the declaration they imply: read-only when the server says `readOnlyHint`, otherwise possibly
destructive. The framework modules record a call of one as a remote tool (kind `remote_tool`,
`detail.tool.mcp` = server, tool, annotations), as the Agents SDK integration does for the
servers the SDK lists. A cancelled call gets no answer, so a non-read-only one is uncertain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters

from reconcile.mechanisms.mcp.adapter import annotations_of
from stopdesk.agent.frameworks.declare import ToolDeclaration

METADATA_KEY = "stopdesk_mcp"  # where a framework's tool object keeps the RemoteTool facts


class RemoteToolError(Exception):
    """The server answered the call with `isError`: it ran and failed."""


@dataclass(frozen=True)
class RemoteTool:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    call: Callable[[dict[str, Any]], Awaitable[types.CallToolResult]] = field(repr=False, compare=False)
    revision: str = ""  # the MCP revision the client negotiated with the server
    transport: str = ""

    @property
    def declaration(self) -> ToolDeclaration:
        return mcp_declaration(self.name, self.annotations)

    @property
    def facts(self) -> dict[str, Any]:
        """What the ledger keeps under `detail.tool.mcp`."""
        facts: dict[str, Any] = {"server": self.server, "tool": self.name, "annotations": self.annotations}
        if self.revision:
            facts.update(revision=self.revision, transport=self.transport)
        return facts

    async def text(self, arguments: dict[str, Any]) -> str:
        """Call the tool; its text content, or RemoteToolError for an `isError` answer."""
        result = await self.call(arguments)
        text = " ".join(getattr(c, "text", "") for c in result.content) or str(result.structured_content or "")
        if result.is_error:
            raise RemoteToolError(text or f"{self.name} returned an error")
        return text


def mcp_declaration(name: str, annotations: dict[str, Any]) -> ToolDeclaration:
    """The declaration a server's annotations imply. Only `readOnlyHint` lets a cancelled call be
    recorded cancelled; anything else is possibly destructive (the spec's default), whatever
    `destructiveHint` says, because the hints come from the server, not from whoever runs the agent."""
    return ToolDeclaration(effect="read_only" if annotations.get("readOnlyHint") else "unknown", noun=f"{name} call")


def remote_facts(server: str, name: str, annotations: dict[str, Any] | None) -> dict[str, Any]:
    """The same facts for a tool another MCP client listed (wire-spelled annotations, maybe partial)."""
    hints = dict(annotations or {})
    full = {
        "readOnlyHint": bool(hints.get("readOnlyHint")),
        "destructiveHint": hints.get("destructiveHint") is not False,
        "idempotentHint": bool(hints.get("idempotentHint")),
        "openWorldHint": hints.get("openWorldHint") is not False,
    }
    return {"server": server, "tool": name, "annotations": full}


@asynccontextmanager
async def mcp_client(server: Any, **options: Any) -> AsyncIterator[Client]:
    """`mcp.Client(server)`, opened; what the body raises comes out as itself (the client's task
    group would wrap it, so a run's `RunStopped` would arrive inside an ExceptionGroup)."""
    try:
        async with Client(server, **options) as client:
            yield client
    except BaseExceptionGroup as group:
        raise _single(group) from group


def _single(group: BaseExceptionGroup[Any]) -> BaseException:
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return inner


async def remote_tools(client: Any, *, server: str = "") -> list[RemoteTool]:
    """The tools an open `mcp.Client` lists (every page), each calling through that client."""
    server = server or (client.server_info.name if getattr(client, "server_info", None) else "mcp")
    revision = str(getattr(client, "protocol_version", "") or "")
    transport = _transport_of(getattr(client, "server", None))
    found: list[RemoteTool] = []
    cursor: str | None = None
    while True:
        listing = await client.list_tools(cursor=cursor)
        for tool in listing.tools:
            found.append(
                RemoteTool(
                    server=server,
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
                    annotations=annotations_of(tool),
                    call=_caller(client, tool.name),
                    revision=revision,
                    transport=transport,
                )
            )
        cursor = listing.next_cursor
        if not cursor:
            return found


def _transport_of(server: Any) -> str:
    """How `mcp.Client(server)` reaches the server: a URL is Streamable HTTP, stdio parameters a
    child process, a `Server` object is called in-process."""
    if isinstance(server, str):
        return "streamable_http"
    if isinstance(server, StdioServerParameters):
        return "stdio"
    return "in_process" if server is not None else ""


def _caller(client: Any, name: str) -> Callable[[dict[str, Any]], Awaitable[types.CallToolResult]]:
    async def call(arguments: dict[str, Any]) -> types.CallToolResult:
        result: types.CallToolResult = await client.call_tool(name, arguments)
        return result

    return call
