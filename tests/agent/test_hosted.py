"""Hosted MCP calls (a `HostedMCPTool`) that the provider ran while a model request was out: the
Agents SDK integration records each one as a child of the request's item, also when the answer
arrives after Stop, and each call once, however often it is seen; and such a request, which can act
on the provider's side, is not sent once Stop has been requested."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from reconcile.mechanisms.openai.adapter import launched_tool_calls
from reconcile.mechanisms.openai.sandbox_model import HostedMcpCall, Script, ToolCall, Turn
from reconcile.services.launched import response_launched_record
from stopdesk.agent.frameworks.core import RunStopped
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.agent.kit import Tools

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])]

SCRIPT = [
    Turn(
        mcp_calls=(
            HostedMcpCall("docs", "search", {"q": "acme"}, status="completed", output="3 pages"),
            HostedMcpCall("crm", "create_record", {"name": "Acme"}, status="calling"),
        ),
        tool_calls=(ToolCall("lookup", {"q": "Acme"}),),
    ),
    Turn(text="done"),
]


async def never() -> None:
    await asyncio.Event().wait()


async def _run(runtime: Any, task_id: int, base_url: str, model: str, tools: Tools, **kw: Any) -> Any:
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from stopdesk.agent.frameworks.declare import declaration_of
    from stopdesk.agent.frameworks.openai_agents import guard_tool, run_agent

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0)
    hosted = [
        HostedMCPTool(tool_config={"type": "mcp", "server_label": label, "server_url": f"https://{label}.invalid/mcp"})
        for label in ("docs", "crm")
    ]
    agent = Agent(
        name="sales",
        tools=[*hosted, *(guard_tool(function_tool(f), declaration_of(f)) for f in tools.functions())],
        model=OpenAIResponsesModel(model, client),
    )
    return await run_agent(runtime, task_id, agent, "Add Acme as a lead", **kw)


def test_hosted_calls_in_an_answer_that_arrives_after_stop_are_recorded_under_their_request(streamed, model, runtime):
    party, url = model
    slow = [Turn(SCRIPT[0].tool_calls, SCRIPT[0].mcp_calls, delay_s=1.0), SCRIPT[1]]
    name = party.load_script(Script.build("hosted-after-stop", slow))
    task = runtime.create_task("Add Acme")
    tools = Tools()

    def operator() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 10
            while not party.model_log() and time.monotonic() < deadline:
                time.sleep(0.01)
            runtime.request_stop(task.id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    # Stop commits while the request is out, and the run has not heard it yet (its watch never
    # fires): the provider ran the hosted calls, and the answer arrives after Stop.
    with pytest.raises(RunStopped):
        asyncio.run(_run(runtime, task.id, url, name, tools, watch=never, streamed=streamed))
    thread.join(5)

    assert tools.calls["lookup"] == 0  # the answer's function call met the boundary, never ran
    first, children = assert_recorded_as_they_ran(task.id)

    # The adapter's read-back of the same response adds nothing: one record per call id.
    output = [{"type": "mcp_call", "id": c.handle, "server_label": "x", "name": "y"} for c in children.values()]
    assert response_launched_record(item_id=first.pk, calls=launched_tool_calls({"output": output}), actor="t") == []
    assert WorkItem.objects.filter(task_id=task.id, kind="remote_tool").count() == 2


def assert_recorded_as_they_ran(task_id: int) -> tuple[WorkItem, dict[str, WorkItem]]:
    """The SCRIPT's two hosted calls, seen after Stop: recorded under the first request as they
    ran, not cancelled by the boundary. Returns that request and the calls by label."""
    stopped_at = Task.objects.get(pk=task_id).stop_requested_at
    first = WorkItem.objects.filter(task_id=task_id, kind="model_request").order_by("id").first()
    assert first is not None and first.started_at is not None and stopped_at is not None
    children = {c.label: c for c in WorkItem.objects.filter(task_id=task_id, kind="remote_tool")}
    assert {label: (c.state, c.handle, c.parent_id) for label, c in children.items()} == {
        "docs.search": (S.COMPLETED, "mcp_0_0", first.pk),
        "crm.create_record": (S.UNCERTAIN, "mcp_0_1", first.pk),
    }
    uncertain = children["crm.create_record"]
    assert uncertain.investigate_by is not None
    # Running from when their request went out, before Stop; recorded after it.
    assert uncertain.started_at == first.started_at < stopped_at < uncertain.created_at
    assert "One hosted tool call with unknown outcome; review required." in task_summary(Task.objects.get(pk=task_id))
    return first, children


def test_a_request_offering_hosted_tools_is_not_sent_after_stop(streamed, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("hosted-refused", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), *SCRIPT])
    )
    task = runtime.create_task("Add Acme")
    tools = Tools(slow_s=0.5)

    def operator() -> None:
        from django.db import connections

        try:
            if tools.started.wait(10):
                runtime.request_stop(task.id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    # Stop commits during the first turn's tool, and the run never hears it (watch=never): a draft
    # would go out and be discarded, but a request that can run tools on the provider's side waits
    # for the boundary, which refuses it.
    thread = threading.Thread(target=operator)
    thread.start()
    with pytest.raises(RunStopped):
        asyncio.run(_run(runtime, task.id, url, name, tools, watch=never, streamed=streamed))
    thread.join(5)

    assert len(party.model_log()) == 1  # the second request was never sent
    first, second = WorkItem.objects.filter(task_id=task.id, kind="model_request").order_by("id")
    assert first.state == S.COMPLETED
    assert (second.state, second.started_at) == (S.CANCELLED, None)


def test_hosted_calls_of_a_full_run_are_children_of_their_request_each_once(streamed, model, runtime):
    party, url = model
    name = party.load_script(Script.build("hosted-full", SCRIPT))
    task = runtime.create_task("Add Acme")
    tools = Tools()

    result = asyncio.run(_run(runtime, task.id, url, name, tools, streamed=streamed))

    assert result.final_output == "done" and tools.calls["lookup"] == 1
    first = WorkItem.objects.filter(task_id=task.id, kind="model_request").order_by("id").first()
    assert first is not None
    hosted = WorkItem.objects.filter(task_id=task.id, kind="remote_tool").order_by("handle")
    # Streamed, each call is seen twice (its item event, then the completed response): one record.
    assert [(c.handle, c.state, c.parent_id) for c in hosted] == [
        ("mcp_0_0", S.COMPLETED, first.pk),
        ("mcp_0_1", S.UNCERTAIN, first.pk),
    ]
    assert all(c.started_at == first.started_at for c in hosted)


def test_a_hosted_call_that_sent_an_email_is_recorded_as_an_email_sent(streamed, model, runtime):
    """A completed hosted call whose tool is not known read-only is an effect: its arguments kept,
    an external record, flagged for review, told by what it did, apart from the search."""
    party, url = model
    sent = HostedMcpCall("crm", "send_email", {"to": "ceo@acme.example"}, status="completed", output="queued")
    name = party.load_script(Script.build("hosted-email", [Turn(mcp_calls=(SCRIPT[0].mcp_calls[0], sent)), SCRIPT[1]]))
    task = runtime.create_task("Mail Acme")

    asyncio.run(_run(runtime, task.id, url, name, Tools(), streamed=streamed))

    email = WorkItem.objects.get(task_id=task.id, label="crm.send_email")
    assert email.state == S.COMPLETED and email.needs_review
    assert email.detail["launched"]["arguments"] == {"to": "ceo@acme.example"}
    assert [(r.system, r.effect, r.reversible) for r in ExternalRecord.objects.filter(item=email)] == [
        ("crm", "sent", False)
    ]
    summary = task_summary(Task.objects.get(pk=task.id))
    assert "One email sent by a hosted tool; it cannot be recalled; review required." in summary
    assert "Two hosted tool calls completed" not in summary
