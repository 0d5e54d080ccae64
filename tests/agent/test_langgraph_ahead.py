"""LangGraph: a tool call is recorded as the model's answer asks for it, while the graph moves on
to its tool node (`StopdeskMiddleware.awrap_model_call`), and recorded as it really went when the
graph never runs it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from stopdesk.models import Task, WorkItem
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.agent.kit import Tools

pytestmark = pytest.mark.postgres


def _graph(url: str, model: str, tools: Tools, *more_middleware: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.langgraph import StopdeskMiddleware

    client = AsyncOpenAI(base_url=url, api_key="no-key-needed", max_retries=0)
    chat = ChatOpenAI(model=model, root_async_client=client, async_client=client.chat.completions, api_key="unused")
    lc_tools = [StructuredTool.from_function(coroutine=f) for f in tools.functions()[:1]]  # lookup
    return create_agent(chat, tools=lc_tools, middleware=[StopdeskMiddleware(), *more_middleware])


def _run(runtime: Any, task_id: int, graph: Any) -> Any:
    from stopdesk.agent.frameworks.langgraph import run_agent

    return asyncio.run(run_agent(runtime, task_id, graph, {"messages": [{"role": "user", "content": "Look Acme up"}]}))


def _calls_in_ledger(task_id: int, want: int) -> int:
    """How many lookup calls are in the ledger, waiting (bounded) until there are `want`."""
    from django.db import connections

    try:
        deadline = time.monotonic() + 5
        while True:
            found = WorkItem.objects.filter(task_id=task_id, label="lookup", state=S.RUNNING).count()
            if found >= want or time.monotonic() > deadline:
                return found
            time.sleep(0.01)
    finally:
        connections.close_all()


def test_each_call_is_registered_once_before_the_tool_node_runs_it(model, runtime):
    from langchain.agents.middleware import AgentMiddleware

    party, url = model
    name = party.load_script(
        Script.build(
            "lookups",
            [
                Turn(tool_calls=(ToolCall("lookup", {"q": "Acme"}), ToolCall("lookup", {"q": "Globex"}))),
                Turn(text="Both found."),
            ],
        )
    )
    task = runtime.create_task("Look two companies up")
    seen_after_model: list[int] = []

    class LookAtTheLedger(AgentMiddleware):  # type: ignore[type-arg]
        """Between the model's answer and the tool node: what the ledger holds of the calls."""

        async def aafter_model(self, state: Any, runtime: Any) -> None:
            if not seen_after_model:
                seen_after_model.append(await asyncio.to_thread(_calls_in_ledger, task.id, 2))

    tools = Tools()
    _run(runtime, task.id, _graph(url, name, tools, LookAtTheLedger()))

    # Both calls were in the ledger, running, before the tool node began either.
    assert seen_after_model == [2]
    assert tools.calls == {"lookup": 2}
    calls = WorkItem.objects.filter(task_id=task.id, label="lookup").order_by("handle")
    assert [(c.handle, c.state, c.outcome) for c in calls] == [
        ("call_0_0", S.COMPLETED, "Acme: 12 employees"),
        ("call_0_1", S.COMPLETED, "Globex: 12 employees"),
    ]


def test_a_call_the_graph_never_runs_is_recorded_never_ran_not_stopped(model, runtime):
    from langchain.agents.middleware import AgentMiddleware, hook_config

    class EndAfterTheModel(AgentMiddleware):  # type: ignore[type-arg]
        """Ends the graph after the model's answer, whatever it asked for (a limit, a guard)."""

        @hook_config(can_jump_to=["end"])
        def after_model(self, state: Any, runtime: Any) -> dict[str, Any]:
            return {"jump_to": "end"}

    party, url = model
    name = party.load_script(Script.build("one lookup", [Turn(tool_calls=(ToolCall("lookup", {"q": "Acme"}),))]))
    task = runtime.create_task("Look Acme up")
    tools = Tools()

    _run(runtime, task.id, _graph(url, name, tools, EndAfterTheModel()))

    assert tools.calls == {}
    call = WorkItem.objects.get(task_id=task.id, label="lookup")
    assert (call.state, call.outcome, call.evidence) == (
        S.CANCELLED,
        "lookup: asked for, never ran",
        {"never_ran": True},
    )
    assert call.cancel_requested_at is None
    summary = task_summary(Task.objects.get(pk=task.id))
    assert "One lookup never ran." in summary and "stopped" not in summary
