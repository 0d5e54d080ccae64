"""pydantic-ai (pydantic-ai-slim 2.68): every tool call and model request in the ledger, and Stop.

    from pydantic_ai import Agent
    from stopdesk.agent.frameworks.pydantic_ai import run_agent

    @declare(read_only=True)
    async def lookup(q: str) -> str: ...

    agent = Agent(OpenAIChatModel("gpt-5", provider=OpenAIProvider(openai_client=client)), tools=[lookup])
    result = await run_agent(runtime, task.id, agent, "Add Acme as a lead")

A tool's declaration is read from the tool the run calls, however it reached the agent
(`Agent(tools=)`, `@agent.tool` above or below `@declare`, a `FunctionToolset`, wrapped or
prefixed); `run_agent(declarations={name: ...})` names what other tools do, and wins.

Hook points (read in the installed package): a capability's `wrap_tool_execute(ctx, call=ToolCallPart,
tool_def, args, handler)` encloses the tool's whole execution and may answer without calling
`handler` (so after Stop the body never runs and the model reads a "stopped" result);
`wrap_model_request(ctx, request_context, handler)` encloses each model request. Stop fires a
`CancellationToken` passed to `agent.run(..., cancellation_token=)`: pydantic-ai cancels its own
run task, drains in-flight tool tasks and raises `RunCancelled`, which becomes `RunStopped` here.

What Stop interrupts: an `async def` tool at its next await. A plain `def` tool runs in a thread,
which no cancel reaches; the run hands pydantic-ai stopdesk's executor (`Agent.using_thread_executor`;
pydantic-ai's own threads would hold the cancel until the function returned), so the call is
recorded as still running and then as it ended (`core`), unless it checks `stop_requested()` and
raises `ToolStopped`. A `UseThreadExecutor` capability of your own replaces that executor, and
such a call is then recorded "interrupted by Stop" while it runs on.

Tools served by an MCP server: `await mcp_toolset(client)` over an open `mcp.Client` (the run's
cancel reaches the call, and the SDK sends `notifications/cancelled`); each call is recorded as a
remote tool with the server's annotations. Tools of pydantic-ai's own `MCPToolset` (it needs
`fastmcp`) are recognised by the annotations in their metadata and recorded the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, CancellationToken, FunctionToolset, RunCancelled, Tool
from pydantic_ai.capabilities import AbstractCapability

from stopdesk.agent.frameworks.core import CURRENT, StopdeskRun
from stopdesk.agent.frameworks.declare import UNDECLARED, ToolDeclaration, declaration_of, first_declaration
from stopdesk.agent.frameworks.mcp_tools import (
    METADATA_KEY,
    RemoteTool,
    mcp_declaration,
    remote_facts,
    remote_tools,
)
from stopdesk.agent.frameworks.threads import loop_tool_threads

FRAMEWORK = "pydantic-ai"


@dataclass
class StopdeskCapability(AbstractCapability[Any]):
    """Records each tool call (by the model's `tool_call_id`) and model request of a run under the
    active StopdeskRun. `declarations` says what each tool does, by tool name."""

    declarations: dict[str, ToolDeclaration] = field(default_factory=dict)

    @classmethod
    def for_tools(cls, tools: Iterable[Callable[..., Any]]) -> StopdeskCapability:
        return cls({getattr(t, "__name__", str(t)): declaration_of(t) for t in tools})

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        run = CURRENT.get()
        if run is None:
            return await handler(args)
        remote = _remote(tool_def)
        named = self.declarations.get(call.tool_name)
        if remote is not None:
            # Served by an MCP server: a remote tool with the server's annotations, which say what
            # it does unless the application declared it by name.
            declared = named or mcp_declaration(call.tool_name, remote["annotations"])
            kind, extra = "remote_tool", {"mcp": remote}
        else:
            declared, kind, extra = named or _declared_on_tool(ctx, call.tool_name), "", None
        return await run.tool_call(
            call_id=call.tool_call_id,
            name=call.tool_name,
            arguments=dict(args) if isinstance(args, dict) else {"args": str(args)},
            body=lambda: handler(args),
            declaration=declared,
            kind=kind,
            extra=extra,
        )

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        run = CURRENT.get()
        if run is None:
            return await handler(request_context)
        async with run.model_request():
            return await handler(request_context)


def _declared_on_tool(ctx: Any, name: str) -> ToolDeclaration:
    """The declaration on the tool the run is calling, however it reached the agent
    (`Agent(tools=)`, `@agent.tool` above or below `@declare`, a `FunctionToolset`, wrapped or
    prefixed): the run's tool manager holds the toolset's tool (inside the agent's combined
    toolset's), which keeps the function it calls and the toolset that registered the `Tool`."""
    tool: Any = (getattr(getattr(ctx, "tool_manager", None), "tools", None) or {}).get(name)
    if tool is None:
        return UNDECLARED
    while getattr(tool, "source_tool", None) is not None:
        tool = tool.source_tool
    schema = getattr(getattr(tool, "call_func", None), "__self__", None)  # the function's FunctionSchema
    registered = _registered_tool(tool)
    return first_declaration(registered, getattr(registered, "function", None), getattr(schema, "function", None))


def _registered_tool(tool: Any) -> Tool[Any] | None:
    """The `Tool` a FunctionToolset keeps for a toolset tool, through any wrapping toolsets."""
    toolset = getattr(tool, "toolset", None)
    while toolset is not None and not isinstance(toolset, FunctionToolset):
        toolset = getattr(toolset, "wrapped", None)
    if toolset is None:
        return None
    found: Tool[Any] | None = toolset.tools.get(getattr(tool, "original_name", None) or tool.tool_def.name)
    return found


def _remote(tool_def: Any) -> dict[str, Any] | None:
    """The MCP facts of a tool: ours (`mcp_toolset`), or pydantic-ai's own `MCPToolset`, whose
    tool definitions carry the server's annotations in their metadata."""
    metadata = getattr(tool_def, "metadata", None) or {}
    if METADATA_KEY in metadata:
        return dict(metadata[METADATA_KEY])
    if "annotations" in metadata:
        return remote_facts("", tool_def.name, metadata.get("annotations"))
    return None


async def mcp_toolset(client: Any, *, server: str = "") -> FunctionToolset[Any]:
    """The tools an open `mcp.Client` serves, as a pydantic-ai toolset (`Agent(toolsets=[...])`).
    Each call goes through that client in the run's task, so Stop cancels it with
    `notifications/cancelled`; the capability records it as a remote tool with its annotations."""
    tools = []
    for remote in await remote_tools(client, server=server):
        tool = Tool.from_schema(_body(remote), remote.name, remote.description, remote.input_schema)
        tool.metadata = {METADATA_KEY: remote.facts}
        tools.append(tool)
    return FunctionToolset(tools)


def _body(remote: RemoteTool) -> Callable[..., Any]:
    async def call(**arguments: Any) -> str:
        return await remote.text(arguments)

    return call


async def run_agent(
    runtime: Any,
    task_id: int,
    agent: Any,
    prompt: str,
    *,
    tools: Iterable[Callable[..., Any]] = (),
    declarations: dict[str, ToolDeclaration] | None = None,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    uninterruptible_s: float = 300.0,
    **run_kwargs: Any,
) -> Any:
    """`agent.run(prompt)` under `task_id`; Stop fires the run's CancellationToken (RunStopped).
    Each tool's `@declare` is read from the tool the run calls; `declarations` (by name) and the
    declarations of `tools` win over it, for tools no decorator reaches (an MCP server's)."""
    capability = StopdeskCapability.for_tools(tools)
    capability.declarations.update(declarations or {})
    token = CancellationToken()
    async with StopdeskRun(
        runtime,
        task_id,
        framework=FRAMEWORK,
        agent=agent.name or "",
        cleanup_s=cleanup_s,
        watch=watch,
        poll_s=poll_s,
        uninterruptible_s=uninterruptible_s,
    ) as run:
        work = agent.run(
            prompt,
            cancellation_token=token,
            capabilities=[capability, *run_kwargs.pop("capabilities", [])],
            **run_kwargs,
        )
        # Plain `def` tools on threads stopdesk knows (by default pydantic-ai's own, which hold
        # the cancel until the function returns, and say nothing of what it returned).
        with Agent.using_thread_executor(loop_tool_threads()):
            return await run.run(work, cancel=token.cancel, stopped_errors=(RunCancelled,))
