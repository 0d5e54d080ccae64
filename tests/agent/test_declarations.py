"""A declaration counts however the tool reaches the agent: each framework, each way of registering
a tool (decorator order, toolsets, handoffs, MCP tools declared by name), with nothing passed again to
`run_agent`. The proof is what Stop leaves behind: a tool declared read-only that Stop interrupts
is recorded cancelled, where an undeclared one would be uncertain and in review."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconcile.mechanisms.mcp.sandbox import EXPORT_REPORT, MCP_PATH, MCPToolServer
from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from stopdesk.agent.frameworks.core import RunStopped
from stopdesk.agent.frameworks.declare import ToolDeclaration, declare
from stopdesk.models import Task, WorkItem
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from stopdrill.sandbox.server import BackgroundServer

pytestmark = [pytest.mark.postgres]

PROMPT = "Report on Acme"
# The sandbox's export_report carries no readOnlyHint; the team running the agent knows an export
# only reads their data, and says so by name (no `@declare` can reach a server's tool).
EXPORT_IS_READ_ONLY = {EXPORT_REPORT: ToolDeclaration(effect="read_only", noun="report")}


def read_only(target: Any) -> Any:
    return declare(target, read_only=True, noun="report")


@dataclass
class Slow:
    """A tool body that works until Stop interrupts it; `started` is set once it runs."""

    started: threading.Event = field(default_factory=threading.Event)
    mcp_url: str = ""

    def function(self) -> Callable[..., Awaitable[str]]:
        """A fresh, undeclared function each time, so each path declares it its own way."""
        slow = self

        async def slow_report(name: str) -> str:
            """Build a long report about a company."""
            slow.started.set()
            await asyncio.sleep(30)
            return f"report on {name}"

        return slow_report


Path = Callable[[Any, int, str, str, Slow], Awaitable[Any]]


def _openai_client(base_url: str) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)


# --- openai-agents ---------------------------------------------------------------------------


async def _openai_agents(runtime: Any, task_id: int, base_url: str, model: str, tools: list[Any], **kw: Any) -> Any:
    from agents import Agent, OpenAIResponsesModel, set_tracing_disabled

    from stopdesk.agent.frameworks.openai_agents import run_agent

    set_tracing_disabled(True)
    agent = Agent(name="research", tools=tools, model=OpenAIResponsesModel(model, _openai_client(base_url)), **kw)
    return await run_agent(runtime, task_id, agent, PROMPT)


async def oa_declare_above_function_tool(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import function_tool

    return await _openai_agents(runtime, task_id, base_url, model, [read_only(function_tool(slow.function()))])


async def oa_declare_below_function_tool(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import function_tool

    return await _openai_agents(runtime, task_id, base_url, model, [function_tool(read_only(slow.function()))])


async def oa_function_tool_with_options(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import function_tool

    tool = function_tool(timeout=60)(read_only(slow.function()))
    return await _openai_agents(runtime, task_id, base_url, model, [tool])


async def oa_mcp_server_declared_by_name(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import Agent, OpenAIResponsesModel, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp

    from stopdesk.agent.frameworks.openai_agents import run_agent

    set_tracing_disabled(True)
    async with MCPServerStreamableHttp(params={"url": slow.mcp_url}, name="sandbox-tools") as server:
        model_ = OpenAIResponsesModel(model, _openai_client(base_url))
        agent = Agent(name="research", mcp_servers=[server], model=model_)
        return await run_agent(runtime, task_id, agent, PROMPT, declarations=EXPORT_IS_READ_ONLY)


async def oa_handoff_agent(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import Agent, OpenAIResponsesModel, function_tool

    billing = Agent(
        name="billing",
        tools=[function_tool(read_only(slow.function()))],
        model=OpenAIResponsesModel(model, _openai_client(base_url)),
    )
    return await _openai_agents(runtime, task_id, base_url, model, [], handoffs=[billing])


async def oa_handoff_object(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from agents import Agent, OpenAIResponsesModel, function_tool, handoff

    billing = Agent(
        name="billing",
        tools=[function_tool(read_only(slow.function()))],
        model=OpenAIResponsesModel(model, _openai_client(base_url)),
    )
    return await _openai_agents(runtime, task_id, base_url, model, [], handoffs=[handoff(billing)])


# --- pydantic-ai -----------------------------------------------------------------------------


def _pydantic_model(base_url: str, model: str) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=_openai_client(base_url)))


async def _pydantic_run(runtime: Any, task_id: int, agent: Any, **kw: Any) -> Any:
    from stopdesk.agent.frameworks.pydantic_ai import run_agent

    return await run_agent(runtime, task_id, agent, PROMPT, **kw)


async def pa_agent_tools(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(base_url, model), tools=[read_only(slow.function())])
    return await _pydantic_run(runtime, task_id, agent)


async def pa_agent_tool_above_declare(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(base_url, model))
    agent.tool_plain(read_only(slow.function()))
    return await _pydantic_run(runtime, task_id, agent)


async def pa_declare_above_agent_tool(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(base_url, model))
    read_only(agent.tool_plain(slow.function()))
    return await _pydantic_run(runtime, task_id, agent)


async def pa_declared_tool_object(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent, Tool

    agent = Agent(_pydantic_model(base_url, model), tools=[read_only(Tool(slow.function()))])
    return await _pydantic_run(runtime, task_id, agent)


async def pa_function_toolset(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent, FunctionToolset

    toolset = FunctionToolset([read_only(slow.function())])
    agent = Agent(_pydantic_model(base_url, model), toolsets=[toolset])
    return await _pydantic_run(runtime, task_id, agent)


async def pa_toolset_given_to_the_run(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent, FunctionToolset

    agent = Agent(_pydantic_model(base_url, model))
    return await _pydantic_run(runtime, task_id, agent, toolsets=[FunctionToolset([read_only(slow.function())])])


async def pa_prefixed_toolset(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent, FunctionToolset

    toolset: FunctionToolset[Any] = FunctionToolset()
    toolset.tool_plain(read_only(slow.function()))
    agent = Agent(_pydantic_model(base_url, model), toolsets=[toolset.prefixed("research")])
    return await _pydantic_run(runtime, task_id, agent)


async def pa_mcp_toolset_declared_by_name(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from pydantic_ai import Agent

    from stopdesk.agent.frameworks.mcp_tools import mcp_client
    from stopdesk.agent.frameworks.pydantic_ai import mcp_toolset

    async with mcp_client(slow.mcp_url) as mcp:
        toolset = await mcp_toolset(mcp, server="sandbox-tools")
        agent = Agent(_pydantic_model(base_url, model), toolsets=[toolset])
        return await _pydantic_run(runtime, task_id, agent, declarations=EXPORT_IS_READ_ONLY)


# --- langgraph -------------------------------------------------------------------------------


async def _langgraph(runtime: Any, task_id: int, base_url: str, model: str, tools: list[Any], **kw: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent

    client = _openai_client(base_url)
    chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
    graph = create_agent(chat, tools=tools, middleware=[StopdeskMiddleware(**kw)])
    return await run_agent(runtime, task_id, graph, {"messages": [{"role": "user", "content": PROMPT}]})


async def lg_plain_function(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    return await _langgraph(runtime, task_id, base_url, model, [read_only(slow.function())])


async def lg_tool_above_declare(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from langchain_core.tools import tool

    return await _langgraph(runtime, task_id, base_url, model, [tool(read_only(slow.function()))])


async def lg_declare_above_tool(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from langchain_core.tools import tool

    return await _langgraph(runtime, task_id, base_url, model, [read_only(tool(slow.function()))])


async def lg_structured_tool(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from langchain_core.tools import StructuredTool

    tool = StructuredTool.from_function(coroutine=read_only(slow.function()))
    return await _langgraph(runtime, task_id, base_url, model, [tool])


async def lg_hand_built_tool_node(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from stopdesk.agent.frameworks.langgraph import awrap_tool_call, run_agent

    tools = [tool(read_only(slow.function()))]
    client = _openai_client(base_url)
    chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
    bound = chat.bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools, awrap_tool_call=awrap_tool_call))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile()
    return await run_agent(runtime, task_id, graph, {"messages": [{"role": "user", "content": PROMPT}]})


async def lg_mcp_tools_declared_by_name(runtime: Any, task_id: int, base_url: str, model: str, slow: Slow) -> Any:
    from stopdesk.agent.frameworks.langgraph import mcp_tools
    from stopdesk.agent.frameworks.mcp_tools import mcp_client

    async with mcp_client(slow.mcp_url) as mcp:
        tools = await mcp_tools(mcp, server="sandbox-tools")
        return await _langgraph(runtime, task_id, base_url, model, tools, declarations=EXPORT_IS_READ_ONLY)


# (framework, how the tool reaches the agent) -> the run, and what the model calls, a turn each
# (the last one is the slow tool).
SLOW_CALL = (ToolCall("slow_report", {"name": "Acme"}),)
MCP_CALL = (ToolCall(EXPORT_REPORT, {"name": "acme", "seconds": 30}),)
HANDED_OFF = (ToolCall("transfer_to_billing", {}), *SLOW_CALL)
PREFIXED_CALL = (ToolCall("research_slow_report", {"name": "Acme"}),)
PATHS: dict[tuple[str, str], tuple[Path, tuple[ToolCall, ...]]] = {
    ("openai-agents", "@declare above @function_tool"): (oa_declare_above_function_tool, SLOW_CALL),
    ("openai-agents", "@function_tool above @declare"): (oa_declare_below_function_tool, SLOW_CALL),
    ("openai-agents", "@function_tool(...) above @declare"): (oa_function_tool_with_options, SLOW_CALL),
    ("openai-agents", "mcp_servers, declared by name"): (oa_mcp_server_declared_by_name, MCP_CALL),
    ("openai-agents", "an agent it hands off to"): (oa_handoff_agent, HANDED_OFF),
    ("openai-agents", "a handoff(...) to an agent"): (oa_handoff_object, HANDED_OFF),
    ("pydantic-ai", "Agent(tools=...)"): (pa_agent_tools, SLOW_CALL),
    ("pydantic-ai", "@agent.tool_plain above @declare"): (pa_agent_tool_above_declare, SLOW_CALL),
    ("pydantic-ai", "@declare above @agent.tool_plain"): (pa_declare_above_agent_tool, SLOW_CALL),
    ("pydantic-ai", "a declared Tool(...)"): (pa_declared_tool_object, SLOW_CALL),
    ("pydantic-ai", "FunctionToolset"): (pa_function_toolset, SLOW_CALL),
    ("pydantic-ai", "run_agent(toolsets=...)"): (pa_toolset_given_to_the_run, SLOW_CALL),
    ("pydantic-ai", "prefixed FunctionToolset"): (pa_prefixed_toolset, PREFIXED_CALL),
    ("pydantic-ai", "MCP toolset, declared by name"): (pa_mcp_toolset_declared_by_name, MCP_CALL),
    ("langgraph", "a plain function"): (lg_plain_function, SLOW_CALL),
    ("langgraph", "@tool above @declare"): (lg_tool_above_declare, SLOW_CALL),
    ("langgraph", "@declare above @tool"): (lg_declare_above_tool, SLOW_CALL),
    ("langgraph", "StructuredTool.from_function"): (lg_structured_tool, SLOW_CALL),
    ("langgraph", "ToolNode(awrap_tool_call=) in a hand-built graph"): (lg_hand_built_tool_node, SLOW_CALL),
    ("langgraph", "MCP tools, declared by name"): (lg_mcp_tools_declared_by_name, MCP_CALL),
}


@pytest.fixture
def mcp_party() -> Iterator[tuple[MCPToolServer, str]]:
    party = MCPToolServer(default_seconds=0.1)
    with BackgroundServer(party.app, name="mcp") as server:
        yield party, server.url + MCP_PATH


def _operator(runtime: Any, task_id: int, started: Callable[[], bool]) -> threading.Thread:
    """Presses Stop once the tool's body is running."""

    def press() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 15
            while not started() and time.monotonic() < deadline:
                time.sleep(0.01)
            runtime.request_stop(task_id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=press)
    thread.start()
    return thread


@pytest.mark.parametrize(("framework", "path"), list(PATHS), ids=[f"{f}: {p}" for f, p in PATHS])
def test_a_read_only_declaration_counts_however_the_tool_reaches_the_agent(framework, path, model, runtime, mcp_party):  # type: ignore[no-untyped-def]
    party, url = model
    mcp, mcp_url = mcp_party
    run_path, calls = PATHS[(framework, path)]
    call = calls[-1]
    turns = [*(Turn(tool_calls=(c,)) for c in calls), Turn(text="x")]
    name = party.load_script(Script.build(f"declared-{framework}-{path}", turns))
    task = runtime.create_task(PROMPT)
    slow = Slow(mcp_url=mcp_url)
    remote = call.name == EXPORT_REPORT
    operator = _operator(
        runtime, task.id, lambda: bool(mcp.journal(EXPORT_REPORT)) if remote else slow.started.is_set()
    )
    began = time.monotonic()

    with pytest.raises(RunStopped):
        asyncio.run(run_path(runtime, task.id, url, name, slow))
    operator.join(10)

    assert time.monotonic() - began < 15
    (tool,) = [i for i in WorkItem.objects.filter(task_id=task.id) if i.label == call.name]
    # Declared read-only, so an interrupted call did nothing: cancelled, not uncertain, not in review.
    assert (tool.state, tool.needs_review, tool.investigate_by) == (S.CANCELLED, False, None)
    assert tool.outcome == f"{call.name}: interrupted by Stop"
    assert (tool.noun, tool.detail["tool"]["effect"], tool.detail["tool"]["declared"]) == ("report", "read_only", True)
    if remote:
        # Still recorded as the server's tool, with the server's own hints beside the declaration.
        assert tool.kind == "remote_tool"
        assert tool.detail["tool"]["mcp"]["annotations"]["readOnlyHint"] is False
    assert "One report stopped before it finished." in task_summary(Task.objects.get(pk=task.id))
