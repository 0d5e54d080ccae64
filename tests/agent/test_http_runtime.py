"""A framework agent that talks to stopdesk over HTTP (the AsyncClient against a live server) gets
the same record as one in-process: hosted calls its model ran after Stop are recorded as they ran,
not cancelled, and a run whose item Stop's job already moved ends cancelled, not uncertain."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from reconcile.services.cancel import item_cancel
from stopdesk.agent.frameworks.core import RunStopped
from stopdesk.client import AsyncClient, Client
from stopdesk.models import Event, Task, WorkItem
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.agent.kit import FRAMEWORKS, Tools
from tests.agent.test_hosted import SCRIPT as HOSTED_SCRIPT
from tests.agent.test_hosted import _run as run_hosted
from tests.agent.test_hosted import assert_recorded_as_they_ran

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


async def never() -> None:
    await asyncio.Event().wait()


def _operator(work: Any) -> threading.Thread:
    def act() -> None:
        from django.db import connections

        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=act)
    thread.start()
    return thread


def _until(condition: Any, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def agent_http(live_server, transactional_db) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The live server's URL and a runtime token for the agent."""
    return live_server.url, runtime_create(name="framework-agent", actor="test")[1]


def _create_task(agent_http: tuple[str, str], title: str) -> int:
    with Client(*agent_http) as sd:
        return sd.create_task(title).id


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
def test_hosted_calls_in_an_answer_after_stop_are_recorded_over_http_as_in_process(
    streamed, model, runtime, agent_http
):
    party, url = model
    slow = [Turn(HOSTED_SCRIPT[0].tool_calls, HOSTED_SCRIPT[0].mcp_calls, delay_s=1.0), HOSTED_SCRIPT[1]]
    name = party.load_script(Script.build("hosted-after-stop-http", slow))
    task_id = _create_task(agent_http, "Add Acme")
    tools = Tools()

    def stop_while_the_request_is_out() -> None:
        drafted = WorkItem.objects.filter(task_id=task_id, kind="model_request", state=S.RUNNING)
        if _until(lambda: party.model_log() and drafted.exists()):
            runtime.request_stop(task_id, reason="operator pressed Stop")

    async def agent() -> Any:
        async with AsyncClient(*agent_http, worker="agent") as sd:
            return await run_hosted(sd, task_id, url, name, tools, watch=never, streamed=streamed)

    operator = _operator(stop_while_the_request_is_out)
    # Stop commits while the request is out; the provider ran the hosted calls, the answer arrives after Stop.
    with pytest.raises(RunStopped):
        asyncio.run(agent())
    operator.join(5)

    assert tools.calls["lookup"] == 0
    # As in-process: recorded as they ran, not cancelled by the boundary.
    assert_recorded_as_they_ran(task_id)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_run_whose_item_stops_job_already_moved_ends_cancelled_over_http(framework, model, runtime, agent_http):
    party, url = model
    name = party.load_script(
        Script.build("slow-http", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), Turn(text="done")])
    )
    task_id = _create_task(agent_http, "Report on Acme")
    tools = Tools(slow_s=30)
    job_done = threading.Event()

    def stop_and_run_its_job() -> None:
        if tools.started.wait(10):
            runtime.request_stop(task_id, reason="operator pressed Stop")
            (the_run,) = WorkItem.objects.filter(task_id=task_id, noun="agent run")
            item_cancel(item_id=the_run.pk)  # the job Stop dispatches for the run's ("manual") item
        job_done.set()

    async def heard_after_the_job() -> None:
        await asyncio.to_thread(job_done.wait, 15)

    async def agent() -> Any:
        async with AsyncClient(*agent_http, worker="agent") as sd:
            return await FRAMEWORKS[framework](sd, task_id, url, name, tools, watch=heard_after_the_job)

    operator = _operator(stop_and_run_its_job)
    with pytest.raises(RunStopped):
        asyncio.run(agent())
    operator.join(5)

    the_run = WorkItem.objects.get(task_id=task_id, noun="agent run")
    moved = Event.objects.filter(item=the_run, to_state=S.AWAITING_RECONCILIATION).exists()
    assert moved, "Stop's job left the run's item awaiting the agent's report"
    # The agent's report settles it as in-process: cancelled, not left to become uncertain at the deadline.
    assert (the_run.state, the_run.outcome, the_run.investigate_by) == (S.CANCELLED, "stopped before it finished", None)
    assert not the_run.needs_review
    assert tools.cleaned_up == ["slow_report"]
    assert task_summary(Task.objects.get(pk=task_id)) == (
        "Stopped new work. One agent run stopped before it finished. One report stopped before it finished. "
        "One draft completed."
    )


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_sync_tool_that_outlives_stop_is_noted_and_settled_over_http(framework, model, runtime, agent_http):
    party, url = model
    name = party.load_script(
        Script.build(
            "blocking-http", [Turn(tool_calls=(ToolCall("blocking_export", {"name": "Acme"}),)), Turn(text="x")]
        )
    )
    task_id = _create_task(agent_http, "Export Acme")
    tools = Tools(block_s=1.5)
    job_done = threading.Event()
    seen: dict[str, Any] = {}

    def stop_run_its_jobs_and_look() -> None:
        if tools.started.wait(10):
            runtime.request_stop(task_id, reason="operator pressed Stop")
            for item in WorkItem.objects.filter(task_id=task_id, state=S.RUNNING, kind="local_worker"):
                item_cancel(item_id=item.pk)  # the jobs Stop dispatches: "manual" items await the agent's report
        job_done.set()
        export = WorkItem.objects.filter(task_id=task_id, label="blocking_export")
        if _until(lambda: "uninterruptible" in export.get().evidence, within_s=5):
            seen.update(state=export.get().state, still=not tools.cleaned_at)

    async def heard_after_the_jobs() -> None:
        await asyncio.to_thread(job_done.wait, 15)

    async def agent() -> Any:
        async with AsyncClient(*agent_http, worker="agent") as sd:
            return await FRAMEWORKS[framework](sd, task_id, url, name, tools, watch=heard_after_the_jobs)

    operator = _operator(stop_run_its_jobs_and_look)
    with pytest.raises(RunStopped):
        asyncio.run(agent())
    operator.join(10)

    # Noted over the API while it ran on (in the state Stop's job left it), then settled by what it did.
    assert seen == {"state": S.AWAITING_RECONCILIATION, "still": True}
    export = WorkItem.objects.get(task_id=task_id, label="blocking_export")
    assert (export.state, export.outcome) == (S.COMPLETED, "exported Acme")
    assert "One export completed." in task_summary(Task.objects.get(pk=task_id))
