"""The stop matrix for MCP tool calls, against the sandbox MCP server (built with the SDK)."""

from __future__ import annotations

import time

import anyio
import pytest
from django.db import connection

from reconcile.sandbox import mcp_server as tools
from reconcile.services.cancel import item_cancel
from stopdesk.agent.mcp import mcp_call_tool, mcp_start_task
from stopdesk.models import CancellationAttempt
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.helpers import sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "mcp": {"call_timeout_s": 1.0, "deadline_s": 10.0, "backoff_initial_s": 1.0, "recheck_interval_s": 0.5}
    }


def tool_item(task, noun="lookup"):  # type: ignore[no-untyped-def]
    return item_register(task=task, kind=Kind.REMOTE_TOOL, noun=noun, actor="test", mechanism="mcp")


def stop(task) -> None:  # type: ignore[no-untyped-def]
    try:
        task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    finally:
        connection.close()


def call_and_stop(task, item, url, tool, arguments, stop_after):  # type: ignore[no-untyped-def]
    results = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(
                    await mcp_call_tool(
                        item_id=item.pk, url=url, tool=tool, arguments=arguments, actor="agent", poll_s=0.05
                    )
                )

            tg.start_soon(call)
            if stop_after is not None:
                await anyio.sleep(stop_after)
                await anyio.to_thread.run_sync(stop, task)

    try:
        anyio.run(main)
    except BaseExceptionGroup as group:  # our own task group wraps what the call raised
        raise group.exceptions[0] from None
    finally:
        connection.close()
    return results[0]


def test_call_records_server_tool_protocol_and_annotations(fast, mcp_party):
    _party, url = mcp_party
    task = make_task()
    item = tool_item(task)
    result = call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 0.05}, None)
    assert not result.is_error
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    facts = item.detail["mcp"]
    assert (facts["server"], facts["tool"], facts["protocol_version"]) == (url, "slow_lookup", "2025-11-25")
    assert facts["annotations"]["readOnlyHint"] is True


def test_queued_call_is_cancelled_by_stop_and_never_sent(fast, mcp_party):
    party, url = mcp_party
    task = make_task()
    item = tool_item(task)
    stop(task)
    with pytest.raises(TaskStopped):
        call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k"}, None)
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    assert party.counts.count("tools/call") == 0


def test_cancelled_read_only_call_ends_cancelled(fast, mcp_party):
    party, url = mcp_party
    task = make_task()
    item = tool_item(task)
    assert call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 5}, 0.4) is None
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.outcome == "cancelled; read-only tool"
    time.sleep(0.2)
    assert [e["event"] for e in party.journal(tools.SLOW_LOOKUP)] == ["started", "interrupted"]


def test_cancelled_write_ends_uncertain_because_no_answer_follows(fast, mcp_party):
    _party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="write")
    assert call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k1", "seconds": 5}, 0.4) is None
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["annotations"]["destructiveHint"] is True


def test_write_that_ignores_the_cancel_lands_and_the_item_stays_uncertain(fast, mcp_party):
    party, url = mcp_party
    party.set_fault(tools.IGNORE_CANCEL, target="k2")
    task = make_task()
    item = tool_item(task, noun="write")
    assert call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k2", "seconds": 0.8}, 0.3) is None
    time.sleep(0.8)
    assert [e["call"] for e in party.effects(tools.SLOW_WRITE)] == ["k2"]  # it happened anyway
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN  # never "cancelled" on the client's word alone


def test_task_cancelled_and_read_back_is_uncertain_because_the_tool_is_not_read_only(fast, mcp_party, clock):
    """tasks/cancel then tasks/get reads `cancelled`; the spec keeps that status even if the work
    finishes, so for a tool that may change the world it is not proof of anything."""
    party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = mcp_start_task(
        item_id=item.pk, url=url, tool=tools.EXPORT_REPORT, arguments={"seconds": 5}, actor="agent"
    )
    item.refresh_from_db()
    assert item.handle == task_id and item.state == S.RUNNING
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert "whether it took effect is unknown" in item.evidence["uncertain_because"]
    assert [t["status"] for t in party.tasks()] == ["cancelled"]
    assert party.counts.count("tasks/cancel", task_id) == 1
    assert party.counts.count("tasks/get", task_id) == 1


def test_task_that_finished_before_the_cancel_ends_completed(fast, mcp_party):
    party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = mcp_start_task(
        item_id=item.pk, url=url, tool=tools.EXPORT_REPORT, arguments={"seconds": 0.05}, actor="agent"
    )
    time.sleep(0.3)
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed anyway; the cancel did not take effect"
    assert item.evidence["detail"]["cancel"] == "-32602; looked it up"
    assert party.counts.count("tasks/cancel", task_id) == 1


def test_task_server_unreachable_for_the_deadline_ends_uncertain(fast, mcp_party, clock):
    _party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    mcp_start_task(item_id=item.pk, url=url, tool=tools.EXPORT_REPORT, arguments={"seconds": 5}, actor="agent")
    item.refresh_from_db()
    item.detail["mcp"]["server"] = "http://127.0.0.1:9/mcp"  # connection refused
    item.save(update_fields=["detail"])
    stop(task)
    item_cancel(item_id=item.pk)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert CancellationAttempt.objects.filter(item=item, ok=False).count() >= 3


def test_duplicate_task_cancel_sends_one_tasks_cancel(fast, mcp_party, clock):
    party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = mcp_start_task(
        item_id=item.pk, url=url, tool=tools.EXPORT_REPORT, arguments={"seconds": 5}, actor="agent"
    )
    stop(task)
    stop(task)
    item_cancel(item_id=item.pk)
    item_cancel(item_id=item.pk)
    clock.advance(60)
    sweep_until_settled(clock, item)
    assert party.counts.count("tasks/cancel", task_id) == 1
