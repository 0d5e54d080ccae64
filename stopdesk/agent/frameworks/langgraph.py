"""LangGraph / LangChain (langgraph 1.2, langchain 1.5): every tool call and model request in the
ledger, and Stop.

    from langchain.agents import create_agent
    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent

    graph = create_agent(ChatOpenAI(...), tools=[lookup], middleware=[StopdeskMiddleware()])
    state = await run_agent(runtime, task.id, graph, {"messages": [("user", "Add Acme as a lead")]})

A hand-built graph uses `ToolNode(tools, awrap_tool_call=awrap_tool_call)` instead of the middleware.

Hook points (read in the installed packages): `AgentMiddleware.awrap_tool_call(request, handler)`
and `ToolNode(awrap_tool_call=)` receive a `ToolCallRequest` whose `tool_call["id"]` is the model's
call id; after Stop they answer with a `ToolMessage` for that id without calling the handler, so no
tool call is left without a result. `awrap_model_call` encloses each model request. The tool
node's error handling turns a tool's exception into a `ToolMessage(status="error")`, which is
recorded failed. Stop cancels the asyncio task running `graph.ainvoke`, which cancels the tool
tasks LangGraph is running.

The middleware records a tool call as the model's answer asks for it (`awrap_model_call`, through
`StopdeskRun.tool_call_ahead`): the registration and the boundary run while LangGraph moves on to
its tool node, a few milliseconds of its own, and the tool call takes the record over. A call that
acts outside (declared `system`/`http`) is registered when it is about to run, never sooner; a call
the graph never runs (a middleware ended it, a limit) is recorded cancelled, "never ran".

What Stop interrupts: a tool with a coroutine at its next await. A tool made from a plain function
runs in the loop's default executor, which no cancel reaches: it is recorded as still running and
then as it ended (`core`), unless it checks `stop_requested()` and raises `ToolStopped`.

Tools served by an MCP server: `await mcp_tools(client)` over an open `mcp.Client` (the cancel
reaches the call, and the SDK sends `notifications/cancelled`); each call is recorded as a remote
tool with the server's annotations.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool

from stopdesk.agent.frameworks.core import CURRENT, STOPPED_RESULT, StopdeskRun
from stopdesk.agent.frameworks.declare import ToolDeclaration, first_declaration
from stopdesk.agent.frameworks.mcp_tools import METADATA_KEY, RemoteTool, mcp_declaration, remote_tools

FRAMEWORK = "langgraph"
log = logging.getLogger(__name__)


async def awrap_tool_call(
    request: Any,
    execute: Callable[[Any], Awaitable[Any]],
    declarations: dict[str, ToolDeclaration] | None = None,
) -> Any:
    """The ToolNode wrapper: ledger and boundary around one tool call."""
    run = CURRENT.get()
    if run is None:
        return await execute(request)
    call = request.tool_call
    call_id = str(call.get("id") or "")

    async def body() -> Any:
        message = await execute(request)
        if isinstance(message, ToolMessage) and message.status == "error":
            run.note_failure(call_id, RuntimeError(str(message.content)[:200]), answer=message)
        return message

    return await run.tool_call(
        call_id=call_id,
        name=call["name"],
        arguments=dict(call.get("args") or {}),
        body=body,
        **_call_facts(call["name"], request.tool, declarations or {}),
        stopped_result=ToolMessage(content=STOPPED_RESULT, tool_call_id=call_id, name=call["name"], status="error"),
    )


def _call_facts(name: str, tool: Any, declarations: dict[str, ToolDeclaration]) -> dict[str, Any]:
    """What a call of `tool` is recorded with: its declaration, and for a tool an MCP server
    serves (`mcp_tools`), a remote tool with the server's annotations, which say what it does
    unless the application declared it by name."""
    remote = (getattr(tool, "metadata", None) or {}).get(METADATA_KEY)
    if remote is not None:
        declared = declarations.get(name) or mcp_declaration(name, remote["annotations"])
        return {"declaration": declared, "kind": "remote_tool", "extra": {"mcp": remote}}
    if name in declarations:
        return {"declaration": declarations[name]}
    # A StructuredTool keeps the function it was made from (`@declare` below `@tool`); above
    # `@tool`, the declaration sits on the tool itself.
    return {"declaration": first_declaration(getattr(tool, "coroutine", None), getattr(tool, "func", None), tool)}


def _ask_ahead(run: StopdeskRun, request: Any, response: Any, declarations: dict[str, ToolDeclaration]) -> None:
    """The tool calls the model's answer asks for are registered now (`tool_call_ahead`), while
    the graph moves on to its tool node. A call of a tool the request did not offer (a
    structured-output tool) is left alone."""
    offered = {getattr(tool, "name", None): tool for tool in request.tools if not isinstance(tool, dict)}
    model_response = getattr(response, "model_response", response)  # ExtendedModelResponse
    messages = getattr(model_response, "result", None)
    for message in messages if isinstance(messages, list) else [model_response]:
        for call in getattr(message, "tool_calls", None) or []:
            tool = offered.get(call.get("name"))
            if tool is not None and call.get("id"):
                run.tool_call_ahead(
                    call_id=str(call["id"]),
                    name=call["name"],
                    arguments=dict(call.get("args") or {}),
                    **_call_facts(call["name"], tool, declarations),
                )


async def mcp_tools(client: Any, *, server: str = "") -> list[StructuredTool]:
    """The tools an open `mcp.Client` serves, as LangChain tools (for `create_agent` or a
    `ToolNode`). Each call goes through that client in the tool node's task, so Stop cancels it
    with `notifications/cancelled`; the wrapper records it as a remote tool with its annotations.
    A server's `isError` answer raises, and the tool node turns it into an error ToolMessage."""
    return [
        StructuredTool.from_function(
            coroutine=_body(remote),
            name=remote.name,
            description=remote.description or remote.name,
            args_schema=remote.input_schema,
            metadata={METADATA_KEY: remote.facts},
        )
        for remote in await remote_tools(client, server=server)
    ]


def _body(remote: RemoteTool) -> Callable[..., Awaitable[str]]:
    async def call(**arguments: Any) -> str:
        return await remote.text(arguments)

    return call


class StopdeskMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """For `create_agent(..., middleware=[StopdeskMiddleware()])`."""

    def __init__(self, declarations: dict[str, ToolDeclaration] | None = None) -> None:
        super().__init__()
        self.declarations = dict(declarations or {})

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await awrap_tool_call(request, handler, self.declarations)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        run = CURRENT.get()
        if run is None:
            return await handler(request)
        async with run.model_request():
            response = await handler(request)
        try:
            _ask_ahead(run, request, response, self.declarations)
        except Exception:  # an answer shaped otherwise: each call is then registered as it runs
            log.exception("could not record ahead the tool calls a model answer asked for")
        return response


async def run_agent(
    runtime: Any,
    task_id: int,
    graph: Any,
    input: Any,
    *,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    uninterruptible_s: float = 300.0,
    **invoke_kwargs: Any,
) -> Any:
    """`graph.ainvoke(input)` under `task_id`; Stop cancels the graph's task (RunStopped)."""
    async with StopdeskRun(
        runtime,
        task_id,
        framework=FRAMEWORK,
        agent=_graph_name(graph),
        cleanup_s=cleanup_s,
        watch=watch,
        poll_s=poll_s,
        uninterruptible_s=uninterruptible_s,
    ) as run:
        return await run.run(graph.ainvoke(input, **invoke_kwargs))


def _graph_name(graph: Any) -> str:
    """The graph's own name; LangGraph's default ("LangGraph") says nothing the framework does not."""
    name = str(getattr(graph, "name", "") or "")
    return "" if name == "LangGraph" else name
