"""Task-augmented calls through the gateway, from the MCP Python SDK's client, in each revision: the
call is an item that passes the boundary, runs as a task upstream (its upstream task id the item's
handle), and the client polls a task of the gateway's own. Stop cancels the upstream task with
`tasks/cancel`, reads it back, and the client's task says who stopped it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND, Implementation

from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.mechanisms.mcp.servers import TasksExtension
from stopdesk.gateway.app import gateway_app
from stopdesk.gateway.server import STOPPED
from stopdesk.models import WorkItem
from stopdesk.services.items import item_finish
from stopdesk.states import ItemState
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.gateway.conftest import CHECK, POLL_S, Gateway
from tests.gateway.test_gateway_calls import leaf, started, stop, stop_once_started

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
CLIENT = Implementation(name="task-client", version="2.0")
# The client's revision, and the upstream's: a 2026-07-28 client in front of a 2026-07-28 upstream
# (the tasks extension on both sides), and a 2025-11-25 client in front of a 2025-11-25-only upstream
# (core tasks, kept in sessions, on both sides).
REVISIONS = [
    pytest.param("auto", "both", id="2026-07-28"),
    pytest.param("legacy", "2025-11-25", id="2025-11-25"),
]


@pytest.fixture
def upstream_config() -> dict[str, Any]:
    # A 2026-07-28 upstream lists no taskSupport: the gateway's configuration names the tools it
    # runs as tasks for a client that declares the tasks extension.
    task = {"task": True}
    return {"tools": {tools.SLOW_WRITE: {"status_check": CHECK}, tools.EXPORT_REPORT: task, tools.SLOW_LOOKUP: task}}


class TaskClient:
    """The SDK client's session, sending the task messages its typed API does not (a task-augmented
    `tools/call` answer is not a CallToolResult), stamped as the negotiated revision wants them."""

    def __init__(self, client: Client, mode: str) -> None:
        self.client = client
        self.modern = mode != "legacy"

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self.client.session
        data: dict[str, Any] = {"method": method, "params": params}
        opts: dict[str, Any] = {"timeout": 30.0}
        session._stamp(data, opts)  # type: ignore[arg-type]  # the revision's `_meta`, with the tasks extension
        if method.startswith("tasks/") and self.modern and "taskId" in params:
            opts.setdefault("headers", {})["mcp-name"] = params["taskId"]
        return await session._dispatcher.send_raw_request(method, data.get("params"), opts)  # type: ignore[arg-type]

    async def call_as_task(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if not self.modern:
            params["task"] = {}
        answer = await self.request("tools/call", params)
        task = answer if self.modern else answer["task"]
        assert answer.get("resultType") == "task" if self.modern else "task" in answer, answer
        return dict(task)

    async def get(self, task_id: str) -> dict[str, Any]:
        return await self.request("tasks/get", {"taskId": task_id})

    async def until(self, task_id: str, statuses: set[str], within_s: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        while True:
            task = await self.get(task_id)
            if task["status"] in statuses or time.monotonic() > deadline:
                return task
            await anyio.sleep(0.05)


def with_task_client(
    url: str, body: Callable[[TaskClient], Awaitable[Any]], *, mode: str, task_id: int | None = None
) -> Any:
    async def main() -> Any:
        headers = {"X-Stopdesk-Task": str(task_id)} if task_id is not None else {}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            transport = streamable_http_client(url, http_client=http)
            client = Client(
                transport, mode=mode, client_info=CLIENT, read_timeout_seconds=30.0, extensions=[TasksExtension()]
            )  # type: ignore[arg-type]
            async with client:
                return await body(TaskClient(client, mode))

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        raise leaf(group) from None
    finally:
        connection.close()


def owner_done(item: WorkItem, within_s: float = 15.0) -> WorkItem:
    """Once the owner in the gateway let the upstream task go, it says so on the item."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        item.refresh_from_db()
        if ((item.detail.get("mcp") or {}).get("session") or {}).get("ended"):
            return item
        time.sleep(0.05)
    raise AssertionError(f"the owner of item {item.pk} did not end: {item.state} {item.detail}")


def exports_started(party: tools.MCPToolServer) -> list[str]:
    """The upstream task ids of the exports the upstream started (an export's journal names its task)."""
    return [e["call"] for e in party.journal(tools.EXPORT_REPORT) if e["event"] == "started"]


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_a_task_call_completes_and_is_recorded_with_its_upstream_task_id_as_handle(gateway, mode, upstream):
    gateway.party.configure(revisions=upstream)

    async def body(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, list[str]]:
        created = await client.call_as_task(tools.EXPORT_REPORT, {"name": "q3", "seconds": 0.3})
        done = await client.until(created["taskId"], {"completed", "failed", "cancelled"})
        if client.modern:  # the extension has no tasks/result and no tasks/list: tasks/get carries the result
            with pytest.raises(MCPError) as no_list:
                await client.request("tasks/list", {})
            assert no_list.value.error.code == METHOD_NOT_FOUND
            return created, done, None, []
        result = await client.request("tasks/result", {"taskId": created["taskId"]})
        listed = await client.request("tasks/list", {})
        return created, done, result, [t["taskId"] for t in listed["tasks"]]

    created, done, result, listed = with_task_client(gateway.url, body, mode=mode)
    assert created["status"] == "working"
    assert done["status"] == "completed", done
    text = "report 'q3' exported"
    if mode == "legacy":
        assert result is not None and result["content"][0]["text"] == text
        assert listed == [created["taskId"]]  # the session's tasks
    else:
        assert done["result"]["content"][0]["text"] == text  # 2026-07-28: tasks/get carries the result
    item = owner_done(WorkItem.objects.get())
    assert item.state == S.COMPLETED, (item.state, item.outcome, item.evidence)
    # The upstream's task id is the handle; the client's task is the gateway's own, recorded beside it.
    (upstream_task_id,) = exports_started(gateway.party)
    assert item.handle == upstream_task_id
    assert item.detail["gateway"]["client_task_id"] == created["taskId"] != upstream_task_id
    assert item.detail["mcp"]["revision"] == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert item.detail["mcp"]["cancel_wire"] == "tasks/cancel, then tasks/get"
    assert gateway.party.counts.count("tasks/cancel") == 0


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_stop_during_a_read_only_task_cancels_it_upstream_and_the_item_is_cancelled(gateway, mode, upstream):
    gateway.party.configure(revisions=upstream)
    task = make_task()
    presser = stop_once_started(gateway.party, tools.SLOW_LOOKUP, task.pk)

    async def body(client: TaskClient) -> tuple[dict[str, Any], MCPError]:
        created = await client.call_as_task(tools.SLOW_LOOKUP, {"query": "q", "seconds": 5})
        seen = await client.until(created["taskId"], {"completed", "failed", "cancelled"})
        with pytest.raises(MCPError) as raised:
            await client.request("tasks/result", {"taskId": created["taskId"]})
        return seen, raised.value

    began = time.monotonic()
    seen, error = with_task_client(gateway.url, body, mode=mode, task_id=task.pk)
    presser.join()
    assert time.monotonic() - began < 4  # Stop was pushed to the owner, not found by the 5 s lookup ending
    assert (seen["status"], seen["statusMessage"]) == ("cancelled", "stopped by user:operator: wrong repository")
    if mode == "legacy":  # what the call would have answered: who stopped it
        assert (error.error.code, error.error.message) == (STOPPED, "stopped by user:operator: wrong repository")
    else:  # the 2026-07-28 extension has no tasks/result
        assert error.error.code == METHOD_NOT_FOUND
    item = WorkItem.objects.get(task=task)
    item = owner_done(item)
    upstream_task_id = item.handle  # the upstream's: it read the task back by it, and cancelled it by it
    assert upstream_task_id and gateway.party.counts.count("tasks/get", upstream_task_id) >= 1
    assert gateway.party.counts.count("tasks/cancel", upstream_task_id) == 1
    assert item.state == S.CANCELLED, (item.state, item.outcome, item.evidence)  # read-only, read back cancelled


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_stop_during_a_write_task_whose_work_lands_anyway_is_never_called_cancelled(gateway, mode, upstream):
    """The upstream acknowledges the cancel and the export lands anyway. The client's task says it
    was stopped; the item is not cancelled: a 2025-11-25 task reads back `cancelled`, which proves
    nothing for a tool that may change the world (uncertain, with a deadline); a 2026-07-28 task
    stays `working` after the empty acknowledgement and reads back `completed`, which settles it."""
    gateway.party.configure(revisions=upstream)
    gateway.party.set_fault(tools.TASKS_IGNORE_CANCEL)
    task = make_task()
    presser = stop_once_started(gateway.party, tools.EXPORT_REPORT, task.pk)

    async def body(client: TaskClient) -> dict[str, Any]:
        created = await client.call_as_task(tools.EXPORT_REPORT, {"name": "r", "seconds": 1.0})
        return await client.until(created["taskId"], {"completed", "failed", "cancelled"})

    seen = with_task_client(gateway.url, body, mode=mode, task_id=task.pk)
    presser.join()
    assert (seen["status"], seen["statusMessage"]) == ("cancelled", "stopped by user:operator: wrong repository")
    item = WorkItem.objects.get(task=task)
    (upstream_task_id,) = exports_started(gateway.party)
    assert gateway.party.counts.count("tasks/cancel", upstream_task_id) == 1
    item = owner_done(item)
    deadline = time.monotonic() + 10
    while not gateway.party.effects(tools.EXPORT_REPORT) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e["call"] for e in gateway.party.effects(tools.EXPORT_REPORT)] == [upstream_task_id]  # it landed
    if mode == "legacy":
        assert item.state == S.UNCERTAIN and item.investigate_by is not None, (item.state, item.evidence)
        assert item.evidence["detail"]["cancel"] == "answered cancelled; read back with tasks/get"
    else:
        # The empty acknowledgement and the `working` read back after it settled nothing; the item
        # stayed running, cancel requested, until a read-back showed the task completed.
        cancel, inspect = item.attempts.order_by("pk")
        assert (cancel.action, cancel.observed_status) == ("cancel", "working")
        assert cancel.detail["cancel"] == "empty acknowledgement (proves nothing); read back with tasks/get"
        assert (inspect.action, inspect.observed_status) == ("inspect", "completed")
        assert item.outcome == "completed anyway; the cancel did not take effect"
        assert item.state == S.COMPLETED, (item.state, item.outcome, item.evidence)
    assert not item.events.filter(to_state=S.CANCELLED).exists()  # at no moment called cancelled


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_a_task_call_after_stop_is_refused_and_never_reaches_the_upstream(gateway, mode, upstream):
    gateway.party.configure(revisions=upstream)
    task = make_task()
    stop(task.pk, reason="enough")

    async def body(client: TaskClient) -> Any:
        return await client.call_as_task(tools.EXPORT_REPORT, {"name": "r", "seconds": 0.05})

    with pytest.raises(MCPError) as raised:
        with_task_client(gateway.url, body, mode=mode, task_id=task.pk)
    assert (raised.value.error.code, raised.value.error.message) == (STOPPED, "stopped by user:operator: enough")
    assert gateway.party.counts.count("tools/call") == 0 and gateway.party.wire("tools/call") == []
    assert WorkItem.objects.get(task=task).state == S.CANCELLED


def test_a_2025_11_25_task_for_a_tool_that_runs_no_tasks_is_method_not_found_and_nothing_is_sent(gateway):
    gateway.party.configure(revisions="2025-11-25")  # its tools say taskSupport (2026-07-28 decides per call)

    async def body(client: TaskClient) -> Any:
        return await client.call_as_task(tools.SLOW_WRITE, {"key": "k", "value": "v"})

    with pytest.raises(MCPError) as raised:
        with_task_client(gateway.url, body, mode="legacy")
    assert raised.value.error.code == METHOD_NOT_FOUND
    assert gateway.party.wire("tools/call") == [] and not WorkItem.objects.exists()


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_the_client_cancels_its_own_task_and_the_upstream_task_is_cancelled(gateway, mode, upstream):
    gateway.party.configure(revisions=upstream)

    async def body(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any]]:
        created = await client.call_as_task(tools.SLOW_LOOKUP, {"query": "q", "seconds": 5})
        while not started(gateway.party, tools.SLOW_LOOKUP):
            await anyio.sleep(0.02)
        answer = await client.request("tasks/cancel", {"taskId": created["taskId"]})
        return answer, await client.get(created["taskId"])

    answer, seen = with_task_client(gateway.url, body, mode=mode)
    if mode == "legacy":
        assert answer["status"] == "cancelled"  # 2025-11-25: cancelled before the reply
    assert (seen["status"], seen["statusMessage"]) == ("cancelled", "cancelled by the client")
    item = WorkItem.objects.get()
    item = owner_done(item)
    assert item.handle and gateway.party.counts.count("tasks/cancel", item.handle) == 1
    assert item.state == S.CANCELLED, (item.state, item.outcome, item.evidence)


def test_a_2026_07_28_client_that_can_take_a_task_gets_a_plain_call_for_a_tool_not_declared_a_task(gateway):
    """The gateway decides as a 2026-07-28 server does: a tool not declared `task` is a plain call,
    with everything a plain call has (its upstream request id, no task upstream)."""

    async def body(client: TaskClient) -> dict[str, Any]:
        return await client.request("tools/call", {"name": tools.READ_VALUE, "arguments": {"key": "k"}})

    answer = with_task_client(gateway.url, body, mode="auto")
    assert answer["resultType"] == "complete" and answer["content"][0]["text"] == "k: no value"
    item = WorkItem.objects.get()
    assert item.state == S.COMPLETED and item.handle == ""
    (upstream_call,) = gateway.party.wire("tools/call")
    assert item.detail["gateway"]["upstream_request_id"] == upstream_call["id"]
    assert "client_task_id" not in item.detail["gateway"] and gateway.party.tasks() == []


def test_a_2025_11_25_client_in_front_of_a_2026_07_28_upstream_sees_the_task_tools_and_runs_one(gateway):
    """The upstream speaks 2026-07-28 (its tools carry no taskSupport); the 2025-11-25 client sees
    the tools configured `task` as optional tasks, and its task runs as the upstream's own."""

    async def body(client: TaskClient) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        listing = await client.client.list_tools()
        created = await client.call_as_task(tools.EXPORT_REPORT, {"name": "mixed", "seconds": 0.1})
        await client.until(created["taskId"], {"completed", "failed", "cancelled"})
        return listing, created, await client.request("tasks/result", {"taskId": created["taskId"]})

    listing, created, result = with_task_client(gateway.url, body, mode="legacy")
    support = {t.name: t.execution.task_support if t.execution else None for t in listing.tools}
    assert support[tools.EXPORT_REPORT] == support[tools.SLOW_LOOKUP] == "optional"
    assert support[tools.SLOW_WRITE] is None
    assert result["content"][0]["text"] == "report 'mixed' exported"
    item = owner_done(WorkItem.objects.get())
    assert item.state == S.COMPLETED and item.detail["mcp"]["revision"] == "2026-07-28"
    assert item.detail["gateway"]["client_revision"] == "2025-11-25"
    assert item.handle == exports_started(gateway.party)[0] != created["taskId"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_upstream_that_answers_without_a_task_finishes_the_item_and_the_client_hears_its_answer(gateway, mode):
    """A 2026-07-28 upstream decides per call and answers this one at once. A 2026-07-28 client then
    gets that answer (the gateway decides as the upstream did); a 2025-11-25 client, which asked for
    a task, gets one already completed, whose tasks/result is that answer."""
    gateway.party.set_fault(tools.TASKS_DECLINE, target=tools.EXPORT_REPORT)

    async def body(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any] | None]:
        params: dict[str, Any] = {"name": tools.EXPORT_REPORT, "arguments": {"name": "now", "seconds": 0.05}}
        if not client.modern:
            params["task"] = {}
        answer = await client.request("tools/call", params)
        if client.modern:
            return answer, None
        return answer, await client.request("tasks/result", {"taskId": answer["task"]["taskId"]})

    answer, result = with_task_client(gateway.url, body, mode=mode)
    if mode == "auto":
        assert answer["resultType"] == "complete" and answer["content"][0]["text"] == "report 'now' exported"
    else:
        assert answer["task"]["status"] == "completed"
        assert result is not None and result["content"][0]["text"] == "report 'now' exported"
    item = WorkItem.objects.get()
    assert item.state == S.COMPLETED and item.handle == ""  # no task upstream, so no task id to hold
    assert gateway.party.tasks() == [] and gateway.party.counts.count("tasks/get") == 0


def restarted(gateway: Gateway, created_by: Callable[[str], Any]) -> tuple[Any, str]:
    """`created_by(url)` runs against a gateway process that then ends (as a restart ends it); the
    URL of a fresh gateway process in front of the same upstream is returned beside its answer."""
    with BackgroundServer(lambda: gateway_app(poll_s=POLL_S), name="gateway-before") as before:
        answer = created_by(before.url + "/mcp/sandbox")
    return answer, gateway.url  # the fixture's gateway never held the task: a process of its own


def test_after_a_restart_a_2026_07_28_client_still_polls_its_task_and_hears_the_upstream(gateway):
    """The gateway restarted while a task ran. The client asks about it again by the id it was given
    and is not told "not found": the new process finds the item by that id and answers with the
    upstream's own view of the task, result included. The relay records nothing; the item is the
    reconciler's once the ended owner's lease runs out. An id never given out is still unknown."""
    gateway.party.configure(revisions="both")
    task = make_task()

    async def create(client: TaskClient) -> dict[str, Any]:
        return await client.call_as_task(tools.EXPORT_REPORT, {"name": "q4", "seconds": 1.0})

    created, url = restarted(gateway, lambda before: with_task_client(before, create, mode="auto", task_id=task.pk))
    item = WorkItem.objects.get(task=task)
    asked_before = gateway.party.counts.count("tasks/get", item.handle)

    async def poll(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any], MCPError]:
        first = await client.get(created["taskId"])
        done = await client.until(created["taskId"], {"completed", "failed", "cancelled"})
        with pytest.raises(MCPError) as unknown:
            await client.get("8d7c0b6e-0000-4000-8000-000000000000")
        return first, done, unknown.value

    first, done, unknown = with_task_client(url, poll, mode="auto")
    assert (first["taskId"], first["status"]) == (created["taskId"], "working")
    assert (done["taskId"], done["status"]) == (created["taskId"], "completed"), done
    assert done["result"]["content"][0]["text"] == "report 'q4' exported"
    assert (unknown.error.code, unknown.error.message) == (
        INVALID_PARAMS,
        "Task not found: 8d7c0b6e-0000-4000-8000-000000000000",
    )
    assert gateway.party.counts.count("tasks/get", item.handle) >= asked_before + 2  # asked by the item's handle
    item.refresh_from_db()
    assert item.state == S.RUNNING and item.lease_until is not None  # nothing claimed from the relay


def test_after_a_restart_a_task_stopped_meanwhile_reads_cancelled_with_who_stopped_it(gateway):
    gateway.party.configure(revisions="both")
    task = make_task()

    async def create(client: TaskClient) -> dict[str, Any]:
        return await client.call_as_task(tools.EXPORT_REPORT, {"name": "q4", "seconds": 5.0})

    created, url = restarted(gateway, lambda before: with_task_client(before, create, mode="auto", task_id=task.pk))
    stop(task.pk, reason="wrong quarter")

    async def poll(client: TaskClient) -> dict[str, Any]:
        return await client.get(created["taskId"])

    seen = with_task_client(url, poll, mode="auto")
    assert (seen["status"], seen["statusMessage"]) == ("cancelled", "stopped by user:operator: wrong quarter")
    assert WorkItem.objects.get(task=task).cancel_requested_at is not None


def test_after_a_restart_the_client_cancels_its_task_and_the_cancel_reaches_the_upstream(gateway):
    gateway.party.configure(revisions="both")

    async def create(client: TaskClient) -> dict[str, Any]:
        return await client.call_as_task(tools.SLOW_LOOKUP, {"query": "q", "seconds": 5})

    created, url = restarted(gateway, lambda before: with_task_client(before, create, mode="auto"))
    item = WorkItem.objects.get()

    async def cancel(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any]]:
        answer = await client.request("tasks/cancel", {"taskId": created["taskId"]})
        return answer, await client.until(created["taskId"], {"completed", "failed", "cancelled"})

    answer, seen = with_task_client(url, cancel, mode="auto")
    assert "status" not in answer and "taskId" not in answer  # 2026-07-28's empty acknowledgement
    assert gateway.party.counts.count("tasks/cancel", item.handle) == 1
    assert (seen["taskId"], seen["status"]) == (created["taskId"], "cancelled")


def test_after_a_restart_a_task_of_a_2025_11_25_upstream_is_answered_from_its_item(gateway):
    """The upstream's task lived in the upstream session of the process that ended: nobody can ask
    it about the task now. The client hears what the item says, never more: working while it is in
    flight, and once it is recorded completed, that the call completed and no result was kept."""
    gateway.party.configure(revisions="2025-11-25")

    async def create(client: TaskClient) -> dict[str, Any]:
        return await client.call_as_task(tools.EXPORT_REPORT, {"name": "q4", "seconds": 0.3})

    created, url = restarted(gateway, lambda before: with_task_client(before, create, mode="auto"))
    item = WorkItem.objects.get()
    assert item.detail["mcp"]["revision"] == "2025-11-25"

    async def poll(client: TaskClient) -> tuple[dict[str, Any], MCPError]:
        seen = await client.get(created["taskId"])
        with pytest.raises(MCPError) as refused:
            await client.request("tasks/cancel", {"taskId": created["taskId"]})
        return seen, refused.value

    seen, refused = with_task_client(url, poll, mode="auto")
    assert seen["status"] == "working" and "restarted while this task ran" in seen["statusMessage"]
    assert refused.error.code == INVALID_PARAMS and "cannot be cancelled from here" in refused.error.message
    assert gateway.party.counts.count("tasks/cancel") == 0

    item_finish(item_id=item.pk, succeeded=True, actor="test", outcome="report exported")
    seen = with_task_client(url, lambda client: client.get(created["taskId"]), mode="auto")
    assert seen["status"] == "failed", seen
    assert "kept no result" in seen["statusMessage"] and "recorded the call completed" in seen["statusMessage"]


@pytest.mark.parametrize(("mode", "upstream"), REVISIONS)
def test_an_ended_task_is_kept_its_keep_after_it_ended_and_no_longer(gateway, settings, mode, upstream):
    """The gateway gives its keep as the task's ttl (the upstream set none: never a promise of
    forever) and forgets the task once it has ended and the keep has passed, so a long-running
    gateway does not hold every task it ever ran. A 2025-11-25 client is then told the task is not
    found; a 2026-07-28 client's later `tasks/get` is answered from the upstream by the item's
    handle. A task still working is never forgotten, however old."""
    gateway.party.configure(revisions=upstream)
    settings.STOPDESK_MECHANISMS["mcp"]["options"]["task_keep_s"] = 1.0

    async def body(client: TaskClient) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
        created = await client.call_as_task(tools.EXPORT_REPORT, {"name": "q1", "seconds": 0.1})
        done = await client.until(created["taskId"], {"completed", "failed", "cancelled"})
        await anyio.sleep(1.3)
        if not client.modern:
            with pytest.raises(MCPError) as forgotten:
                await client.get(created["taskId"])
            # A task that outlives its ttl while working is kept until its keep after it ended.
            long = await client.call_as_task(tools.EXPORT_REPORT, {"name": "q2", "seconds": 1.6})
            await anyio.sleep(1.2)
            working = await client.get(long["taskId"])
            await client.until(long["taskId"], {"completed", "failed", "cancelled"})
            result = await client.request("tasks/result", {"taskId": long["taskId"]})
            return created, done, forgotten.value, (working, result)
        return created, done, await client.get(created["taskId"]), None

    with BackgroundServer(lambda: gateway_app(poll_s=POLL_S), name="gateway-keeping") as front:
        created, done, later, long = with_task_client(front.url + "/mcp/sandbox", body, mode=mode)
    assert done["status"] == "completed"
    assert created["ttlMs" if mode != "legacy" else "ttl"] == 1000
    item = WorkItem.objects.filter(detail__gateway__client_task_id=created["taskId"]).get()
    if mode == "legacy":
        assert (later.error.code, later.error.message) == (INVALID_PARAMS, f"Task not found: {created['taskId']}")
        working, result = long
        assert working["status"] == "working"
        assert result["content"][0]["text"] == "report 'q2' exported"
    else:
        assert (later["taskId"], later["status"]) == (created["taskId"], "completed")
        assert later["result"]["content"][0]["text"] == "report 'q1' exported"
        assert gateway.party.counts.count("tasks/get", item.handle) >= 2  # the owner's read, then the relay


def test_after_a_restart_a_task_the_upstream_deleted_is_answered_from_its_item(gateway):
    """The 2026-07-28 upstream deleted the task (the spec allows it at any time): it answers -32602
    for it. The client then hears what the item says, and never that the work is done or undone
    when nobody knows."""
    gateway.party.configure(revisions="both")
    gateway.party.set_fault(tools.TASKS_FORGET, target=tools.EXPORT_REPORT)

    async def create(client: TaskClient) -> dict[str, Any]:
        return await client.call_as_task(tools.EXPORT_REPORT, {"name": "gone", "seconds": 0.5})

    created, url = restarted(gateway, lambda before: with_task_client(before, create, mode="auto"))
    seen = with_task_client(url, lambda client: client.get(created["taskId"]), mode="auto")
    item = WorkItem.objects.get()
    assert gateway.party.counts.count("tasks/get", item.handle) >= 1
    assert seen["status"] == "working", seen
    if item.state == S.UNCERTAIN:  # the owner read -32602 before the restart and recorded it
        assert seen["statusMessage"].startswith("Outcome unknown")
    else:
        assert item.state == S.RUNNING and "restarted while this task ran" in seen["statusMessage"]
