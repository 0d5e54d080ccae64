"""Tools served by an MCP server through the framework: the Agents SDK lists them from the server on
every turn; each call is recorded as a remote tool with the server's annotations."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from reconcile.mechanisms.mcp.sandbox import MCP_PATH, SLOW_LOOKUP, SLOW_WRITE, MCPToolServer
from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from stopdesk.agent.frameworks.core import RunStopped
from stopdesk.models import WorkItem
from stopdesk.states import ItemState as S
from stopdrill.sandbox.server import BackgroundServer

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def mcp_url() -> Iterator[str]:
    party = MCPToolServer(default_seconds=0.1)
    with BackgroundServer(party.app, name="mcp") as server:
        yield server.url + MCP_PATH


async def _run(runtime, task_id: int, base_url: str, model: str, mcp_url: str) -> str:  # type: ignore[no-untyped-def]
    from agents import Agent, OpenAIResponsesModel, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.openai_agents import run_agent

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    async with MCPServerStreamableHttp(params={"url": mcp_url}, name="sandbox-tools") as server:
        agent = Agent(name="mcp", mcp_servers=[server], model=OpenAIResponsesModel(model, client))
        result = await run_agent(runtime, task_id, agent, "Look Acme up and note it")
    return str(result.final_output)


def test_mcp_tool_calls_through_the_agents_sdk_are_remote_tools_with_their_annotations(model, runtime, mcp_url):
    party, url = model
    name = party.load_script(
        Script.build(
            "mcp",
            [
                Turn(
                    tool_calls=(
                        ToolCall(SLOW_LOOKUP, {"query": "acme", "seconds": 0.05}),
                        ToolCall(SLOW_WRITE, {"key": "acme", "value": "lead", "seconds": 0.05}),
                    )
                ),
                Turn(text="noted"),
            ],
        )
    )
    task = runtime.create_task("Note Acme")

    assert asyncio.run(_run(runtime, task.id, url, name, mcp_url)) == "noted"

    tools = {i.label: i for i in WorkItem.objects.filter(task_id=task.id, kind="remote_tool")}
    assert set(tools) == {SLOW_LOOKUP, SLOW_WRITE}
    assert {i.state for i in tools.values()} == {S.COMPLETED}
    lookup, write = tools[SLOW_LOOKUP], tools[SLOW_WRITE]
    assert lookup.detail["tool"]["effect"] == "read_only"
    assert lookup.detail["tool"]["mcp"]["annotations"]["readOnlyHint"] is True
    assert write.detail["tool"]["effect"] == "unknown"  # destructive by its annotations: never "cancelled" on Stop
    assert write.detail["tool"]["mcp"]["annotations"]["destructiveHint"] is True
    assert (lookup.handle, write.handle) == ("call_0_0", "call_0_1")


# --- pydantic-ai and LangGraph: tools over the official `mcp` SDK's Client ----------------------


async def _nothing() -> None:
    return None


async def _run_pydantic_ai(
    runtime, task_id: int, base_url: str, model: str, mcp_url: str, before_close=_nothing, **kw
) -> str:  # type: ignore[no-untyped-def]
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from stopdesk.agent.frameworks.mcp_tools import mcp_client
    from stopdesk.agent.frameworks.pydantic_ai import mcp_toolset, run_agent

    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    async with mcp_client(mcp_url) as mcp:
        toolset = await mcp_toolset(mcp, server="sandbox-tools")
        agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), toolsets=[toolset])
        try:
            result = await run_agent(runtime, task_id, agent, "Look Acme up and note it", **kw)
        finally:
            await before_close()
    return str(result.output)


async def _run_langgraph(
    runtime, task_id: int, base_url: str, model: str, mcp_url: str, before_close=_nothing, **kw
) -> str:  # type: ignore[no-untyped-def]
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, mcp_tools, run_agent
    from stopdesk.agent.frameworks.mcp_tools import mcp_client

    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
    async with mcp_client(mcp_url) as mcp:
        tools = await mcp_tools(mcp, server="sandbox-tools")
        graph = create_agent(chat, tools=tools, middleware=[StopdeskMiddleware()])
        try:
            state = await run_agent(
                runtime, task_id, graph, {"messages": [{"role": "user", "content": "Look Acme up and note it"}]}, **kw
            )
        finally:
            await before_close()
    return str(state["messages"][-1].content)


OVER_THE_SDK = {"pydantic-ai": _run_pydantic_ai, "langgraph": _run_langgraph}


# What the sandbox speaks -> the revision the framework's `mcp.Client` (mode "auto") ends up using.
NEGOTIATED = {"both": "2026-07-28", "2025-11-25": "2025-11-25"}


@pytest.fixture(params=sorted(NEGOTIATED))
def mcp_party(request) -> Iterator[tuple[MCPToolServer, str]]:  # type: ignore[no-untyped-def]
    party = MCPToolServer(default_seconds=0.1, revisions=request.param)
    with BackgroundServer(party.app, name="mcp") as server:
        yield party, server.url + MCP_PATH


@pytest.mark.parametrize("framework", sorted(OVER_THE_SDK))
def test_mcp_tool_calls_are_remote_tools_with_the_servers_annotations(framework, model, runtime, mcp_party):
    party, url = model
    mcp, mcp_url = mcp_party
    name = party.load_script(
        Script.build(
            f"mcp-{framework}",
            [
                Turn(
                    tool_calls=(
                        ToolCall(SLOW_LOOKUP, {"query": "acme", "seconds": 0.05}),
                        ToolCall(SLOW_WRITE, {"key": "acme", "value": "lead", "seconds": 0.05}),
                    )
                ),
                Turn(text="noted"),
            ],
        )
    )
    task = runtime.create_task("Note Acme")

    assert asyncio.run(OVER_THE_SDK[framework](runtime, task.id, url, name, mcp_url)) == "noted"

    tools = {i.label: i for i in WorkItem.objects.filter(task_id=task.id, kind="remote_tool")}
    assert set(tools) == {SLOW_LOOKUP, SLOW_WRITE}
    assert {i.state for i in tools.values()} == {S.COMPLETED}
    lookup, write = tools[SLOW_LOOKUP], tools[SLOW_WRITE]
    assert lookup.detail["tool"]["effect"] == "read_only"
    assert lookup.detail["tool"]["mcp"] == {
        "server": "sandbox-tools",
        "tool": SLOW_LOOKUP,
        "annotations": {"readOnlyHint": True, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False},
        "revision": NEGOTIATED[mcp.revisions],
        "transport": "streamable_http",
    }
    assert write.detail["tool"]["effect"] == "unknown"  # destructive by its annotations: never "cancelled" on Stop
    assert write.detail["tool"]["mcp"]["annotations"]["destructiveHint"] is True
    assert (lookup.handle, write.handle) == ("call_0_0", "call_0_1")
    assert [e["effect"] for e in mcp.effects(SLOW_WRITE)] == ["written"]  # the call reached the server


def _stop_when_started(runtime, task_id: int, mcp: MCPToolServer, tool: str) -> threading.Thread:  # type: ignore[no-untyped-def]
    def operator() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not any(e["event"] == "started" for e in mcp.journal(tool)):
                time.sleep(0.01)
            runtime.request_stop(task_id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    return thread


@pytest.mark.parametrize("framework", sorted(OVER_THE_SDK))
def test_stop_during_a_destructive_mcp_call_cancels_it_at_the_server_and_leaves_it_uncertain(
    framework, model, runtime, mcp_party
):
    party, url = model
    mcp, mcp_url = mcp_party
    name = party.load_script(
        Script.build(
            f"mcp-stop-{framework}",
            [Turn(tool_calls=(ToolCall(SLOW_WRITE, {"key": "acme", "value": "lead", "seconds": 30}),)), Turn(text="x")],
        )
    )
    task = runtime.create_task("Note Acme")
    operator = _stop_when_started(runtime, task.id, mcp, SLOW_WRITE)
    began = time.monotonic()

    journal_while_connected: list[str] = []

    async def before_close() -> None:
        # While the session is still open, so the interruption is the cancel notification's doing,
        # not the session ending.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and "interrupted" not in [e["event"] for e in mcp.journal(SLOW_WRITE)]:
            await asyncio.sleep(0.02)
        journal_while_connected.extend(e["event"] for e in mcp.journal(SLOW_WRITE))

    with pytest.raises(RunStopped):
        asyncio.run(OVER_THE_SDK[framework](runtime, task.id, url, name, mcp_url, before_close=before_close))
    operator.join(5)

    assert time.monotonic() - began < 15
    # The run's cancel reached the server the way the revision means it (a notification with the
    # request id on 2025-11-25, the call's stream closed on 2026-07-28), the tool's task was
    # interrupted there, and nothing was written.
    assert journal_while_connected == ["started", "interrupted"]
    (call,) = mcp.wire("tools/call")
    cancels = [c["request_id"] for c in mcp.wire("notifications/cancelled")]
    if mcp.revisions == "both":
        assert call.get("stream_closed") and cancels == []
    else:
        assert cancels == [call["id"]]
    assert mcp.effects(SLOW_WRITE) == []
    (write,) = WorkItem.objects.filter(task_id=task.id, kind="remote_tool")
    # Not read-only, and a cancelled MCP call gets no answer: uncertain, with a deadline to look.
    assert write.state == S.UNCERTAIN and write.investigate_by is not None
    assert "interrupted by Stop" in write.outcome
