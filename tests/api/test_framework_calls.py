"""The calls a framework run makes most, over real HTTP (the Python client against a live server):
the same record as the in-process LocalRuntime, one request each, and bad input refused with
the field named and nothing written."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from stopdesk.client import Client, InvalidRequest, NotFound, StopRequested, Unauthorized
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.api.conftest import ledger_counts

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TOOL = {"kind": "local_worker", "noun": "lookup", "mechanism": "manual", "label": "lookup"}
MCP_CALL = {"type": "mcp_call", "server_label": "crm", "tool": "create_record", "status": "calling"}


@pytest.fixture
def sd(live_server, transactional_db) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    token = runtime_create(name="framework-agent", actor="test")[1]
    with Client(live_server.url, token, worker="agent-1", timeout=5) as client:
        yield client


@pytest.fixture
def theirs(live_server, transactional_db) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    token = runtime_create(name="another-agent", actor="test")[1]
    with Client(live_server.url, token, timeout=5) as client:
        yield client


def test_register_started_passes_the_boundary_in_one_request(sd):
    task = sd.create_task("Look Acme up")
    started = sd.register_started(task.id, handle="call_1", **TOOL)
    submitted = sd.register_started(
        task.id, submit_key="lead-Acme", **{**TOOL, "kind": "external_operation", "handle": "call_2"}
    )

    one, two = WorkItem.objects.get(pk=started), WorkItem.objects.get(pk=submitted)
    assert (one.state, one.worker, one.handle, one.started_at is not None) == (S.RUNNING, "agent-1", "call_1", True)
    assert (two.state, two.idempotency_key, two.submitted_at is not None) == (S.RUNNING, "lead-Acme", True)


def test_register_started_after_stop_records_the_item_cancelled_and_refuses(sd):
    task = sd.create_task("Look Acme up")
    sd.request_stop(task.id, reason="operator pressed Stop")

    with pytest.raises(StopRequested) as refused:
        sd.register_started(task.id, handle="call_1", **TOOL)

    item = WorkItem.objects.get(pk=refused.value.item_id)
    assert (item.state, item.started_at, item.handle) == (S.CANCELLED, None, "call_1")


def test_register_started_repeated_with_its_key_answers_the_first_item(sd):
    task = sd.create_task("Look Acme up")
    first = sd.register_started(task.id, request_key="turn-1-call-1", **TOOL)
    again = sd.register_started(task.id, request_key="turn-1-call-1", **TOOL)

    assert again == first and WorkItem.objects.filter(task_id=task.id).count() == 1


def test_register_started_refuses_a_parent_of_another_task_and_writes_nothing(sd):
    other = sd.create_task("Other")
    parent = sd.register_started(other.id, **TOOL)
    task = sd.create_task("Look Acme up")
    before = ledger_counts()

    with pytest.raises(InvalidRequest) as refused:
        sd.register_started(task.id, parent=parent, **TOOL)

    assert refused.value.field == "parent" and ledger_counts() == before


def test_register_started_repeated_with_its_key_after_stop_answers_the_first_item_and_writes_nothing(sd):
    task = sd.create_task("Look Acme up")
    first = sd.register_started(task.id, request_key="turn-1-call-1", **TOOL)
    sd.request_stop(task.id, reason="operator pressed Stop")
    before = ledger_counts()

    # The first answer was lost on its way; the repeat comes after Stop and is not a new call.
    again = sd.register_started(task.id, request_key="turn-1-call-1", **TOOL)

    assert again == first and ledger_counts() == before
    with pytest.raises(StopRequested):
        sd.register_started(task.id, request_key="turn-2-call-1", **TOOL)  # a new call is refused


def test_write_results_writes_several_in_one_request_as_finish_fast_writes_each(sd):
    task = sd.create_task("Look Acme up")
    the_run = sd.register_started(task.id, **{**TOOL, "noun": "agent run"})
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    draft = sd.register_started(task.id, **{**TOOL, "kind": "model_request", "noun": "draft"})
    results = [
        {"item": call, "status": "completed", "detail": "12 employees", "open_item": the_run},
        {"item": draft, "status": "failed", "detail": "APIError: overloaded", "open_item": the_run},
    ]

    sd.write_results(results)
    sd.write_results(results)  # a repeat changes nothing

    states = dict(WorkItem.objects.filter(task_id=task.id).values_list("pk", "state"))
    assert states == {the_run: S.RUNNING, call: S.COMPLETED, draft: S.FAILED}
    assert WorkItem.objects.get(pk=call).outcome == "12 employees"
    assert not WorkItem.objects.filter(task_id=task.id, needs_review=True).exists()
    assert Task.objects.get(pk=task.id).settled_at is None  # the run's item is still open


def test_write_results_for_an_item_stop_settled_is_a_late_result(sd):
    task = sd.create_task("Look Acme up")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    sd.cancel(call, detail="stopped between steps")

    sd.write_results([{"item": call, "status": "completed", "detail": "it finished after all"}])

    item = WorkItem.objects.get(pk=call)
    assert (item.state, item.needs_review) == (S.CANCELLED, True)


def test_write_results_stopped_rows_are_written_as_report_stopped_writes_them(sd):
    task = sd.create_task("Look Acme up")
    the_run = sd.register_started(task.id, **{**TOOL, "noun": "agent run"})
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    sd.request_stop(task.id, reason="operator pressed Stop")  # its job may leave them awaiting this report

    sd.write_results(
        [
            {"item": call, "status": "stopped", "detail": "lookup: interrupted by Stop"},
            {"item": the_run, "status": "stopped", "detail": "stopped before it finished"},
        ]
    )

    items = {i.pk: (i.state, i.outcome) for i in WorkItem.objects.filter(task_id=task.id)}
    assert items == {
        call: (S.CANCELLED, "lookup: interrupted by Stop"),
        the_run: (S.CANCELLED, "stopped before it finished"),
    }
    assert Task.objects.get(pk=task.id).settled_at is not None


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"item": 1, "status": "done"}, "results.1.status"),
        ({"status": "completed"}, "results.1.item"),
        ({"item": 1, "status": "completed", "detail": "x" * 201}, "results.1.detail"),
        ({"item": 1, "status": "completed", "evidence": {}}, "results.1.evidence"),
    ],
)
def test_write_results_refuses_a_bad_result_naming_the_field_and_writes_none(sd, bad, field):
    task = sd.create_task("Look Acme up")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    before = ledger_counts()

    with pytest.raises(InvalidRequest) as refused:
        sd.write_results([{"item": call, "status": "completed"}, bad])

    assert refused.value.field == field
    assert ledger_counts() == before and WorkItem.objects.get(pk=call).state == S.RUNNING


def test_write_results_refuses_an_empty_list(sd):
    with pytest.raises(InvalidRequest) as refused:
        sd.write_results([])
    assert refused.value.field == "results"


def test_write_results_with_another_runtimes_item_is_not_found_and_writes_nothing(sd, theirs):
    their_task = theirs.create_task("Theirs")
    their_call = theirs.register_started(their_task.id, **TOOL)
    task = sd.create_task("Look Acme up")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    before = ledger_counts()

    with pytest.raises(NotFound):
        sd.write_results([{"item": call, "status": "completed"}, {"item": their_call, "status": "completed"}])

    assert ledger_counts() == before
    assert WorkItem.objects.get(pk=call).state == WorkItem.objects.get(pk=their_call).state == S.RUNNING


def test_finish_fast_holds_the_task_open_for_the_run_until_the_settle_check(sd):
    task = sd.create_task("Look Acme up")
    the_run = sd.register_started(task.id, **{**TOOL, "noun": "agent run"})
    call = sd.register_started(task.id, handle="call_1", **TOOL)

    sd.finish_fast(call, status="completed", detail="12 employees", open_item=the_run)
    sd.finish_fast(call, status="completed", detail="12 employees", open_item=the_run)  # a repeat changes nothing
    assert WorkItem.objects.get(pk=call).state == S.COMPLETED
    assert Task.objects.get(pk=task.id).settled_at is None  # the run's item is still open

    item_transition(
        item_id=the_run, to_state=S.COMPLETED, actor="test", outcome="", allowed_from=frozenset({S.RUNNING})
    )
    assert sd.task_settle_check(task.id).settled_at is not None
    assert WorkItem.objects.get(pk=call).outcome == "12 employees"


def test_finish_fast_on_an_item_stop_settled_is_a_late_result(sd):
    task = sd.create_task("Look Acme up")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    sd.cancel(call, detail="stopped between steps")

    sd.finish_fast(call, status="completed", detail="it finished after all")

    item = WorkItem.objects.get(pk=call)
    assert (item.state, item.needs_review) == (S.CANCELLED, True)


def test_report_stopped_settles_an_item_awaiting_the_agents_report(sd):
    task = sd.create_task("Look Acme up")
    the_run = sd.register_started(task.id, **{**TOOL, "noun": "agent run"})
    sd.request_stop(task.id)
    # Where Stop's job leaves a "manual" item: waiting for the agent's word. `cancel` cannot settle it.
    item_transition(item_id=the_run, to_state=S.AWAITING_RECONCILIATION, actor="system:canceller", outcome="asked")

    answer = sd.report_stopped(the_run, detail="stopped before it finished")
    again = sd.report_stopped(the_run, detail="stopped before it finished")

    assert (answer.state, answer.outcome) == (S.CANCELLED, "stopped before it finished")
    assert again.state == S.CANCELLED and not again.needs_review
    assert task_summary(Task.objects.get(pk=task.id)) == "Stopped new work. One agent run stopped before it finished."


def test_note_evidence_keeps_a_running_item_running_and_says_what_was_seen(sd):
    task = sd.create_task("Export Acme")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    sd.request_stop(task.id)

    answer = sd.note_evidence(call, message="export: cannot be interrupted", evidence={"uninterruptible": "yes"})

    item = WorkItem.objects.get(pk=call)
    assert (answer.state, item.state, item.evidence) == (S.RUNNING, S.RUNNING, {"uninterruptible": "yes"})
    event = item.events.order_by("-id").first()
    assert (event.kind, event.message, event.from_state, event.to_state) == (
        "evidence",
        "export: cannot be interrupted",
        S.RUNNING,
        S.RUNNING,
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [({"message": "", "evidence": {"a": 1}}, "message"), ({"message": "seen", "evidence": "text"}, "evidence")],
    ids=["empty-message", "evidence-not-an-object"],
)
def test_note_evidence_refuses_bad_input_naming_the_field_and_writes_nothing(sd, body, field):
    task = sd.create_task("Export Acme")
    call = sd.register_started(task.id, handle="call_1", **TOOL)
    before = ledger_counts()

    with pytest.raises(InvalidRequest) as refused:
        sd.note_evidence(call, **body)

    assert refused.value.status == 422 and refused.value.field == field
    assert ledger_counts() == before
    assert WorkItem.objects.get(pk=call).evidence == {}


def test_record_launched_records_each_call_once_as_it_ran(sd):
    task = sd.create_task("Add Acme")
    draft = sd.register_started(task.id, kind="model_request", noun="draft")
    sd.request_stop(task.id)  # the calls were launched before Stop; they are recorded after it
    calls = [
        {**MCP_CALL, "call_id": "mcp_1"},
        {"type": "mcp_call", "server_label": "docs", "tool": "search", "call_id": "mcp_2", "status": "completed"},
        {
            "type": "web_search_call",
            "tool": "web_search_call",
            "call_id": "ws_1",
            "status": "in_progress",
            "read_only": True,
        },
    ]

    created = sd.record_launched(draft, calls)
    assert sd.record_launched(draft, calls) == []  # a repeat (a second read-back) records nothing

    children = {c.handle: c for c in WorkItem.objects.filter(parent_id=draft)}
    assert sorted(created) == sorted(c.pk for c in children.values())
    assert {h: c.state for h, c in children.items()} == {
        "mcp_1": S.UNCERTAIN,
        "mcp_2": S.COMPLETED,
        "ws_1": S.CANCELLED,
    }
    started = WorkItem.objects.get(pk=draft).started_at
    assert all(c.started_at == started for c in children.values())  # running from when the response went out
    assert children["mcp_1"].investigate_by is not None and children["mcp_1"].label == "crm.create_record"


def test_a_launched_call_sent_again_as_it_ended_moves_its_record_to_an_effect(sd):
    """Over HTTP as in-process: a call recorded uncertain, then reported completed with what it was
    asked and the record its output named, settles completed as an effect of the CRM (configured
    with a reversal), its arguments kept; the repeat creates no second item."""
    task = sd.create_task("Add Acme")
    draft = sd.register_started(task.id, kind="model_request", noun="draft")
    sd.request_stop(task.id)
    calling = {**MCP_CALL, "call_id": "mcp_1", "arguments": {"name": "Acme"}}
    [child_id] = sd.record_launched(draft, [calling])
    assert WorkItem.objects.get(pk=child_id).state == S.UNCERTAIN

    done = {**calling, "status": "completed", "record": {"id": "acc-7", "version": "2"}}
    assert sd.record_launched(draft, [done]) == []

    child = WorkItem.objects.get(pk=child_id)
    assert child.state == S.COMPLETED and child.detail["launched"]["arguments"] == {"name": "Acme"}
    record = ExternalRecord.objects.get(item=child)
    assert (record.system, record.record_id, record.version, record.effect) == ("crm", "acc-7", "2", "created")
    assert record.reversible and record.reversal == "archive"
    assert "One record created by a hosted tool; review required." in task_summary(Task.objects.get(pk=task.id))


@pytest.mark.parametrize(
    ("calls", "field"),
    [
        ([{"type": "mcp_call", "status": "calling"}], "calls.0.call_id"),
        ([{**MCP_CALL, "call_id": "mcp_1"}, {**MCP_CALL, "call_id": ""}], "calls.1.call_id"),
        ([{**MCP_CALL, "call_id": "mcp_1", "status": 3}], "calls.0.status"),
        ([{**MCP_CALL, "call_id": "mcp_1", "output": "secret"}], "calls.0.output"),
        ([{**MCP_CALL, "call_id": "mcp_1", "record": {"id": "../admin"}}], "calls.0.record.id"),
        ([{**MCP_CALL, "call_id": "mcp_1", "arguments": 3}], "calls.0.arguments"),
        ([], "calls"),
    ],
    ids=[
        "no-call-id",
        "empty-call-id-after-a-good-one",
        "wrong-type",
        "unknown-field",
        "record-id-not-one-path-segment",
        "arguments-not-an-object",
        "no-calls",
    ],
)
def test_record_launched_refuses_bad_calls_naming_the_field_and_writes_nothing(sd, calls, field):
    task = sd.create_task("Add Acme")
    draft = sd.register_started(task.id, kind="model_request", noun="draft")
    before = ledger_counts()

    with pytest.raises(InvalidRequest) as refused:
        sd.record_launched(draft, calls)

    assert refused.value.status == 422 and refused.value.field == field
    assert ledger_counts() == before


def test_another_runtimes_items_and_tasks_are_unknown_here(sd, theirs):
    task = sd.create_task("Add Acme")
    draft = sd.register_started(task.id, kind="model_request", noun="draft")
    before = ledger_counts()

    for call in (
        lambda: theirs.register_started(task.id, **TOOL),
        lambda: theirs.finish_fast(draft, status="completed"),
        lambda: theirs.report_stopped(draft),
        lambda: theirs.record_launched(draft, [{**MCP_CALL, "call_id": "mcp_1"}]),
        lambda: theirs.task_settle_check(task.id),
        lambda: theirs.task_stopped(task.id),
        lambda: theirs.note_evidence(draft, message="seen", evidence={"seen": True}),
    ):
        with pytest.raises(NotFound):
            call()
    assert ledger_counts() == before


def test_every_framework_call_requires_the_runtimes_token(sd, live_server):
    task = sd.create_task("Add Acme")
    draft = sd.register_started(task.id, kind="model_request", noun="draft")
    before = ledger_counts()
    with Client(live_server.url, "sd_not-a-token", timeout=5) as stranger:
        for call in (
            lambda: stranger.register_started(task.id, **TOOL),
            lambda: stranger.finish_fast(draft, status="completed"),
            lambda: stranger.report_stopped(draft),
            lambda: stranger.record_launched(draft, [{**MCP_CALL, "call_id": "mcp_1"}]),
            lambda: stranger.task_settle_check(task.id),
            lambda: stranger.task_stopped(task.id),
        ):
            with pytest.raises(Unauthorized):
                call()
    assert ledger_counts() == before
    assert httpx.post(f"{live_server.url}/api/v1/items/{draft}/launched", json={"calls": []}).status_code == 401


def test_task_stopped_answers_at_once(sd):
    task = sd.create_task("Add Acme")
    assert sd.task_stopped(task.id) is False
    sd.request_stop(task.id)
    assert sd.task_stopped(task.id) is True


def test_the_openapi_document_describes_the_framework_calls(live_server):
    paths = httpx.get(f"{live_server.url}/api/v1/openapi.json").json()["paths"]
    for path in (
        "/tasks/{task_id}/items/started",
        "/items/{item_id}/result",
        "/items/{item_id}/stopped",
        "/items/{item_id}/launched",
        "/tasks/{task_id}/settle",
        "/results",
    ):
        assert "post" in paths[path], path
    launched = paths["/items/{item_id}/launched"]["post"]
    assert {"200", "401", "404", "422"} <= set(launched["responses"])
