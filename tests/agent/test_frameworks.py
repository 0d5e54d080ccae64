"""Each framework, for real, against the scripted model: the ledger sees every call and Stop holds."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from reconcile.mechanisms.http.sandbox import HANG_AFTER_COMMIT
from reconcile.mechanisms.openai.sandbox_model import HostedMcpCall, Script, ToolCall, Turn
from reconcile.services.cancel import item_cancel
from stopdesk.agent.frameworks.core import RunStopped
from stopdesk.agent.frameworks.threads import UNINTERRUPTIBLE
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.agent.kit import FRAMEWORKS, Tools

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("framework", sorted(FRAMEWORKS))]


def items(task_id: int) -> list[WorkItem]:
    return list(WorkItem.objects.filter(task_id=task_id).order_by("id"))


def tools_of(task_id: int) -> list[WorkItem]:
    return [i for i in items(task_id) if i.kind != "model_request" and i.noun != "agent run"]


def run_item(task_id: int) -> WorkItem:
    (item,) = [i for i in items(task_id) if i.noun == "agent run"]
    return item


async def never() -> None:
    await asyncio.Event().wait()


def run(framework: str, runtime: Any, task_id: int, url: str, model: str, tools: Tools, **kw: Any) -> Any:
    return asyncio.run(FRAMEWORKS[framework](runtime, task_id, url, model, tools, **kw))


def stop_when(event: threading.Event, runtime: Any, task_id: int) -> threading.Thread:
    def operator() -> None:
        from django.db import connections

        try:
            if event.wait(10):
                runtime.request_stop(task_id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    return thread


def test_a_full_run_records_every_tool_call_and_model_request(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build(
            "lookup",
            [
                Turn(
                    tool_calls=(ToolCall("lookup", {"q": "Acme"}),),
                    mcp_calls=(HostedMcpCall("docs", "search", {"q": "acme"}, output="3 pages"),),
                ),
                Turn(text="Acme has 12 employees."),
            ],
        )
    )
    task = runtime.create_task("Look Acme up")
    tools = Tools()

    answer = run(framework, runtime, task.id, url, name, tools)

    assert answer == "Acme has 12 employees."
    assert tools.calls == {"lookup": 1}
    # The run is an item of its own, first, completed after its calls.
    the_run = run_item(task.id)
    assert (the_run.kind, the_run.state, the_run.label.split()[0]) == ("local_worker", S.COMPLETED, framework)
    assert the_run == items(task.id)[0]
    if framework == "langgraph":  # an unnamed graph: not "langgraph LangGraph"
        assert the_run.label == "langgraph"
    assert the_run.finished_at >= max(i.finished_at for i in items(task.id))
    rows = items(task.id)
    by_kind = {(i.kind, i.label, i.state) for i in rows}
    assert ("local_worker", "lookup", S.COMPLETED) in by_kind
    assert [i.state for i in rows if i.kind == "model_request"] == [S.COMPLETED, S.COMPLETED]
    tool = next(i for i in rows if i.label == "lookup")
    assert tool.handle == "call_0_0"
    assert tool.outcome == "Acme: 12 employees"  # the tool's answer as text, not a message object's repr
    assert tool.detail["tool"]["effect"] == "read_only"
    assert tool.detail["tool"]["arguments"] == {"q": "Acme"}
    hosted = [i for i in rows if i.kind == "remote_tool"]
    if framework == "openai-agents":
        # The Responses answer carried an mcp_call the provider ran: recorded with its status.
        (call,) = hosted
        assert (call.label, call.state, call.handle) == ("docs.search", S.COMPLETED, "mcp_0_0")
    else:
        assert hosted == []  # Chat Completions has no hosted tools


def test_a_tool_that_raises_is_recorded_failed(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("broken", [Turn(tool_calls=(ToolCall("broken_check", {"q": "Acme"}),)), Turn(text="gave up")])
    )
    task = runtime.create_task("Check Acme")
    tools = Tools()

    if framework in ("langgraph", "pydantic-ai"):
        # LangGraph's tool node (handle_tool_errors covers invalid arguments only) and pydantic-ai
        # (only ModelRetry goes back to the model) re-raise a tool's own exception: the run fails,
        # with or without stopdesk. The Agents SDK answers the model with the error instead.
        with pytest.raises(ValueError, match="no data for Acme"):
            run(framework, runtime, task.id, url, name, tools)
    else:
        assert run(framework, runtime, task.id, url, name, tools) == "gave up"
        assert [e["turn"] for e in party.model_log()] == [0, 1]  # the model was asked again, with the error

    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (S.FAILED, "ValueError: no data for Acme")
    the_run = run_item(task.id)
    if framework in ("langgraph", "pydantic-ai"):
        assert (the_run.state, the_run.outcome) == (S.FAILED, "ValueError: no data for Acme")
    else:
        assert the_run.state == S.COMPLETED


def test_stop_before_a_tool_call_means_its_body_never_runs(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build(
            "stop-first",
            [Turn(tool_calls=(ToolCall("lookup", {"q": "Acme"}),), delay_s=0.5), Turn(text="done")],
        )
    )
    task = runtime.create_task("Look Acme up")
    tools = Tools()
    asked = threading.Event()

    def model_is_thinking() -> bool:
        drafts = WorkItem.objects.filter(task_id=task.id, kind="model_request", state=S.RUNNING)
        return bool(party.model_log()) and drafts.exists()

    watcher = threading.Thread(target=lambda: _set_when(asked, model_is_thinking))
    watcher.start()
    operator = stop_when(asked, runtime, task.id)  # Stop while the model is thinking about the tool call

    # The push never arrives here (watch=never): only the boundary stands between Stop and the tool.
    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools, watch=never)
    operator.join(5)
    watcher.join(5)

    assert tools.calls["lookup"] == 0
    (tool,) = tools_of(task.id)
    assert (tool.label, tool.state, tool.handle) == ("lookup", S.CANCELLED, "call_0_0")
    assert len(party.model_log()) == 1  # the model never got a second turn


def test_a_run_entered_after_stop_is_refused_and_recorded(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("stopped-before", [Turn(tool_calls=(ToolCall("lookup", {"q": "Acme"}),)), Turn(text="done")])
    )
    task = runtime.create_task("Look Acme up")
    runtime.request_stop(task.id, reason="changed my mind")
    tools = Tools()

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools, watch=never)

    # The boundary refused the run itself: the model was never asked, no tool was called.
    assert party.model_log() == [] and tools.calls["lookup"] == 0
    (the_run,) = items(task.id)
    assert (the_run.noun, the_run.state, the_run.started_at) == ("agent run", S.CANCELLED, None)
    assert task_summary(Task.objects.get(pk=task.id)) == "Stopped new work. One agent run cancelled before it started."


def _set_when(event: threading.Event, condition: Any, within_s: float = 10.0) -> None:
    from django.db import connections

    try:
        deadline = time.monotonic() + within_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        event.set()
    finally:
        connections.close_all()


def test_stop_during_a_slow_tool_cancels_it_and_its_cleanup_runs(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("slow", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), Turn(text="done")])
    )
    task = runtime.create_task("Report on Acme")
    tools = Tools(slow_s=30)
    operator = stop_when(tools.started, runtime, task.id)
    began = time.monotonic()

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools)
    operator.join(5)

    assert time.monotonic() - began < 10
    assert tools.cleaned_up == ["slow_report"]
    (tool,) = tools_of(task.id)
    assert tool.state == S.CANCELLED
    assert "interrupted by Stop" in tool.outcome
    # The run's own item: in flight when Stop came, settled by the integration, not left to reconcile.
    the_run = run_item(task.id)
    assert (the_run.state, the_run.outcome) == (S.CANCELLED, "stopped before it finished")
    assert the_run.cancel_requested_at is not None and not the_run.needs_review


class SlowNetwork(LocalRuntime):
    """The runtime a slow network gives: what a subclass delays waits for `arrive` (bounded)."""

    def __init__(self, arrive: threading.Event) -> None:
        super().__init__(actor="agent:test", dispatch=lambda ids: None)
        self.arrive = arrive


class LateReports(SlowNetwork):
    """The integration's report of a stopped call reaches the ledger only once `arrive` is set,
    after whatever the server did meanwhile."""

    def report_stopped(self, item_id: int, *, detail: str = "") -> None:
        self.arrive.wait(10)
        super().report_stopped(item_id, detail=detail)

    def cancel(self, item_id: int, *, detail: str = "", request_key: str | None = None) -> Any:
        self.arrive.wait(10)
        return super().cancel(item_id, detail=detail, request_key=request_key)


def test_a_tool_interrupted_by_stop_settles_cancelled_when_stops_job_reached_it_first(framework, model, runtime):
    # A framework tool call has no cancel route of its own ("manual"): Stop's job for it leaves it
    # awaiting the agent's report. Here that job runs before the integration's report arrives, the
    # order a busy network gives; the record still says the call stopped, not "still being checked".
    party, url = model
    name = party.load_script(
        Script.build("first", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), Turn(text="done")])
    )
    late = LateReports(threading.Event())
    task = late.create_task("Report on Acme")
    tools = Tools(slow_s=30)
    seen: dict[str, Any] = {}

    def operator() -> None:
        from django.db import connections

        try:
            if not tools.started.wait(10):
                return
            late.request_stop(task.id, reason="operator pressed Stop")
            deadline = time.monotonic() + 10
            while not tools.cleaned_up and time.monotonic() < deadline:
                time.sleep(0.01)
            (tool,) = tools_of(task.id)
            item_cancel(item_id=tool.pk)  # the job Stop dispatches for it
            tool.refresh_from_db()
            seen["after_job"] = tool.state
        finally:
            late.arrive.set()
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    with pytest.raises(RunStopped):
        run(framework, late, task.id, url, name, tools)
    thread.join(5)

    assert seen["after_job"] == S.AWAITING_RECONCILIATION
    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (S.CANCELLED, "slow_report: interrupted by Stop")
    assert tool.cancel_requested_at is not None and not tool.needs_review
    assert "One report stopped before it finished." in task_summary(Task.objects.get(pk=task.id))


class LateStarts(SlowNetwork):
    """A call's registration commits at once, but its answer reaches the integration only once
    `arrive` is set."""

    def register_started(self, task_id: int, **kwargs: Any) -> Any:
        item_id = super().register_started(task_id, **kwargs)
        if kwargs.get("noun") == "report":
            self.arrive.wait(10)
        return item_id


def test_a_tool_call_stopped_while_its_registration_answer_is_on_its_way_is_recorded_stopped(framework, model, runtime):
    # The call is in the ledger, started, when Stop comes; the agent has not heard so yet, and
    # Stop's cancel reaches the call while it waits for that answer. Its body never runs, and the
    # record says it stopped: it was left "running", with nobody to report it (a full run's
    # example saw "One report still being checked" under load).
    party, url = model
    name = party.load_script(
        Script.build("first", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), Turn(text="done")])
    )
    late = LateStarts(threading.Event())
    task = late.create_task("Report on Acme")
    tools = Tools(slow_s=30)

    def operator() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 10
            reports = WorkItem.objects.filter(task_id=task.id, noun="report", state=S.RUNNING)
            while not reports.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            late.request_stop(task.id, reason="operator pressed Stop")
            time.sleep(0.5)  # the run hears Stop and cancels the call, still waiting for its answer
        finally:
            late.arrive.set()
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    with pytest.raises(RunStopped):
        run(framework, late, task.id, url, name, tools)
    thread.join(5)

    assert not tools.started.is_set()  # the body never ran
    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (S.CANCELLED, "slow_report: stopped before its body ran")
    assert tool.cancel_requested_at is not None
    assert "still being checked" not in task_summary(Task.objects.get(pk=task.id))


def test_a_draft_stopped_mid_request_is_discarded_when_stops_job_reached_it_first(framework, model, runtime):
    party, url = model
    name = party.load_script(Script.build("thinking", [Turn(text="done", delay_s=30)]))
    late = LateReports(threading.Event())
    task = late.create_task("Think about Acme")
    seen: dict[str, Any] = {}

    def operator() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 10
            drafts = WorkItem.objects.filter(task_id=task.id, kind="model_request", state=S.RUNNING)
            while not (party.model_log() and drafts.exists()) and time.monotonic() < deadline:
                time.sleep(0.01)
            late.request_stop(task.id, reason="operator pressed Stop")
            (draft,) = drafts
            item_cancel(item_id=draft.pk)  # the job Stop dispatches for it
            draft.refresh_from_db()
            seen["after_job"] = draft.state
        finally:
            late.arrive.set()
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    with pytest.raises(RunStopped):
        run(framework, late, task.id, url, name, Tools())
    thread.join(5)

    assert seen["after_job"] == S.AWAITING_RECONCILIATION
    (draft,) = WorkItem.objects.filter(task_id=task.id, kind="model_request")
    assert (draft.state, draft.outcome) == (S.CANCELLED, "discarded by Stop")
    assert "One draft discarded." in task_summary(Task.objects.get(pk=task.id))


def test_the_run_hears_stop_by_push_not_by_the_fallback_poll(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("push", [Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)), Turn(text="done")])
    )
    task = runtime.create_task("Report on Acme")
    tools = Tools(slow_s=30)
    stop_committed: list[float] = []

    def operator() -> None:
        from django.db import connections

        try:
            if tools.started.wait(10):
                runtime.request_stop(task.id, reason="operator pressed Stop")
                stop_committed.append(time.monotonic())
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()

    # The fallback poll asks once at the start and then not for an hour: only the push (pg_notify,
    # heard by the process's StopHub) can end this run before the 30 s tool would have.
    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools, poll_s=3600)
    thread.join(5)

    assert stop_committed and tools.cleaned_at
    assert tools.cleaned_at[0] - stop_committed[0] < 2.0
    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (S.CANCELLED, "slow_report: interrupted by Stop")


def test_stop_after_the_external_action_was_submitted_reconciles_the_record(framework, model, runtime, crm):
    party, url = model
    crm_party, crm_url = crm
    crm_party.set_fault(HANG_AFTER_COMMIT)  # the CRM creates the lead and never answers
    name = party.load_script(
        Script.build("lead", [Turn(tool_calls=(ToolCall("create_lead", {"name": "Acme"}),)), Turn(text="done")])
    )
    task = runtime.create_task("Add Acme as a lead")
    tools = Tools(crm_url=crm_url)

    def stop_once_created() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + 10
            while not crm_party.records() and time.monotonic() < deadline:
                time.sleep(0.02)
            runtime.request_stop(task.id)
        finally:
            connections.close_all()

    operator = threading.Thread(target=stop_once_created)
    operator.start()
    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools)
    operator.join(10)
    (lead,) = tools_of(task.id)
    assert (lead.kind, lead.mechanism, lead.idempotency_key) == ("external_operation", "http", "lead-Acme")
    assert lead.state == S.RUNNING and lead.cancel_requested_at is not None  # left to reconciliation

    item_cancel(item_id=lead.pk)  # the job Stop dispatches for it

    lead.refresh_from_db()
    record = ExternalRecord.objects.get(item=lead)
    assert lead.state == S.COMPLETED
    assert (record.system, record.record_id) == ("crm", crm_party.records()[0]["id"])
    # The lead landed and reconciliation found it: the summary says so rather than "cancelled".
    assert task_summary(lead.task) == (
        "Stopped new work. One lead created; review required. One agent run stopped before it finished. "
        "One draft completed."
    )


def test_concurrent_tool_calls_in_one_turn_are_each_recorded_and_run_in_parallel(framework, model, runtime):
    party, url = model
    calls = tuple(ToolCall("wait_a_bit", {"n": n}) for n in range(3))
    name = party.load_script(Script.build("parallel", [Turn(tool_calls=calls), Turn(text="all done")]))
    task = runtime.create_task("Wait three times")
    tools = Tools()

    answer = run(framework, runtime, task.id, url, name, tools)

    assert answer == "all done"
    rows = tools_of(task.id)
    # They ran at once: each one started before any of them finished.
    assert max(i.started_at for i in rows) < min(i.finished_at for i in rows)
    assert sorted(i.handle for i in rows) == ["call_0_0", "call_0_1", "call_0_2"]
    assert {i.state for i in rows} == {S.COMPLETED}
    assert {i.detail["tool"]["effect"] for i in rows} == {"unknown"}  # undeclared


def test_the_stop_summary_of_a_framework_run(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build(
            "summary",
            [
                Turn(tool_calls=(ToolCall("lookup", {"q": "Acme"}),)),
                Turn(tool_calls=(ToolCall("slow_report", {"name": "Acme"}),)),
                Turn(text="done"),
            ],
        )
    )
    task = runtime.create_task("Research Acme")
    tools = Tools(slow_s=30)
    operator = stop_when(tools.started, runtime, task.id)

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools)
    operator.join(5)

    summary = task_summary(Task.objects.get(pk=task.id))
    assert summary == (
        "Stopped new work. One agent run stopped before it finished. One report stopped before it finished. "
        "Two drafts completed. One lookup completed."
    )


def _stop_and_look(tools: Tools, runtime: Any, task_id: int, seen: dict[str, Any]) -> threading.Thread:
    """The operator presses Stop once the tool runs, then reads the ledger while the tool runs on."""

    def operator() -> None:
        from django.db import connections

        try:
            if not tools.started.wait(10):
                return
            runtime.request_stop(task_id, reason="operator pressed Stop")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                (tool,) = tools_of(task_id)
                if "uninterruptible" in tool.evidence or tool.state != S.RUNNING:
                    break
                time.sleep(0.02)
            seen.update(state=tool.state, evidence=tool.evidence, outcome=tool.outcome, still=not tools.cleaned_at)
            seen["summary"] = task_summary(Task.objects.get(pk=task_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("company", "state", "outcome"),
    [("Acme", S.COMPLETED, "exported Acme"), ("Broken", S.FAILED, "ValueError: no records for Broken")],
)
def test_a_sync_tool_that_outlives_stop_is_recorded_running_then_as_it_ended(
    framework, model, runtime, company, state, outcome
):
    party, url = model
    name = party.load_script(
        Script.build("blocking", [Turn(tool_calls=(ToolCall("blocking_export", {"name": company}),)), Turn(text="x")])
    )
    task = runtime.create_task("Export Acme")
    tools = Tools(block_s=1.5)
    seen: dict[str, Any] = {}
    operator = _stop_and_look(tools, runtime, task.id, seen)

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools)
    operator.join(10)

    # While the thread ran on after Stop: still running, and said so; never "stopped".
    assert seen["still"], "the blocking call had already returned when the ledger was read"
    assert (seen["state"], seen["evidence"]) == (S.RUNNING, {"uninterruptible": UNINTERRUPTIBLE})
    assert seen["summary"] == (
        "Stopped new work. One draft completed. "
        "One export still running: it cannot be interrupted; waiting for it to finish. One agent run still being checked."
    )
    # Then what it really did, once it did it; the run's own item after it.
    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (state, outcome)
    assert tool.finished_at >= tool.cancel_requested_at
    assert run_item(task.id).finished_at >= tool.finished_at
    summary = task_summary(Task.objects.get(pk=task.id))
    told = "One export completed." if state == S.COMPLETED else "One export failed."
    assert told in summary and "export stopped" not in summary and "exports stopped" not in summary


def test_a_sync_tool_still_running_at_its_deadline_is_uncertain(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("deadline", [Turn(tool_calls=(ToolCall("blocking_export", {"name": "Acme"}),)), Turn(text="x")])
    )
    task = runtime.create_task("Export Acme")
    tools = Tools(block_s=1.5)
    operator = stop_when(tools.started, runtime, task.id)

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools, uninterruptible_s=0.3)
    operator.join(5)

    (tool,) = tools_of(task.id)
    assert (tool.state, tool.outcome) == (
        S.UNCERTAIN,
        "blocking_export: could not be interrupted; still running 0.3 s after Stop",
    )
    assert "One export with unknown outcome; review required." in task_summary(Task.objects.get(pk=task.id))


def test_a_sync_tool_that_checks_stop_requested_ends_stopped(framework, model, runtime):
    party, url = model
    name = party.load_script(
        Script.build("careful", [Turn(tool_calls=(ToolCall("careful_export", {"name": "Acme"}),)), Turn(text="x")])
    )
    task = runtime.create_task("Export Acme")
    tools = Tools(block_s=10)
    operator = stop_when(tools.started, runtime, task.id)
    began = time.monotonic()

    with pytest.raises(RunStopped):
        run(framework, runtime, task.id, url, name, tools)
    operator.join(5)

    # It heard Stop inside its thread and stopped there, long before its 10 s of pages.
    assert tools.cleaned_up == ["careful_export"]
    assert time.monotonic() - began < 5
    (tool,) = tools_of(task.id)
    assert tool.state == S.CANCELLED
    assert tool.outcome.startswith("careful_export: stopped after ") and tool.outcome.endswith(" pages")
    assert "One export stopped before it finished." in task_summary(Task.objects.get(pk=task.id))
