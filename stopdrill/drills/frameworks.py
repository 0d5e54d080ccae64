"""Drill drivers for agents built with a framework (OpenAI Agents SDK, pydantic-ai, LangGraph, the
Claude Agent SDK).

The child is a real framework agent run against the sandbox's scripted model: the model asks for
one tool call, `create_lead`, declared as an external action on the CRM (idempotency key, status
lookup), which the framework integration registers, passes through the boundary and records.
The drill's "child" is that tool call's item once the framework has registered it; when Stop came
before the model's answer, no tool call exists and the child is the discarded draft (or, when Stop
reached the run before it asked the model anything, the run itself, recorded never started).

    python manage.py stopdrill --mechanism openai-agents --mechanism pydantic-ai --mechanism langgraph
    python manage.py stopdrill --mechanism claude-agent-sdk

The Claude Code CLI runs its tools itself, so its agent gets `create_lead` as a tool of an SDK MCP
server in the drill's process (`mcp__drill__create_lead`), declared by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import httpx

from reconcile.mechanisms.http import sandbox as crm_faults
from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from stopdesk.agent.frameworks import RunStopped
from stopdesk.agent.frameworks.declare import declaration_of, declare
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.agent import crm_declaration
from stopdrill.drills.core import Child, DrillContext, wait_until
from stopdrill.drills.drivers import AGENT, REVIEW, Driver, _arrived, _sandbox, _task, register_driver, wait_done

# The CrewAI agent side: its own venv (crewai cannot be installed beside the server), started as a
# process that talks to this one over HTTP. STOPDESK_CREWAI_PYTHON names another venv's python.
CREWAI_CHILD = Path(__file__).resolve().parents[1] / "crewai_child.py"
CREWAI_VENV_PYTHON = Path(__file__).resolve().parents[2] / "tests" / "frameworks_venvs" / "crewai" / "bin" / "python"


def crewai_python() -> Path | None:
    """The python of the CrewAI venv (`make crewai-venv`), or None when it is not built."""
    named = os.environ.get("STOPDESK_CREWAI_PYTHON")
    python = Path(named) if named else CREWAI_VENV_PYTHON
    return python if python.exists() else None


SCRIPT = Script.build("drill-lead", [Turn(tool_calls=(ToolCall("create_lead", {"name": "Acme"}),)), Turn(text="done")])


class FrameworkDriver(Driver):
    framework: ClassVar[str]
    script: ClassVar[Script] = SCRIPT  # what the scripted model answers this framework's agent
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"completed"}),
        "after_acceptance": frozenset({"completed"}),
        "slow_child": frozenset({REVIEW, "completed", "uncertain"}),
        "disconnected_client": frozenset({"completed", "uncertain"}),
        "cancel_endpoint_down": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"completed"}),
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:
        sandbox = _sandbox(ctx)
        crm = sandbox.sandbox.crm
        base = sandbox.urls["crm"]
        task = _task(ctx)
        key = f"drill-{task.pk}-lead"
        timeout = 30.0
        if variant == "accept":
            crm.set_fault(crm_faults.HANG_AFTER_COMMIT, target=key)
            ctx.fault("crm: the lead is created but the answer never comes")
        elif variant == "down":
            crm.set_fault(crm_faults.FAIL_500_AFTER_COMMIT, target=key)
            ctx.fault("crm: the create lands, then answers 500")
        elif variant == "slow":
            crm.configure(latency_s=2.0)
            ctx.cleanups.append(lambda: self.await_late_create(ctx, key))
            ctx.cleanups.append(lambda: crm.configure(latency_s=0.0))
            timeout = 1.0
            ctx.fault("crm: answers after 2 s, past the tool's 1 s timeout")
        elif variant == "disconnect":
            crm.configure(latency_s=0.4)
            ctx.cleanups.append(lambda: self.await_late_create(ctx, key))
            ctx.cleanups.append(lambda: crm.configure(latency_s=0.0))
            timeout = 0.1
            ctx.fault("client: the tool hangs up 0.1 s into a create the CRM completes anyway")
        else:
            crm.configure(latency_s=0.5)
            ctx.cleanups.append(lambda: crm.configure(latency_s=0.0))
        model_url = sandbox.urls["openai"]
        model = sandbox.sandbox.openai.load_script(self.script)
        declaration = {
            "system": sandbox.system("crm"),
            "idempotency_key": lambda args: key,
            "reversible": "archive",
            "noun": "lead",
            "http": crm_declaration(base, sandbox.system("crm")),
        }

        async def create_lead(name: str) -> str:
            """Create a lead in the CRM."""
            async with httpx.AsyncClient(timeout=timeout) as http:
                answer = await http.post(base + "/records", json={"name": name}, headers={"Idempotency-Key": key})
            if answer.is_error:
                raise RuntimeError(f"the CRM answered {answer.status_code}")
            return f"created {answer.json()['id']}"

        child = Child(0, lambda: None, key=key)

        lead = {"key": key, "base": base, "timeout": timeout, "system": declaration["system"]}
        lead["http"] = declaration["http"]

        def run() -> Any:

            declare(create_lead, **declaration)
            runtime = LocalRuntime(actor="drill:agent", dispatch=lambda ids: None)
            try:
                if self.out_of_process:
                    return self.run_process(task.pk, model_url, model, lead)
                return asyncio.run(self.run_agent(runtime, task.pk, model_url, model, create_lead))
            except RunStopped:
                return "stopped"
            finally:
                self.resolve(ctx, child, fallback=True)

        child.run = run
        return ctx.add(child)

    # A framework that cannot be installed beside the server runs in a process of its own.
    out_of_process: ClassVar[bool] = False

    async def run_agent(self, runtime: Any, task_id: int, base_url: str, model: str, tool: Any) -> Any:
        raise NotImplementedError

    def run_process(self, task_id: int, base_url: str, model: str, lead: dict[str, Any]) -> Any:
        raise NotImplementedError

    @staticmethod
    def await_late_create(ctx: DrillContext, key: str) -> None:
        """A create the tool gave up on still lands; wait for it, so it counts in this drill's world
        (and the next drill's reset does not catch it in flight)."""
        crm = _sandbox(ctx).sandbox.crm
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: any(r["idempotency_key"] == key for r in crm.records()), timeout=4.0)

    @staticmethod
    def resolve(ctx: DrillContext, child: Child, *, fallback: bool = False) -> None:
        """The child is the tool call's item once it exists (else, at the end, the draft)."""
        if child.item_id:
            return
        item = WorkItem.objects.filter(task=_task(ctx), idempotency_key=child.key).first()
        if item is None and fallback:
            item = WorkItem.objects.filter(task=_task(ctx)).order_by("id").first()
        if item is None and fallback:
            # Stop reached the run before it asked the model anything (the framework's task was
            # cancelled first): nothing was dispatched. The drill records the run itself, which the
            # ledger settles as never started, so there is an item to judge.
            item = item_register(task=_task(ctx), kind=Kind.LOCAL_WORKER, noun="agent run", actor=AGENT)
        if item is not None:
            child.item_id = item.pk

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        arrived = _arrived(ctx, key=child.key)
        if arrived:
            self.resolve(ctx, child)
        return arrived

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        found = any(r["idempotency_key"] == child.key for r in _sandbox(ctx).sandbox.crm.records())
        if found:
            self.resolve(ctx, child)
        return found

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        crm = _sandbox(ctx).sandbox.crm
        wait_done(child)
        crm.set_fault(crm_faults.READ_500)
        ctx.fault("crm: every lookup answers 500 for the whole deadline")
        ctx.cleanups.append(lambda: crm.set_fault(crm_faults.READ_500, enabled=False))


@register_driver
class OpenAIAgentsDriver(FrameworkDriver):
    mechanism = "openai-agents"
    tool = "openai-agents (crm lead)"

    async def run_agent(self, runtime: Any, task_id: int, base_url: str, model: str, tool: Any) -> Any:
        from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled
        from openai import AsyncOpenAI

        # In the body: the framework is an optional extra, needed only when this drill runs.
        from stopdesk.agent.frameworks.openai_agents import guard_tool, run_agent

        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
        agent = Agent(
            name="drill",
            tools=[guard_tool(function_tool(tool), declaration_of(tool))],
            model=OpenAIResponsesModel(model, client),
        )
        return (await run_agent(runtime, task_id, agent, "Add Acme as a lead", poll_s=0.05)).final_output


@register_driver
class PydanticAIDriver(FrameworkDriver):
    mechanism = "pydantic-ai"
    tool = "pydantic-ai (crm lead)"

    async def run_agent(self, runtime: Any, task_id: int, base_url: str, model: str, tool: Any) -> Any:
        from openai import AsyncOpenAI
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        # In the body: the framework is an optional extra, needed only when this drill runs.
        from stopdesk.agent.frameworks.pydantic_ai import run_agent

        client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
        agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), tools=[tool])
        return (await run_agent(runtime, task_id, agent, "Add Acme as a lead", tools=[tool], poll_s=0.05)).output


@register_driver
class LangGraphDriver(FrameworkDriver):
    mechanism = "langgraph"
    tool = "langgraph (crm lead)"

    async def run_agent(self, runtime: Any, task_id: int, base_url: str, model: str, tool: Any) -> Any:
        from langchain.agents import create_agent
        from langchain_core.tools import StructuredTool
        from langchain_openai import ChatOpenAI
        from openai import AsyncOpenAI

        # In the body: the framework is an optional extra, needed only when this drill runs.
        from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware, run_agent

        client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
        chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
        graph = create_agent(
            chat, tools=[StructuredTool.from_function(coroutine=tool)], middleware=[StopdeskMiddleware()]
        )
        messages = {"messages": [{"role": "user", "content": "Add Acme as a lead"}]}
        state = await run_agent(runtime, task_id, graph, messages, poll_s=0.05)
        return state["messages"][-1].content


CLAUDE_TOOL = "mcp__drill__create_lead"


@register_driver
class ClaudeAgentSDKDriver(FrameworkDriver):
    mechanism = "claude-agent-sdk"
    tool = "claude-agent-sdk (crm lead)"
    script = Script.build(
        "drill-lead-claude", [Turn(tool_calls=(ToolCall(CLAUDE_TOOL, {"name": "Acme"}),)), Turn(text="done")]
    )

    async def run_agent(self, runtime: Any, task_id: int, base_url: str, model: str, tool: Any) -> Any:
        import tempfile

        # In the body: the framework is an optional extra, needed only when this drill runs.
        from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server
        from claude_agent_sdk import tool as sdk_tool

        from reconcile.mechanisms.openai.sandbox_model import claude_cli_env
        from stopdesk.agent.frameworks.claude_agent_sdk import run_agent

        @sdk_tool("create_lead", "Create a lead in the CRM.", {"name": str})
        async def create_lead(args: dict[str, Any]) -> dict[str, Any]:
            try:
                text = await tool(str(args["name"]))
            except Exception as exc:
                return {"content": [{"type": "text", "text": f"{type(exc).__name__}: {exc}"}], "is_error": True}
            return {"content": [{"type": "text", "text": text}]}

        home = tempfile.mkdtemp(prefix="stopdrill-claude-")
        options = ClaudeAgentOptions(
            cwd=home,
            mcp_servers={"drill": create_sdk_mcp_server("drill", tools=[create_lead])},
            allowed_tools=[CLAUDE_TOOL],
            setting_sources=[],
            model="claude-sonnet-4-5",
            env=claude_cli_env(base_url.removesuffix("/v1"), home),
        )
        result = await run_agent(
            runtime,
            task_id,
            f"[script:{self.script.name}] Add Acme as a lead",
            options=options,
            declarations={CLAUDE_TOOL: declaration_of(tool)},
            poll_s=0.05,
        )
        return result.result if result is not None else None


@register_driver
class CrewAIDriver(FrameworkDriver):
    """The crew runs in the CrewAI venv, as its own process (stopdrill/crewai_child.py), recording
    over HTTP into this process's stopdesk, served on loopback for the drill. The process is started
    with the drill's child and waits, imported, for its config: CrewAI takes seconds to import."""

    mechanism = "crewai"
    tool = "crewai (crm lead)"
    out_of_process = True

    def child(self, ctx: DrillContext, variant: str) -> Child:
        import subprocess

        python = crewai_python()
        if python is None:
            raise RuntimeError("the CrewAI venv is not built: run `make crewai-venv`")
        command = [str(python), str(CREWAI_CHILD), "--stdin"]
        process = subprocess.Popen(  # noqa: S603 - our own venv and script
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        server = _StopdeskServer()
        self.ready = (process, server)
        ctx.cleanups.append(lambda: _close(process, server))
        assert process.stdout is not None
        if json.loads(process.stdout.readline() or "{}").get("event") != "ready":
            raise RuntimeError(f"the CrewAI process did not start: {process.stderr.read() if process.stderr else ''}")
        return super().child(ctx, variant)

    def run_process(self, task_id: int, base_url: str, model: str, lead: dict[str, Any]) -> Any:
        from stopdesk.services.runtimes import runtime_create

        process, server = self.ready
        # The drill made its task for its in-process runtime; the crew's token is a runtime of its own.
        token = runtime_create(name=f"drill-crewai-{task_id}-{process.pid}", actor=AGENT)[1]
        _adopt(task_id, token)
        config = {
            "stopdesk_url": server.url,
            "token": token,
            "task_id": task_id,
            "model_url": base_url,
            "model": model,
            "tools": ["create_lead"],
            "lead": lead,
        }
        out, err = process.communicate(json.dumps(config) + "\n", timeout=120)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        end = next((e for e in events if e["event"] == "end"), {"outcome": "failed", "error": err[-500:]})
        if end["outcome"] == "stopped":
            raise RunStopped(f"Task {task_id} was stopped.")
        if end["outcome"] != "completed":
            raise RuntimeError(f"the crew failed: {end.get('error')}")
        return end["output"]


def _close(process: Any, server: _StopdeskServer) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)
    server.stop()


class _StopdeskServer:
    """This process's stopdesk API on loopback for the crew's process: Django's threaded server,
    whose request threads close their database connections as they end."""

    def __init__(self) -> None:
        from django.contrib.staticfiles.handlers import StaticFilesHandler
        from django.test.testcases import LiveServerThread

        self.thread = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
        self.thread.daemon = True
        self.thread.start()
        self.thread.is_ready.wait(10)
        if self.thread.error:
            raise self.thread.error

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.thread.port}"

    def stop(self) -> None:
        self.thread.terminate()


def _adopt(task_id: int, token: str) -> None:
    """The crew's runtime takes the drill's task over (a task answers its own runtime's token)."""
    from stopdesk.models import Runtime, Task

    runtime = Runtime.objects.get(token_hash=Runtime.hash_token(token))
    Task.objects.filter(pk=task_id).update(runtime=runtime)
