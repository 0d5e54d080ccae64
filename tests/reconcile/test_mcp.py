"""The stop matrix for MCP tool calls, against the sandbox MCP server (built with the SDK).

Plain calls run in both revisions: the sandbox speaking both (the client negotiates 2026-07-28)
and speaking only 2025-11-25 (the client's 2026-07-28 attempt is refused and it falls back)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
from django.db import connection

from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.mechanisms.mcp import servers as mcp_servers
from reconcile.mechanisms.mcp.agent import mcp_call_tool, mcp_start_task, task_owner
from reconcile.services.cancel import item_cancel
from stopdesk.models import Event, WorkItem
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.conftest import configure_mcp_server
from tests.reconcile.helpers import abandoned_extension_task, abandoned_task, sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    options = settings.STOPDESK_MECHANISMS.get("mcp", {}).get("options", {})
    settings.STOPDESK_MECHANISMS = {
        "mcp": {
            "call_timeout_s": 1.0,
            "deadline_s": 10.0,
            "backoff_initial_s": 1.0,
            "recheck_interval_s": 0.5,
            "options": options,
        }
    }


# What the sandbox speaks -> the revision the client ends up using.
NEGOTIATED = {"both": mcp_servers.MODERN, "2025-11-25": mcp_servers.LEGACY}


@pytest.fixture(params=sorted(NEGOTIATED))
def speaking(request, mcp_party):  # type: ignore[no-untyped-def]
    """The sandbox speaking both revisions, or only 2025-11-25; yields (party, url, revision used)."""
    party, url = mcp_party
    party.configure(revisions=request.param)
    return party, url, NEGOTIATED[request.param]


def tool_item(task, noun="lookup"):  # type: ignore[no-untyped-def]
    return item_register(task=task, kind=Kind.REMOTE_TOOL, noun=noun, actor="test", mechanism="mcp")


def stop(task) -> None:  # type: ignore[no-untyped-def]
    try:
        task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    finally:
        connection.close()


def started(party, call):  # type: ignore[no-untyped-def]
    """A condition for `call_and_stop`: the tool has started at the server."""
    return lambda: any(e["call"] == call and e["event"] == "started" for e in party.journal())


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
            if callable(stop_after):  # a condition: Stop once it holds
                while not stop_after():
                    await anyio.sleep(0.02)
                await anyio.to_thread.run_sync(stop, task)
            elif stop_after is not None:
                await anyio.sleep(stop_after)
                await anyio.to_thread.run_sync(stop, task)

    try:
        anyio.run(main)
    except BaseExceptionGroup as group:  # our own task group wraps what the call raised
        raise group.exceptions[0] from None
    finally:
        connection.close()
    return results[0]


def test_call_records_server_tool_revision_transport_and_annotations(fast, speaking):
    party, url, revision = speaking
    task = make_task()
    item = tool_item(task)
    result = call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 0.05}, None)
    assert not result.is_error
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    facts = item.detail["mcp"]
    # Called by URL, the configured server of that URL is named.
    assert (facts["server"], facts["url"], facts["tool"]) == ("sandbox", url, "slow_lookup")
    assert (facts["revision"], facts["protocol_version"], facts["transport"]) == (revision, revision, "streamable_http")
    assert facts["annotations"]["readOnlyHint"] is True
    # The tools/call the server received carried that revision.
    assert [m["revision"] for m in party.wire("tools/call")] == [revision]


def test_a_server_that_refuses_2026_07_28_gets_2025_11_25_and_the_fallback_is_recorded(fast, mcp_party):
    party, url = mcp_party
    party.configure(revisions="2025-11-25")
    task = make_task()
    item = tool_item(task)
    call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 0.05}, None)
    item.refresh_from_db()
    assert item.detail["mcp"]["revision"] == "2025-11-25"
    assert item.detail["mcp"]["negotiation"].startswith("fell back: the server refused 2026-07-28")
    # The probe went first and was refused; then the handshake.
    methods = [(m["method"], bool(m.get("refused"))) for m in party.wire()]
    assert methods[:2] == [("server/discover", True), ("initialize", False)]


def test_a_revision_pinned_in_configuration_is_used_without_probing(fast, mcp_party, settings):
    party, url = mcp_party
    configure_mcp_server(settings, "sandbox", url=url, revision="2025-11-25")
    task = make_task()
    item = tool_item(task)
    call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 0.05}, None)
    item.refresh_from_db()
    assert item.detail["mcp"]["revision"] == "2025-11-25"
    assert item.detail["mcp"]["negotiation"] == "2025-11-25 pinned by configuration"
    assert party.wire("server/discover") == []


def test_a_revision_outside_the_choices_is_refused_with_the_setting_named(fast, mcp_party, settings):
    _party, url = mcp_party
    configure_mcp_server(settings, "sandbox", url=url, revision="2024-11-05")
    with pytest.raises(mcp_servers.ServerConfigError, match="'revision' must be one of"):
        mcp_servers.configured_servers(settings.STOPDESK_MECHANISMS["mcp"]["options"])


def test_queued_call_is_cancelled_by_stop_and_never_sent(fast, speaking):
    party, url, _revision = speaking
    task = make_task()
    item = tool_item(task)
    stop(task)
    with pytest.raises(TaskStopped):
        call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k"}, None)
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    assert party.counts.count("tools/call") == 0


def cancel_seen_at_the_server(party, revision):  # type: ignore[no-untyped-def]
    """How the cancel of the one tools/call looked at the server, per revision."""
    call = party.wire("tools/call")[-1]
    cancels = party.wire("notifications/cancelled")
    if revision == mcp_servers.MODERN:
        return "stream closed" if call.get("stream_closed") and not cancels else f"unexpected: {call} {cancels}"
    return "notification with the request id" if [c["request_id"] for c in cancels] == [call["id"]] else cancels


def test_cancelled_read_only_call_ends_cancelled(fast, speaking):
    party, url, revision = speaking
    task = make_task()
    item = tool_item(task)
    assert call_and_stop(task, item, url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 5}, started(party, "q")) is None
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.outcome == "cancelled; read-only tool"
    time.sleep(0.2)
    assert [e["event"] for e in party.journal(tools.SLOW_LOOKUP)] == ["started", "interrupted"]
    assert cancel_seen_at_the_server(party, revision) == EXPECTED_CANCEL[revision]


EXPECTED_CANCEL = {mcp_servers.MODERN: "stream closed", mcp_servers.LEGACY: "notification with the request id"}
CANCEL_WIRE = {mcp_servers.MODERN: mcp_servers.STREAM_CLOSED, mcp_servers.LEGACY: mcp_servers.NOTIFICATION_WITH_ID}


def test_cancelled_write_ends_uncertain_because_no_answer_follows(fast, speaking):
    party, url, revision = speaking
    task = make_task()
    item = tool_item(task, noun="write")
    assert call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k1", "seconds": 5}, started(party, "k1")) is None
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["annotations"]["destructiveHint"] is True
    assert item.evidence["cancel"] == {
        "revision": revision,
        "transport": "streamable_http",
        "sent": CANCEL_WIRE[revision],
        # The server's id of the call: the one its cancel named (2025-11-25) or whose stream closed.
        "request_id": party.wire("tools/call")[-1]["id"],
    }
    assert cancel_seen_at_the_server(party, revision) == EXPECTED_CANCEL[revision]
    if revision == mcp_servers.MODERN:
        assert "looks like a dropped connection" in item.evidence["uncertain_because"]


def test_write_that_ignores_the_cancel_lands_and_the_item_stays_uncertain(fast, speaking):
    party, url, _revision = speaking
    party.set_fault(tools.IGNORE_CANCEL, target="k2")
    task = make_task()
    item = tool_item(task, noun="write")
    assert call_and_stop(task, item, url, tools.SLOW_WRITE, {"key": "k2", "seconds": 0.8}, started(party, "k2")) is None
    time.sleep(0.8)
    assert [e["call"] for e in party.effects(tools.SLOW_WRITE)] == ["k2"]  # it happened anyway
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN  # never "cancelled" on the client's word alone


def test_a_write_whose_cancel_it_ignored_is_settled_by_its_status_check(fast, speaking, settings, clock):
    """Cancelled by a closed stream (2026-07-28) or a notification (2025-11-25), the write lands
    anyway: uncertain with a deadline, until the declared status check (read_value) shows it."""
    party, url, revision = speaking
    check = {"tool": tools.READ_VALUE, "arguments": {"key": "{key}"}, "completed_if_contains": "{key}={value}"}
    configure_mcp_server(settings, "sandbox", url=url, tools={tools.SLOW_WRITE: {"status_check": check}})
    party.set_fault(tools.IGNORE_CANCEL, target="k3")
    task = make_task()
    item = tool_item(task, noun="write")
    arguments = {"key": "k3", "value": "v3", "seconds": 0.8}
    assert call_and_stop(task, item, url, tools.SLOW_WRITE, arguments, started(party, "k3")) is None
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["cancel"]["sent"] == CANCEL_WIRE[revision]
    assert "the status check (read_value) will look" in item.evidence["uncertain_because"]
    assert [e["call"] for e in party.effects(tools.SLOW_WRITE)] == ["k3"]  # landed while the caller lingered
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed; read_value shows it took effect"
    assert party.counts.count("tools/call", tools.READ_VALUE) >= 1


def start_export(item, url, seconds):  # type: ignore[no-untyped-def]
    return mcp_start_task(
        item_id=item.pk, url=url, tool=tools.EXPORT_REPORT, arguments={"seconds": seconds}, actor="agent", poll_s=0.05
    )


def owner_done(item) -> None:  # type: ignore[no-untyped-def]
    owner = task_owner(item.pk)
    assert owner is not None and owner.join(15), "the task's session owner did not finish"


def test_task_is_cancelled_and_read_back(fast, speaking, clock):
    """tasks/cancel then tasks/get read `cancelled`: in 2025-11-25 through the session that created
    the task (the spec keeps `cancelled` even if the work finishes), in 2026-07-28 by the task id
    alone after an empty acknowledgement. For a tool that may change the world it proves nothing."""
    party, url, revision = speaking
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 5)
    item.refresh_from_db()
    facts = item.detail["mcp"]
    assert item.handle == task_id and item.state == S.RUNNING and facts["session"]["owner"]
    assert (facts["revision"], facts["cancel_wire"]) == (revision, "tasks/cancel, then tasks/get")
    stop(task)
    item_cancel(item_id=item.pk)  # the reconciler sends nothing: the owner cancels
    owner_done(item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert "whether it took effect is unknown" in item.evidence["uncertain_because"]
    assert party.counts.count("tasks/cancel", task_id) == 1
    if revision == mcp_servers.LEGACY:
        assert facts["session"]["id"]
        assert item.evidence["detail"]["cancel"] == "answered cancelled; read back with tasks/get"
        # The cancel reached the task (a new session would have got -32602), then the session
        # closed and the server cleaned the task up.
        assert [t["status"] for t in party.task_registry.cleaned_up] == ["cancelled"]
        assert party.tasks() == []
    else:
        assert facts["session"]["id"] is None and facts["tasks"].startswith("the io.modelcontextprotocol/tasks")
        assert item.evidence["detail"]["cancel"] == "empty acknowledgement (proves nothing); read back with tasks/get"
        # Every task request named its task in Mcp-Name, so a load balancer could route it.
        task_requests = party.wire("tasks/cancel") + party.wire("tasks/get")
        assert task_requests and {m.get("mcp_name") for m in task_requests} == {task_id}


def test_the_owner_settles_the_item_and_marks_its_session_ended_in_one_write(fast, speaking):
    """The owner closes its session once it has recorded what the task read. A reconciler that
    found the item settled by the owner but its session not marked ended would take the owner for
    gone, resume the closed session (HTTP 404) and record that the owner stopped: no read of the
    item ever sees the one without the other."""
    _party, url, _revision = speaking
    task = make_task()
    item = tool_item(task, noun="export")
    start_export(item, url, 5)
    seen: list[tuple[str, bool]] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                state, detail = WorkItem.objects.values_list("state", "detail").get(pk=item.pk)
                seen.append((state, bool(detail["mcp"]["session"].get("ended"))))
        finally:
            connection.close()

    reader = threading.Thread(target=read, name="ledger-reader")
    reader.start()
    try:
        stop(task)
        owner_done(item)
    finally:
        done.set()
        reader.join()
    assert seen[-1] == (S.UNCERTAIN, True)
    assert (S.UNCERTAIN, False) not in seen


def test_a_2026_07_28_server_without_the_tasks_extension_gets_its_task_in_2025_11_25(fast, mcp_party, clock):
    party, url = mcp_party
    party.configure(tasks_extension=False)
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 5)
    item.refresh_from_db()
    facts = item.detail["mcp"]
    assert facts["revision"] == "2025-11-25" and facts["session"]["id"]
    assert facts["negotiation"] == (
        "2025-11-25 chosen for a task: the server speaks 2026-07-28 without the io.modelcontextprotocol/tasks extension"
    )
    stop(task)
    item_cancel(item_id=item.pk)
    owner_done(item)
    assert party.counts.count("tasks/cancel", task_id) == 1


def test_a_2026_07_28_task_whose_work_ignores_the_cancel_stays_working_and_ends_completed(fast, mcp_party):
    """Cancellation is eventually consistent and cooperative: the acknowledgement is empty, the
    status stays `working`, and the export lands. Only the read-back that shows `completed` settles it."""
    party, url = mcp_party
    party.set_fault(tools.TASKS_IGNORE_CANCEL)
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 1.0)
    stop(task)
    item_cancel(item_id=item.pk)
    owner_done(item)
    item.refresh_from_db()
    assert item.detail["mcp"]["revision"] == mcp_servers.MODERN
    assert party.counts.count("tasks/cancel", task_id) == 1
    assert [e["call"] for e in party.effects(tools.EXPORT_REPORT)] == [task_id]  # it happened
    assert item.state == S.COMPLETED, (item.state, item.outcome, item.evidence)


def test_a_2026_07_28_server_that_answers_at_once_without_a_task_finishes_the_item(fast, mcp_party):
    party, url = mcp_party
    party.set_fault(tools.TASKS_DECLINE, target=tools.EXPORT_REPORT)
    task = make_task()
    item = tool_item(task, noun="export")
    assert start_export(item, url, 0.05) == ""
    owner_done(item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome.startswith("report")
    assert item.handle == "" and party.counts.count("tasks/get") == 0


def test_task_that_finished_before_stop_ends_completed(fast, speaking):
    party, url, _revision = speaking
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 0.05)
    owner_done(item)  # its owner read `completed` and recorded it
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed"
    assert party.counts.count("tasks/cancel", task_id) == 0
    assert [e["call"] for e in party.effects(tools.EXPORT_REPORT)] == [task_id]


def test_a_2026_07_28_task_whose_owner_died_is_cancelled_and_read_back_by_its_id(fast, mcp_party, clock):
    """No session to resume in 2026-07-28: the reconciler cancels and reads back by the task id."""
    party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = abandoned_extension_task(url, item)
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["detail"]["cancel"] == "empty acknowledgement (proves nothing)"
    assert [t["status"] for t in party.tasks() if t["taskId"] == task_id] == ["cancelled"]
    assert {m.get("mcp_name") for m in party.wire("tasks/cancel")} == {task_id}


def test_task_whose_owner_died_is_cancelled_in_its_resumed_session(fast, mcp_party, clock):
    party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = abandoned_task(url, item, delete_session=False)
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["detail"]["cancel"] == "accepted (resumed session)"
    assert [t["status"] for t in party.tasks() if t["taskId"] == task_id] == ["cancelled"]


def test_task_whose_owner_died_with_its_session_is_uncertain_because_the_owner_stopped(fast, mcp_party, clock):
    _party, url = mcp_party
    task = make_task()
    item = tool_item(task, noun="export")
    abandoned_task(url, item, delete_session=True)
    stop(task)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.outcome == "task's session lost with its owner; investigate"
    because = item.evidence["uncertain_because"]
    assert "owned the MCP session" in because and "stopped" in because and "expired" not in because


def test_task_not_found_right_after_creation_has_its_own_outcome(fast, speaking):
    party, url, _revision = speaking
    party.set_fault(tools.TASKS_FORGET, target=tools.EXPORT_REPORT)  # deleted as soon as it is created
    task = make_task()
    item = tool_item(task, noun="export")
    start_export(item, url, 5)
    owner_done(item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.outcome == "task not found right after it was created; investigate"
    assert "'task not found' for the task it had just created" in item.evidence["uncertain_because"]


def test_a_task_deleted_after_its_cancel_while_its_work_lands_is_never_called_cancelled(fast, speaking, clock):
    """The server acknowledges tasks/cancel, deletes the task, and lets its export run on and land
    (the spec allows deletion at any time; cancellation is cooperative). The read-back finds no
    task: that proves nothing, so the item stays uncertain with a deadline, for a person."""
    party, url, _revision = speaking
    party.set_fault(tools.TASKS_FORGET_ON_CANCEL, target=tools.EXPORT_REPORT)
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 1)
    stop(task)
    item_cancel(item_id=item.pk)
    owner_done(item)
    assert party.counts.count("tasks/cancel", task_id) == 1
    assert all(t["taskId"] != task_id for t in party.tasks())  # deleted after the acknowledgement
    deadline = time.monotonic() + 10
    while not party.effects(tools.EXPORT_REPORT):  # the export it did not stop lands
        assert time.monotonic() < deadline, "the export never landed"
        time.sleep(0.05)
    clock.advance(60)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None, (item.state, item.outcome)
    assert item.outcome == "task deleted after its cancel; investigate"
    # Why it went uncertain is said where it went uncertain. A later look of the sweep may find the
    # owner's session gone too (its lease ran out while the export landed) and say so as the
    # latest reason: both are true, and neither is a cancel.
    went = Event.objects.filter(item=item, to_state=S.UNCERTAIN).order_by("id").first()
    assert went is not None and "a deletion proves nothing" in went.message, went and went.message
    assert item.evidence["uncertain_because"]


def test_duplicate_task_cancel_sends_one_tasks_cancel(fast, speaking, clock):
    party, url, _revision = speaking
    task = make_task()
    item = tool_item(task, noun="export")
    task_id = start_export(item, url, 5)
    stop(task)
    stop(task)
    item_cancel(item_id=item.pk)
    item_cancel(item_id=item.pk)
    owner_done(item)
    clock.advance(60)
    sweep_until_settled(clock, item)
    assert party.counts.count("tasks/cancel", task_id) == 1
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["uncertain_because"].startswith("Reconciled by the session's owner") or (
        "whether it took effect is unknown" in item.evidence["uncertain_because"]
    )
