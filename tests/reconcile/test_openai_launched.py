"""What a cancelled response launched itself: each tool call in its output becomes a child item."""

from __future__ import annotations

import time

import pytest

from reconcile.mechanisms.openai import launched_tool_calls
from reconcile.sandbox.scripted_model import HostedMcpCall, Script, ToolCall, Turn
from reconcile.services.cancel import item_cancel
from reconcile.services.launched import response_launched_record
from stopdesk.agent.openai import response_create
from stopdesk.models import WorkItem
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
