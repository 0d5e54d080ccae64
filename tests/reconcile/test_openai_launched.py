"""What a cancelled response launched itself: each tool call in its output becomes a child item."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections

from reconcile.mechanisms.openai.adapter import launched_tool_calls
from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox_model import HostedMcpCall, Script, ToolCall, Turn
from reconcile.services.cancel import item_cancel, items_cancel
from reconcile.services.launched import response_launched_record, responses_launched_record
from reconcile.services.reconcile import sweep_once
from reconcile.tasks import BATCH_ABOVE
from stopdesk.models import CancellationAttempt, Event, Task, WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import ItemState, Kind
from stopdesk.summary import task_summary
from tests.factories import make_task
from tests.reconcile.helpers import stop

S = ItemState
pytestmark = pytest.mark.django_db

LAUNCHED = Script.build(
    "launched",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall("docs", "search", {"q": "acme"}, status="completed", output="3 pages"),
                HostedMcpCall("crm", "create_record", {"name": "Acme"}, status="calling"),
                HostedMcpCall("crm", "delete_record", {"id": "9"}, status="failed", error="forbidden"),
            ),
            tool_calls=(ToolCall("send_invoice", {"to": "acme"}),),
            text="working on it",
        )
    ],
)


def test_after_cancel_and_read_back_each_launched_call_is_a_child_of_the_response(
    openai_party, django_capture_on_commit_callbacks
):
    party, url = openai_party
    model = party.load_script(LAUNCHED)
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response = response_create(item_id=item.pk, actor="test", base_url=url, model=model, input="Go", timeout_s=10.0)
    time.sleep(0.05)  # past `queued`: the hosted calls are under way

    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)

    item.refresh_from_db()
    assert item.state == S.CANCELLED
    children = {c.label: c for c in WorkItem.objects.filter(parent=item)}
    assert {label: c.state for label, c in children.items()} == {
        "docs.search": S.COMPLETED,
        "crm.create_record": S.UNCERTAIN,
        "crm.delete_record": S.FAILED,
        "send_invoice": S.CANCELLED,
    }
    uncertain = children["crm.create_record"]
    assert uncertain.investigate_by is not None and uncertain.kind == Kind.REMOTE_TOOL
    assert uncertain.handle == "mcp_0_1" and uncertain.detail["launched"]["server_label"] == "crm"
    assert uncertain.evidence["launched_by"] == response.id
    assert "Two drafts" not in task_summary(task)
    assert "One hosted tool call with unknown outcome; review required." in task_summary(task)

    # A second read-back (a sweep, a flip check) records nothing twice.
    assert response_launched_record(item_id=item.pk, calls=launched_tool_calls(party.get(response.id)), actor="t") == []
    assert WorkItem.objects.filter(parent=item).count() == 4


def test_a_read_only_call_still_running_is_settled_without_review():
    calls = launched_tool_calls(
        {
            "output": [
                {
                    "type": "mcp_list_tools",
                    "server_label": "docs",
                    "tools": [{"name": "search", "annotations": {"readOnlyHint": True}}],
                },
                {"type": "mcp_call", "id": "mcp_1", "server_label": "docs", "name": "search", "status": "calling"},
                {"type": "web_search_call", "id": "ws_1", "status": "searching"},
                {"type": "message", "id": "msg_1"},
            ]
        }
    )
    from reconcile.services.launched import launched_outcome

    assert [(c["call_id"], c["read_only"]) for c in calls] == [("mcp_1", True), ("ws_1", True)]
    assert [launched_outcome(c)[0] for c in calls] == [S.CANCELLED, S.CANCELLED]


LAUNCHED_STATES = {
    "docs.search": S.COMPLETED,
    "crm.create_record": S.UNCERTAIN,
    "crm.delete_record": S.FAILED,
    "send_invoice": S.CANCELLED,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_the_batched_canceller_records_what_each_response_launched(openai_party, django_capture_on_commit_callbacks):
    """More responses than Stop cancels one job each: the batched canceller (one claim, one pass)
    records each response's hosted calls as its children, with the one-item path's states, and a
    later read-back of the same responses (the flip watch, in a batch and in a sweep) adds none."""
    party, url = openai_party
    model = party.load_script(LAUNCHED)
    task = make_task()
    count = BATCH_ABOVE + 5
    items = [
        item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
        for _ in range(count)
    ]
    for item in items:
        response_create(item_id=item.pk, actor="test", base_url=url, model=model, input="Go", timeout_s=10.0)
    time.sleep(0.05)  # past `queued`: the hosted calls are under way

    dispatched = stop(task, django_capture_on_commit_callbacks)
    assert len(dispatched) == count > BATCH_ABOVE
    results = items_cancel(item_ids=dispatched, mechanism="openai")
    assert Counter(r.state for r in results) == {S.CANCELLED: count}
    assert CancellationAttempt.objects.filter(item__in=items).count() == count  # one pass, batched

    def children() -> dict[int, dict[str, tuple[str, bool]]]:
        found: dict[int, dict[str, tuple[str, bool]]] = {item.pk: {} for item in items}
        for child in WorkItem.objects.filter(parent__in=items):
            assert child.parent_id is not None
            found[child.parent_id][child.label] = (child.state, child.investigate_by is not None)
        return found

    expected = {label: (state, state == S.UNCERTAIN) for label, state in LAUNCHED_STATES.items()}
    assert children() == {item.pk: expected for item in items}
    child = WorkItem.objects.get(parent=items[0], label="crm.create_record")
    assert child.kind == Kind.REMOTE_TOOL and child.handle == "mcp_0_1"
    assert child.evidence["launched_by"] == WorkItem.objects.get(pk=items[0].pk).handle
    # Registered and settled with their events, as the one-item path records them: running at the
    # provider when Stop committed, so their settle carries Stop's stamp with its event.
    assert list(Event.objects.filter(item=child).values_list("kind", "to_state")) == [
        ("item_registered", S.QUEUED),
        ("observed_started", S.RUNNING),
        ("cancel_requested", S.RUNNING),
        ("reconciled", S.UNCERTAIN),
    ]
    assert WorkItem.objects.get(pk=child.pk).cancel_requested_at == Task.objects.get(pk=task.pk).stop_requested_at
    assert "hosted tool calls with unknown outcome; review required." in task_summary(task)

    # The read-backs that watch a cancelled for a flip read the same output again.
    later = WorkItem.objects.get(pk=items[0].pk).next_check_at
    assert later is not None
    items_cancel(item_ids=dispatched[: count // 2], mechanism="openai", now=later + timedelta(seconds=1))
    sweep_once(now=later + timedelta(seconds=1), batch=count)
    assert CancellationAttempt.objects.filter(item__in=items).count() > count  # they did read back
    assert children() == {item.pk: expected for item in items}


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_two_read_backs_at_once_record_each_launched_call_once(openai_party):
    """The batch and a one-item pass reading the same responses back at the same moment, on two
    connections: the parents' row locks let one record the calls and the other find them."""
    party, url = openai_party
    model = party.load_script(LAUNCHED)
    task = make_task()
    items = [
        item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
        for _ in range(3)
    ]
    calls = {}
    for item in items:
        response = response_create(item_id=item.pk, actor="test", base_url=url, model=model, input="Go")
        time.sleep(0.05)
        calls[item.pk] = launched_tool_calls(party.get(response.id))
    assert all(len(c) == 4 for c in calls.values())
    barrier = threading.Barrier(3)
    created: list[int] = []

    def batch() -> None:
        try:
            barrier.wait()
            new = responses_launched_record(calls=calls, actor="batch")
            created.extend(i for ids in new.values() for i in ids)
        finally:
            connections.close_all()

    def one(item_id: int) -> None:
        try:
            barrier.wait()
            created.extend(response_launched_record(item_id=item_id, calls=calls[item_id], actor="one"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=batch), threading.Thread(target=one, args=(items[2].pk,))]
    threads.append(threading.Thread(target=one, args=(items[0].pk,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Three hosted calls each; no Stop asked for the responses, so the function call is left to the
    # application, which runs it through the boundary as an item of its own.
    assert len(created) == len(set(created)) == 9
    assert WorkItem.objects.filter(parent__in=items).count() == 9
