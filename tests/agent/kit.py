"""The same small agent for each framework: tools that count their calls, and one `run()` per
framework that builds the agent with that framework's own API and runs it under stopdesk."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from stopdesk import stop_requested
from stopdesk.agent.frameworks import ToolStopped
from stopdesk.agent.frameworks.declare import declare


@dataclass
class Tools:
    """Plain async tools; each framework module wraps the same functions."""

    crm_url: str = ""
    slow_s: float = 5.0
    block_s: float = 1.5  # how long the blocking tools block
    calls: Counter[str] = field(default_factory=Counter)
    started: threading.Event = field(default_factory=threading.Event)
    cleaned_up: list[str] = field(default_factory=list)
    cleaned_at: list[float] = field(default_factory=list)  # time.monotonic() of each cleanup

    def functions(self) -> list[Callable[..., Any]]:
        tools = self

        @declare(read_only=True, noun="lookup")
        async def lookup(q: str) -> str:
            """Look a company up in the directory."""
            tools.calls["lookup"] += 1
            return f"{q}: 12 employees"

        @declare(read_only=True, noun="report")
        async def slow_report(name: str) -> str:
            """Build a long report about a company."""
            tools.calls["slow_report"] += 1
            tools.started.set()
            try:
                await asyncio.sleep(tools.slow_s)
                return f"report on {name}"
            finally:
                tools.cleaned_up.append("slow_report")
                tools.cleaned_at.append(time.monotonic())

        @declare(
            system="crm",
            idempotency_key=lambda args: f"lead-{args.get('name', '')}",
            reversible="archive",
            noun="lead",
            http={"effect": "created"},
        )
        async def create_lead(name: str) -> str:
            """Create a lead in the CRM."""
            tools.calls["create_lead"] += 1
            tools.started.set()
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.post(
                    tools.crm_url + "/records", json={"name": name}, headers={"Idempotency-Key": f"lead-{name}"}
                )
            return f"created {answer.json()['id']}"

        async def wait_a_bit(n: int) -> str:
            """Wait a moment (undeclared on purpose)."""
            tools.calls["wait_a_bit"] += 1
            await asyncio.sleep(0.3)
            return f"waited {n}"

        @declare(read_only=True, noun="check")
        async def broken_check(q: str) -> str:
            """A check that always fails."""
            tools.calls["broken_check"] += 1
            raise ValueError(f"no data for {q}")

        @declare(read_only=True, noun="export")
        def blocking_export(name: str) -> str:
            """Export a company's records (a plain def: a blocking call, run in a thread)."""
            tools.calls["blocking_export"] += 1
            tools.started.set()
            time.sleep(tools.block_s)
            tools.cleaned_at.append(time.monotonic())
            if name == "Broken":
                raise ValueError(f"no records for {name}")
            return f"exported {name}"

        @declare(read_only=True, noun="export")
        def careful_export(name: str) -> str:
            """Export a company's records, checking for Stop between pages (a plain def)."""
            tools.calls["careful_export"] += 1
            tools.started.set()
            deadline = time.monotonic() + tools.block_s
            while time.monotonic() < deadline:
                if stop_requested():
                    tools.cleaned_up.append("careful_export")
                    tools.cleaned_at.append(time.monotonic())
                    raise ToolStopped(f"stopped after {tools.calls['pages']} pages")
                tools.calls["pages"] += 1
                time.sleep(0.02)
            return f"exported {name}"

        return [lookup, slow_report, create_lead, wait_a_bit, broken_check, blocking_export, careful_export]


Runner = Callable[..., Awaitable[Any]]


async def run_openai_agents(runtime: Any, task_id: int, base_url: str, model: str, tools: Tools, **kw: Any) -> Any:
    from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.openai_agents import run_agent

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    agent = Agent(
        name="sales",
        instructions="Help with leads.",
        tools=[function_tool(f) for f in tools.functions()],  # run_agent guards them, reading each @declare
        model=OpenAIResponsesModel(model, client),
    )
    result = await run_agent(runtime, task_id, agent, "Add Acme as a lead", **kw)
    return result.final_output


async def run_pydantic_ai(runtime: Any, task_id: int, base_url: str, model: str, tools: Tools, **kw: Any) -> Any:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from stopdesk.agent.frameworks.pydantic_ai import run_agent

    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), tools=tools.functions())
    result = await run_agent(runtime, task_id, agent, "Add Acme as a lead", **kw)
    return result.output


async def run_langgraph(runtime: Any, task_id: int, base_url: str, model: str, tools: Tools, **kw: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent

    # A client of this event loop: langchain-openai's default async HTTP client is cached process-wide,
    # and each test runs its own loop.
    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
    lc_tools = [
        StructuredTool.from_function(coroutine=f) if inspect.iscoroutinefunction(f) else StructuredTool.from_function(f)
        for f in tools.functions()
    ]
    graph = create_agent(chat, tools=lc_tools, middleware=[StopdeskMiddleware()])
    state = await run_agent(
        runtime, task_id, graph, {"messages": [{"role": "user", "content": "Add Acme as a lead"}]}, **kw
    )
    return state["messages"][-1].content


FRAMEWORKS: dict[str, Runner] = {
    "openai-agents": run_openai_agents,
    "pydantic-ai": run_pydantic_ai,
    "langgraph": run_langgraph,
}
