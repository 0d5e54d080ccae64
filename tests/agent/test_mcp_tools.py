"""Tools served by an MCP server through the framework: the Agents SDK lists them from the server on
every turn; each call is recorded as a remote tool with the server's annotations."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from reconcile.sandbox.mcp_server import MCP_PATH, SLOW_LOOKUP, SLOW_WRITE, MCPToolServer
from reconcile.sandbox.scripted_model import Script, ToolCall, Turn
from reconcile.sandbox.server import BackgroundServer
from stopdesk.models import WorkItem
from stopdesk.states import ItemState as S

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
