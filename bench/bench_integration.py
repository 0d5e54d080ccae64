"""Framework integrations: what recording every call costs a real agent run.

integration.overhead_ratio.<framework>   wall time of a 20-tool-call run (each tool sleeps 50 ms, one
    call per model turn, against the scripted model on loopback) with the integration, divided by
    the same run without it; both measured in this run, alternating, median of REPEATS each.
    The integration records through the in-process runtime into PostgreSQL; Stop is watched by
    push (the process's LISTEN connection). Results durable: every commit waits for the disk
    flush (the default).
    For the Claude Agent SDK each step is a Bash command the Claude Code CLI runs (about 50 ms), and
    the plain run is the same session without stopdesk's hooks.
integration.overhead_ratio_not_durable.<framework>   the same with the operator's opt-out
    (STOPDESK_DURABLE_RESULTS=0: results and drafts commit without waiting for the flush), measured
    in the same run, alternating with the others, for comparison; no target of its own.
integration.boundary_queries_per_tool_call.<framework>   database statements on a tool call's path
    before its body runs (registration and the boundary), per tool call; goal at most 1. Counted
    in one more run, after the timed ones, so counting costs the timing nothing.
integration.run_queries_per_run.<framework>   the same for the run's own item (registered through
    the boundary when the run begins), once per run, apart from the tool calls'.
integration.queries_per_tool_call.<framework>   every statement the integration sent in that run
    (tool calls, model requests, results, the run's item, the Stop watch), per tool call.
integration.overhead_ratio.crewai   the same 20-tool-call run with a CrewAI crew, which cannot be
    installed beside the server: the crew runs in its own venv (`make crewai-venv`) and process
    (stopdrill/crewai_child.py), recording over HTTP into the deployed shape on loopback (gunicorn
    and the watch server, `bench.deployed`); that process times plain and recorded kickoffs,
    alternating, median of CREWAI_REPEATS each (two runs of 5 each read 1.07 and 1.14 on the same
    code). Results durable (the default).
integration.crew_cpu_s[_plain].crewai   the CPU time the crew's process spent on a recorded (plain)
    kickoff, median: what recording costs the crew's own process in CPU, beside the wall time.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.harness import Figure

TOOL_CALLS = 20
TOOL_S = 0.05
REPEATS = 5
CREWAI_REPEATS = 11  # a kickoff's time varies more than an in-process run's: a steadier median
TARGET = 1.10


async def work(step: int) -> str:
    """Do one step of the job."""
    await asyncio.sleep(TOOL_S)
    return f"step {step} done"


def _script() -> Any:
    from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn

    turns = [Turn(tool_calls=(ToolCall("work", {"step": n}),)) for n in range(TOOL_CALLS)]
    return Script.build("bench-20", [*turns, Turn(text="all steps done")])


async def _openai_agents(base_url: str, model: str, runtime: Any, task_id: int | None) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.openai_agents import guard_tool, run_agent

    set_tracing_disabled(True)
    # Closed on this run's loop: left to the garbage collector, its close would run on a later
    # run's loop and fail there ("Event loop is closed").
    async with AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0) as client:
        tool = function_tool(work)
        if task_id is None:
            agent = Agent(name="bench", tools=[tool], model=OpenAIResponsesModel(model, client))
            await Runner.run(agent, "go", max_turns=TOOL_CALLS + 2)
            return
        agent = Agent(name="bench", tools=[guard_tool(tool)], model=OpenAIResponsesModel(model, client))
        await run_agent(runtime, task_id, agent, "go", max_turns=TOOL_CALLS + 2)


async def _pydantic_ai(base_url: str, model: str, runtime: Any, task_id: int | None) -> None:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from stopdesk.agent.frameworks.pydantic_ai import run_agent

    async with AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0) as client:
        agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), tools=[work])
        if task_id is None:
            await agent.run("go")
            return
        await run_agent(runtime, task_id, agent, "go", tools=[work])


async def _langgraph(base_url: str, model: str, runtime: Any, task_id: int | None) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent

    async with AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0) as client:
        chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
        tools = [StructuredTool.from_function(coroutine=work)]
        state = {"messages": [{"role": "user", "content": "go"}]}
        config = {"recursion_limit": 4 * TOOL_CALLS + 10}
        if task_id is None:
            await create_agent(chat, tools=tools).ainvoke(state, config=config)  # type: ignore[arg-type]
            return
        graph = create_agent(chat, tools=tools, middleware=[StopdeskMiddleware()])
        await run_agent(runtime, task_id, graph, state, config=config)


_CLAUDE_HOME: list[str] = []


async def _claude_agent_sdk(base_url: str, model: str, runtime: Any, task_id: int | None) -> None:
    """A Claude Code session whose each step is a Bash command that takes about TOOL_S (read-only;
    the CLI refuses a bare `sleep`), against the scripted model's Messages endpoint."""
    import tempfile

    import httpx
    from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient

    from reconcile.mechanisms.openai.sandbox_model import claude_cli_env
    from stopdesk.agent.frameworks.claude_agent_sdk import run_agent

    root = base_url.removesuffix("/v1")
    if not _CLAUDE_HOME:
        _CLAUDE_HOME.append(tempfile.mkdtemp(prefix="bench-claude-"))
        turns = [
            {
                "tool_calls": [
                    {"name": "Bash", "arguments": {"command": f"timeout {TOOL_S} tail -f /dev/null; echo step {n}"}}
                ]
            }
            for n in range(TOOL_CALLS)
        ]
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                root + "/_control/scripts", json={"name": "bench-claude", "turns": [*turns, {"text": "all steps done"}]}
            )
            answer.raise_for_status()
    # A HOME of its own per session: the CLI keeps every session's transcript under it, and runs that
    # followed others into a fuller directory would be the slower ones, whichever they are.
    home = tempfile.mkdtemp(dir=_CLAUDE_HOME[0])
    options = ClaudeAgentOptions(
        cwd=home, allowed_tools=["Bash"], setting_sources=[], model="claude-sonnet-4-5", env=claude_cli_env(root, home)
    )
    prompt = "[script:bench-claude] go"
    if task_id is None:
        async with ClaudeSDKClient(options) as client:
            await client.query(prompt)
            async for _ in client.receive_response():
                pass
        return
    await run_agent(runtime, task_id, prompt, options=options)


FRAMEWORKS: dict[str, Callable[[str, str, Any, int | None], Awaitable[None]]] = {
    "openai_agents": _openai_agents,
    "pydantic_ai": _pydantic_ai,
    "langgraph": _langgraph,
    "claude_agent_sdk": _claude_agent_sdk,
}


RUNTIME_CALLS = (
    "register_started",
    "finish",
    "finish_fast",
    "cancel",
    "mark_uncertain",
    "report_stopped",
    "task_settle_check",
    "watch_stop",
    "task_stopped",
    "thread_prepare",
)


class _Counted:
    """The statements a run sends, by runtime method: each call runs on one thread, whose
    connection counts what passes through it while the call lasts."""

    def __init__(self) -> None:
        self.by_method: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def runtime(self, base: type) -> type:
        """A subclass of `base` whose methods a run calls count their statements."""
        methods = {name: self._counted(name, getattr(base, name)) for name in RUNTIME_CALLS if hasattr(base, name)}
        return type(f"Counted{base.__name__}", (base,), methods)

    def _counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(runtime: Any, *args: Any, **kwargs: Any) -> Any:
            label = name
            if name == "register_started":
                # The run's own item is registered through the boundary too, once per run.
                label = f"{name}:run" if kwargs.get("noun") == "agent run" else f"{name}:{kwargs['kind']}"
            with self.counting(label):
                return method(runtime, *args, **kwargs)

        return call

    @contextmanager
    def counting(self, label: str) -> Iterator[None]:
        from django.db import connection

        seen = [0]

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            seen[0] += 1
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(count):
                yield
        finally:
            with self._lock:
                self.by_method[label] += seen[0]
                self.calls[label] += 1


@contextmanager
def _durable(durable: bool) -> Iterator[None]:
    """Results durable or not (the operator's STOPDESK_DURABLE_RESULTS), for this process's
    threads as for the settings they read on every call."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(STOPDESK={**settings.STOPDESK, "DURABLE_RESULTS": durable}):
        yield


def run() -> list[Figure]:
    from reconcile.mechanisms.openai.sandbox import OpenAIStandin
    from stopdesk.agent.runtime import LocalRuntime
    from stopdesk.models import WorkItem
    from stopdrill.sandbox.server import BackgroundServer

    party = OpenAIStandin()
    model = party.load_script(_script())
    options: dict[str, Any] = {"actor": "agent:bench", "dispatch": lambda ids: None}
    runtime = LocalRuntime(**options)
    figures = []
    with BackgroundServer(party.app, name="openai") as server:
        base_url = server.url + "/v1"
        # BENCH_FRAMEWORKS=claude_agent_sdk,crewai,...: only these (default: every one).
        chosen = {n for n in os.environ.get("BENCH_FRAMEWORKS", "").split(",") if n} or set(FRAMEWORKS)
        for name, agent in FRAMEWORKS.items():
            if name not in chosen:
                continue
            asyncio.run(agent(base_url, model, None, None))  # warm-up: imports, connections
            plain: list[float] = []
            recorded: dict[bool, list[float]] = {True: [], False: []}  # by results durable
            for _ in range(REPEATS):
                began = time.perf_counter()
                asyncio.run(agent(base_url, model, None, None))
                plain.append(time.perf_counter() - began)
                for durable in (True, False):
                    with _durable(durable):
                        task = runtime.create_task(f"bench {name}")
                        began = time.perf_counter()
                        asyncio.run(agent(base_url, model, runtime, task.id))
                        recorded[durable].append(time.perf_counter() - began)
                    tools = (
                        WorkItem.objects.filter(task_id=task.id, kind="local_worker", state="completed")
                        .exclude(noun="agent run")
                        .count()
                    )
                    assert tools == TOOL_CALLS, f"{name}: {tools} tool calls recorded, expected {TOOL_CALLS}"
            ratio = statistics.median(recorded[True]) / statistics.median(plain)
            figures.append(Figure(f"integration.overhead_ratio.{name}", ratio, "x", target=TARGET))
            ratio = statistics.median(recorded[False]) / statistics.median(plain)
            figures.append(Figure(f"integration.overhead_ratio_not_durable.{name}", ratio, "x"))
            figures.append(Figure(f"integration.run_s.{name}", statistics.median(recorded[True]), "s"))
            figures.append(Figure(f"integration.run_s_not_durable.{name}", statistics.median(recorded[False]), "s"))
            counted = _Counted()
            task = runtime.create_task(f"bench {name} counted")
            asyncio.run(agent(base_url, model, counted.runtime(LocalRuntime)(**options), task.id))
            assert counted.calls["register_started:local_worker"] == TOOL_CALLS, counted.calls
            path = counted.by_method["register_started:local_worker"] / TOOL_CALLS
            figures.append(Figure(f"integration.boundary_queries_per_tool_call.{name}", path, "queries", target=1))
            run_item = counted.by_method["register_started:run"] / counted.calls["register_started:run"]
            figures.append(Figure(f"integration.run_queries_per_run.{name}", run_item, "queries", target=1))
            every = sum(counted.by_method.values()) / TOOL_CALLS
            figures.append(Figure(f"integration.queries_per_tool_call.{name}", every, "queries"))
        if not os.environ.get("BENCH_FRAMEWORKS") or "crewai" in os.environ["BENCH_FRAMEWORKS"].split(","):
            figures.extend(_crewai(base_url, model))
    return figures


def _crewai(base_url: str, model: str) -> list[Figure]:
    """The CrewAI figure: its crew in its own venv and process, over HTTP (see the module's doc)."""
    import json
    import subprocess
    from pathlib import Path

    from bench.deployed import deployed
    from stopdesk.client import Client
    from stopdesk.models import WorkItem
    from stopdesk.services.runtimes import runtime_create
    from stopdrill.drills.frameworks import CREWAI_CHILD, crewai_python

    python = crewai_python()
    if python is None:
        print("# integration.overhead_ratio.crewai not measured: the CrewAI venv is not built (make crewai-venv)")
        return []
    token = runtime_create(name="bench-crewai", actor="bench")[1]
    with deployed() as server, Client(server.web_url, token) as client:
        task_ids = [client.create_task(f"bench crewai {n}").id for n in range(CREWAI_REPEATS)]
        config = {
            "stopdesk_url": server.web_url,
            "token": token,
            "model_url": base_url,
            "model": model,
            "tools": ["work"],
            "max_iter": TOOL_CALLS + 5,
            "bench": {"task_ids": task_ids, "tool_s": TOOL_S},
        }
        done = subprocess.run(
            [str(python), str(CREWAI_CHILD), json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=Path(__file__).resolve().parents[1],
        )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    timed = next((line for line in lines if line["event"] == "bench"), None)
    if done.returncode != 0 or timed is None:
        raise RuntimeError(f"the CrewAI bench process failed: {done.stderr[-2000:]}")
    for task_id in task_ids:
        tools = (
            WorkItem.objects.filter(task_id=task_id, kind="local_worker", state="completed")
            .exclude(noun="agent run")
            .count()
        )
        assert tools == TOOL_CALLS, f"crewai: {tools} tool calls recorded, expected {TOOL_CALLS}"
    ratio = timed["recorded_s"] / timed["plain_s"]
    return [
        Figure("integration.overhead_ratio.crewai", ratio, "x", target=TARGET),
        Figure("integration.run_s.crewai", timed["recorded_s"], "s"),
        Figure("integration.run_s_plain.crewai", timed["plain_s"], "s"),
        Figure("integration.crew_cpu_s.crewai", timed["cpu_recorded_s"], "s"),
        Figure("integration.crew_cpu_s_plain.crewai", timed["cpu_plain_s"], "s"),
    ]
