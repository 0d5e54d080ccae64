"""A framework run's records through the in-process runtime, without a framework: the one-statement
registration and result, and a model answer that came back before its record did."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from reconcile.services.cancel import item_cancel
from stopdesk.agent.frameworks.core import RunStopped, StopdeskRun
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import Event, Runtime, Task, WorkItem
from stopdesk.protocol.errors import NotFound, StopRequested
from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.items import item_register
from stopdesk.services.transitions import item_start
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary

pytestmark = pytest.mark.postgres

TOOL = {"kind": "local_worker", "noun": "lookup", "mechanism": "manual", "label": "lookup", "handle": "call_1"}
ITEM_FIELDS = ("kind", "noun", "noun_plural", "mechanism", "handle", "label", "idempotency_key", "detail", "state")


async def never() -> None:
    await asyncio.Event().wait()


def events_of(item_id: int) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    return [
        (e.kind, e.from_state, e.to_state, e.actor, e.data)
        for e in Event.objects.filter(item_id=item_id).order_by("id")
    ]


def test_registering_a_started_call_is_one_statement_and_writes_what_register_then_start_writes(runtime):
    task = runtime.create_task("Look Acme up")
    detail = {"tool": {"name": "lookup", "arguments": {"q": "Acme"}}}
    general = item_register(task=task.id, actor=runtime.actor, detail=detail, **TOOL)
    item_start(item_id=general.pk, actor=runtime.actor, worker="agent-1")

    with CaptureQueriesContext(connection) as queries:
        item_id = runtime.register_started(task.id, worker="agent-1", detail=detail, **TOOL)

    assert len(queries) == 1
    lean, general = WorkItem.objects.get(pk=item_id), WorkItem.objects.get(pk=general.pk)
    assert [getattr(lean, f) for f in ITEM_FIELDS] == [getattr(general, f) for f in ITEM_FIELDS]
    assert lean.state == S.RUNNING and lean.worker == "agent-1"
    assert lean.started_at is not None and lean.lease_until > lean.started_at and lean.submitted_at is None
    assert events_of(item_id) == events_of(general.pk)
    # The audit chain covers the new events like any others, once sealed after commit.
    audit_seal()
    chained = Event.objects.filter(item_id=item_id).values_list("seq", "hash")
    assert all(seq > 0 and len(digest) == 64 for seq, digest in chained)


def test_a_declared_external_call_is_registered_submitted_with_its_key(runtime):
    task = runtime.create_task("Create a lead")

    item_id = runtime.register_started(task.id, submit_key="lead-Acme", **{**TOOL, "kind": "external_operation"})

    item = WorkItem.objects.get(pk=item_id)
    assert (item.state, item.idempotency_key) == (S.RUNNING, "lead-Acme")
    assert item.submitted_at is not None
    kinds = [k for k, *_ in events_of(item_id)]
    assert kinds == ["item_registered", "submitted"]


def test_registering_on_a_settled_task_reopens_it_with_its_event(runtime):
    task = runtime.create_task("Look Acme up")
    first = runtime.register_started(task.id, **TOOL)
    runtime.finish_fast(first, status="completed", detail="12 employees")
    assert Task.objects.get(pk=task.id).settled_at is not None

    runtime.register_started(task.id, **{**TOOL, "handle": "call_2"})

    assert Task.objects.get(pk=task.id).settled_at is None
    kinds = list(Event.objects.filter(task_id=task.id).order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["item_registered", "task_reopened", "transition"]


def test_after_stop_the_call_is_recorded_cancelled_and_refused(runtime):
    task = runtime.create_task("Look Acme up")
    runtime.request_stop(task.id)

    with pytest.raises(StopRequested) as refused:
        runtime.register_started(task.id, **TOOL)

    item = WorkItem.objects.get(pk=refused.value.item_id)
    assert (item.state, item.started_at) == (S.CANCELLED, None)
    assert [k for k, *_ in events_of(item.pk)] == ["item_registered", "boundary_refused"]


def runtime_named(name: str) -> Runtime:
    runtime = Runtime(name=name)
    runtime.issue_token()
    runtime.save()
    return runtime


def test_another_runtimes_task_is_not_found_and_nothing_is_written(runtime):
    theirs = LocalRuntime(runtime=runtime_named("theirs"), dispatch=lambda ids: None)
    task = LocalRuntime(runtime=runtime_named("mine"), dispatch=lambda ids: None).create_task("Mine")

    with pytest.raises(NotFound):
        theirs.register_started(task.id, **TOOL)
    with pytest.raises(NotFound):
        runtime.register_started(task.id + 1000, **TOOL)

    assert not WorkItem.objects.filter(task_id=task.id).exists()


def test_a_result_is_one_statement_and_a_result_for_a_settled_item_stays_a_late_result(runtime):
    task = runtime.create_task("Look Acme up")
    done = runtime.register_started(task.id, **TOOL)
    stopped = runtime.register_started(task.id, **{**TOOL, "handle": "call_2"})
    runtime.cancel(stopped, detail="interrupted by Stop")

    with CaptureQueriesContext(connection) as queries:
        runtime.finish_fast(done, status="completed", detail="12 employees")
    runtime.finish_fast(stopped, status="completed", detail="it finished after all")

    assert len(queries) <= 2  # the move with its event, then whether the task settled
    item = WorkItem.objects.get(pk=done)
    assert (item.state, item.outcome, item.finished_at) == (S.COMPLETED, "12 employees", item.updated_at)
    assert events_of(done)[-1] == ("transition", S.RUNNING, S.COMPLETED, runtime.actor, {})
    late = WorkItem.objects.get(pk=stopped)
    assert late.state == S.CANCELLED and late.needs_review
    assert late.evidence["late_result"]["reported"] == S.COMPLETED


def test_a_result_under_an_open_run_is_one_round_trip_and_the_task_settles_when_the_run_does(runtime):
    task = runtime.create_task("Look Acme up")
    the_run = runtime.register_started(task.id, **{**TOOL, "noun": "agent run", "handle": ""})
    first = runtime.register_started(task.id, **TOOL)
    late = runtime.register_started(task.id, **{**TOOL, "handle": "call_2"})

    with CaptureQueriesContext(connection) as queries:
        runtime.finish_fast(first, status="completed", detail="12 employees", open_item=the_run)

    assert len(queries) == 1  # the run is open: the task cannot settle, so nothing to check
    assert WorkItem.objects.get(pk=first).state == S.COMPLETED
    # The run settles before its last result is written (it ended before its writes did): that
    # result sees the run settled and checks the task itself.
    runtime.finish_fast(the_run, status="completed")
    assert Task.objects.get(pk=task.id).settled_at is None  # `late` still running
    runtime.finish_fast(late, status="completed", detail="done", open_item=the_run)
    assert Task.objects.get(pk=task.id).settled_at is not None
    assert Event.objects.filter(task_id=task.id, kind="task_settled").count() == 1


def test_the_run_item_stop_met_is_settled_by_the_run_even_after_stops_job_left_it_awaiting(runtime):
    task = runtime.create_task("Look Acme up")

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            assert run.item_id is not None
            # Stop, and the job Stop dispatches for the run's item (manual: it waits for a report).
            state = await asyncio.to_thread(_stop_and_job, runtime, task.id, run.item_id)
            assert state == S.AWAITING_RECONCILIATION
            run.stop_seen()
            raise RunStopped("stopped")

    with pytest.raises(RunStopped):
        asyncio.run(agent())

    (the_run,) = WorkItem.objects.filter(task_id=task.id)
    assert (the_run.state, the_run.outcome, the_run.needs_review) == (S.CANCELLED, "stopped before it finished", False)
    assert Event.objects.filter(item_id=the_run.pk, to_state=S.CANCELLED).count() == 1
    assert Task.objects.get(pk=task.id).settled_at is not None
    assert task_summary(Task.objects.get(pk=task.id)) == "Stopped new work. One agent run stopped before it finished."


def _stop_and_job(runtime: Any, task_id: int, item_id: int) -> str:
    try:
        runtime.request_stop(task_id)
        item_cancel(item_id=item_id)
        return str(WorkItem.objects.get(pk=item_id).state)
    finally:
        connections.close_all()


def test_a_framework_run_settles_its_task_once(runtime):
    task = runtime.create_task("Look Acme up")

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            for n in range(3):
                async with run.model_request():
                    pass
                await run.tool_call(call_id=f"call_{n}", name="lookup", arguments={}, body=_answer)

    asyncio.run(agent())

    assert {i.state for i in WorkItem.objects.filter(task_id=task.id)} == {S.COMPLETED}
    kinds = list(
        Event.objects.filter(task_id=task.id, kind__in=["task_settled", "task_reopened"]).values_list("kind", flat=True)
    )
    assert kinds == ["task_settled"]  # not settled and reopened between turns
    assert Task.objects.get(pk=task.id).settled_at is not None


async def _answer() -> str:
    return "12 employees"


def test_an_answer_used_before_its_record_was_refused_is_a_late_result_never_discarded(runtime):
    """Stop commits while the model request's record waits for the task row: the answer is
    already in the agent's hands, so the refused draft carries the completion for review."""
    task = runtime.create_task("Look Acme up")
    locked, answered = threading.Event(), threading.Event()

    def operator() -> None:
        # Stop being written: the task row is held, so the draft's record waits behind it.
        try:
            with transaction.atomic():
                list(Task.objects.select_for_update(no_key=True).filter(pk=task.id).values_list("pk"))
                locked.set()
                assert answered.wait(10)
                runtime.request_stop(task.id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)

    async def agent() -> str:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            thread.start()  # the run's own item is recorded; now Stop takes the task row
            assert await asyncio.to_thread(locked.wait, 10)
            async with run.model_request():
                await asyncio.sleep(0.05)  # the model answers; the record still waits
            answered.set()  # no StopRequested: the answer was handed over
            return "Acme has 12 employees."

    assert asyncio.run(agent()) == "Acme has 12 employees."
    thread.join(10)

    (draft,) = WorkItem.objects.filter(task_id=task.id, kind="model_request")
    assert (draft.kind, draft.state, draft.started_at) == ("model_request", S.CANCELLED, None)
    assert draft.needs_review and draft.evidence["late_result"]["reported"] == S.COMPLETED
    summary = task_summary(Task.objects.get(pk=task.id))
    assert "discarded" not in summary and "review required" in summary


def test_an_answer_whose_record_was_refused_first_is_discarded(runtime):
    task = runtime.create_task("Look Acme up")

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            await asyncio.to_thread(_stop, runtime, task.id)  # the run does not hear it (watch=never)
            async with run.model_request():
                await asyncio.sleep(0.5)  # the model thinks; the record is refused meanwhile

    with pytest.raises(StopRequested):
        asyncio.run(agent())

    (draft,) = WorkItem.objects.filter(task_id=task.id, kind="model_request")
    assert (draft.state, draft.needs_review) == (S.CANCELLED, False)
    assert task_summary(Task.objects.get(pk=task.id)) == (
        "Stopped new work. One draft discarded. One agent run stopped before it finished."
    )


def test_a_run_entered_after_stop_is_refused_and_its_item_says_so(runtime):
    task = runtime.create_task("Look Acme up")
    runtime.request_stop(task.id)
    entered = []

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", agent="helper", watch=never):
            entered.append(True)

    with pytest.raises(RunStopped):
        asyncio.run(agent())

    assert entered == []
    (the_run,) = WorkItem.objects.filter(task_id=task.id)
    assert (the_run.noun, the_run.label, the_run.state, the_run.started_at) == (
        "agent run",
        "plain helper",
        S.CANCELLED,
        None,
    )


def _stop(runtime: Any, task_id: int) -> None:
    try:
        runtime.request_stop(task_id)
    finally:
        connections.close_all()


def _item_for(task_id: int, call_id: str, timeout_s: float = 10.0) -> WorkItem:
    """The item of a call, once it is in the ledger (read on a thread of its own)."""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = WorkItem.objects.filter(task_id=task_id, handle=call_id).first()
            if found is not None:
                return found
            time.sleep(0.01)
        raise AssertionError(f"no item for {call_id} after {timeout_s} s")
    finally:
        connections.close_all()


async def _ask_for_lookup(run: StopdeskRun, task_id: int) -> WorkItem:
    """The model's answer asks for a lookup: recorded ahead, and waited for in the ledger."""
    run.tool_call_ahead(call_id="call_1", name="lookup", arguments={"q": "Acme"})
    return await asyncio.to_thread(_item_for, task_id, "call_1")


def test_a_call_asked_for_is_registered_ahead_and_its_tool_call_takes_the_record_over(runtime):
    """The model's answer asks for a call: its record is written while the framework gets to
    running it, and the tool call finds it there (one item, one registration, one result)."""
    task = runtime.create_task("Look Acme up")
    seen_in_body: list[str] = []

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            ahead = await _ask_for_lookup(run, task.id)
            assert ahead.state == S.RUNNING  # registered and through the boundary, before the call runs

            async def body() -> str:
                seen_in_body.append(str((await asyncio.to_thread(_item_for, task.id, "call_1")).pk))
                return "12 employees"

            await run.tool_call(call_id="call_1", name="lookup", arguments={"q": "Acme"}, body=body)

    asyncio.run(agent())

    (call,) = WorkItem.objects.filter(task_id=task.id, handle="call_1")
    assert seen_in_body == [str(call.pk)]
    assert (call.state, call.outcome, call.detail["tool"]["arguments"]) == (S.COMPLETED, "12 employees", {"q": "Acme"})
    assert [k for k, *_ in events_of(call.pk)].count("item_registered") == 1


def test_a_call_asked_for_that_the_agent_never_runs_is_recorded_never_ran(runtime):
    task = runtime.create_task("Look Acme up")

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            await _ask_for_lookup(run, task.id)
            # The agent ends without running it (a limit, a middleware that ends the graph).

    asyncio.run(agent())

    call = WorkItem.objects.get(task_id=task.id, handle="call_1")
    assert (call.state, call.outcome, call.cancel_requested_at) == (S.CANCELLED, "lookup: asked for, never ran", None)
    assert Task.objects.get(pk=task.id).settled_at is not None
    assert call.evidence == {"never_ran": True}
    # Nothing stopped it, and it never began: never told "stopped".
    assert task_summary(Task.objects.get(pk=task.id)) == (
        "Every item so far has finished; the task is still open. One lookup call never ran. One agent run completed."
    )


def test_a_call_that_acts_outside_is_never_registered_before_it_runs(runtime):
    """An external call's key is submitted when it is about to run, not when the model asks."""
    from stopdesk.agent.frameworks.declare import ToolDeclaration

    task = runtime.create_task("Create a lead")
    lead = ToolDeclaration(system="crm", idempotency_key=lambda args: "lead-Acme", noun="lead")
    assert lead.external

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            run.tool_call_ahead(call_id="call_lead", name="create_lead", arguments={"name": "Acme"}, declaration=lead)
            run.tool_call_ahead(call_id="call_look", name="lookup", arguments={"q": "Acme"})
            # The lookup, asked for after the lead, is in the ledger; the lead is not.
            await asyncio.to_thread(_item_for, task.id, "call_look")
            assert not await asyncio.to_thread(_exists, task.id, "call_lead")
            await run.tool_call(call_id="call_look", name="lookup", arguments={"q": "Acme"}, body=_answer)
            await run.tool_call(
                call_id="call_lead", name="create_lead", arguments={"name": "Acme"}, body=_answer, declaration=lead
            )

    asyncio.run(agent())

    lead_item = WorkItem.objects.get(task_id=task.id, handle="call_lead")
    assert (lead_item.state, lead_item.idempotency_key) == (S.COMPLETED, "lead-Acme")


def _exists(task_id: int, call_id: str) -> bool:
    try:
        return WorkItem.objects.filter(task_id=task_id, handle=call_id).exists()
    finally:
        connections.close_all()


def test_stop_known_between_a_calls_early_record_and_its_body_means_the_body_never_runs(runtime):
    task = runtime.create_task("Look Acme up")
    ran: list[str] = []

    async def body() -> str:
        ran.append("lookup")
        return "12 employees"

    async def agent() -> Any:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            await _ask_for_lookup(run, task.id)
            await asyncio.to_thread(_stop, runtime, task.id)
            run.stop_seen()  # as the push would
            return await run.tool_call(
                call_id="call_1", name="lookup", arguments={"q": "Acme"}, body=body, stopped_result="stopped"
            )

    assert asyncio.run(agent()) == "stopped"

    assert ran == []
    call = WorkItem.objects.get(task_id=task.id, handle="call_1")
    assert call.state == S.CANCELLED and call.cancel_requested_at is not None
    assert call.outcome == "lookup: stopped before its body ran"


def test_results_written_together_in_process_are_all_or_nothing(runtime):
    """`write_results` is one transaction in-process as over HTTP: one refused refuses them all."""
    task = runtime.create_task("Look two companies up")
    first = runtime.register_started(task.id, **TOOL)
    second = runtime.register_started(task.id, **{**TOOL, "handle": "call_2"})

    with pytest.raises(NotFound):
        runtime.write_results(
            [
                {"item": first, "status": "completed", "detail": "Acme: 12 employees"},
                {"item": 987654321, "status": "completed", "detail": "no such item"},
            ]
        )
    assert WorkItem.objects.get(pk=first).state == S.RUNNING  # nothing written

    runtime.write_results(
        [
            {"item": first, "status": "completed", "detail": "Acme: 12 employees"},
            {"item": second, "status": "failed", "detail": "Globex: not found"},
        ]
    )
    states = dict(WorkItem.objects.filter(task_id=task.id).values_list("pk", "state"))
    assert states == {first: S.COMPLETED, second: S.FAILED}


def test_a_call_asked_for_that_stops_job_reached_before_the_run_ended_is_settled_stopped(runtime):
    """The run never ran the call and never heard the Stop (no watch), but Stop's job got to the
    call first and left it awaiting the agent's report: the run's end reports it stopped."""
    task = runtime.create_task("Look Acme up")
    left_in: list[str] = []

    async def agent() -> None:
        async with StopdeskRun(runtime, task.id, framework="plain", watch=never) as run:
            call = await _ask_for_lookup(run, task.id)
            left_in.append(await asyncio.to_thread(_stop_and_job, runtime, task.id, call.pk))

    asyncio.run(agent())

    call = WorkItem.objects.get(task_id=task.id, handle="call_1")
    assert left_in == [S.AWAITING_RECONCILIATION]  # what Stop's job left for the report
    assert call.state == S.CANCELLED and call.cancel_requested_at is not None
    assert call.evidence["never_ran"] is True
    assert task_summary(Task.objects.get(pk=task.id)) == (
        "Stopped new work. One lookup call never ran. One agent run completed."
    )
