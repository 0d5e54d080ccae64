"""An MCP client (the Python SDK's) calls the sandbox through the gateway: each call is an item of
the session's task, passes the boundary before it is forwarded, and Stop ends it with an MCP error."""

from __future__ import annotations

import threading
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
from mcp_types import INVALID_PARAMS, Implementation

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.agent.aio import in_thread
from stopdesk.gateway.server import STOPPED, arguments_hash
from stopdesk.gateway.sessions import TASK_META_KEY
from stopdesk.models import Task, WorkItem
from stopdesk.services.closing import task_close
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from tests.factories import make_task
from tests.gateway.conftest import answers_recorded
from tests.reconcile.helpers import sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
CLIENT = Implementation(name="test-client", version="9.1")
MODES = ["auto", "legacy"]  # the client speaks 2026-07-28, or 2025-11-25 with its handshake


def through_gateway(
    url: str, body: Callable[[Client], Awaitable[Any]], *, mode: str, task_id: int | None = None
) -> Any:
    """Run `body` with an SDK client connected to the gateway."""

    async def main() -> Any:
        headers = {"X-Stopdesk-Task": str(task_id)} if task_id is not None else {}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=mode, client_info=CLIENT, read_timeout_seconds=30.0) as client:  # type: ignore[arg-type]
                return await body(client)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:  # the transport's task groups wrap what the call raised
        raise leaf(group) from None
    finally:
        connection.close()


def went(gateway: Any) -> dict[str, int]:
    """How the gateway's calls went so far (its /healthz): "forwarded" as they came (a 2026-07-28
    client to a 2026-07-28 upstream over HTTP), or through the SDK on both sides."""
    answer = httpx2.get(gateway.url.removesuffix("/mcp/sandbox") + "/healthz")
    return dict(answer.json()["calls"]["sandbox"])


def one_call_went(mode: str) -> dict[str, int]:
    return {"forwarded": 1, "sdk": 0} if mode == "auto" else {"forwarded": 0, "sdk": 1}


def leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def stop(task_id: int, reason: str = "wrong repository") -> None:
    try:
        task_request_stop(task_id=task_id, actor="user:operator", reason=reason, dispatch=lambda ids: None)
    finally:
        connection.close()


def started(party: tools.MCPToolServer, tool: str) -> bool:
    return any(e["event"] == "started" for e in party.journal(tool))


def stop_once_started(party: tools.MCPToolServer, tool: str, task_id: int) -> threading.Thread:
    """Press Stop (as the dashboard would) once the upstream has started the tool."""

    def press() -> None:
        deadline = time.monotonic() + 10
        while not started(party, tool) and time.monotonic() < deadline:
            time.sleep(0.02)
        stop(task_id)

    thread = threading.Thread(target=press)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", MODES)
def test_a_call_passes_and_is_recorded_as_an_item_of_the_session_task(gateway, mode):
    arguments = {"query": "q", "seconds": 0.05}
    result = through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_LOOKUP, arguments), mode=mode)
    assert not result.is_error
    answers_recorded()
    (item,) = WorkItem.objects.all()
    assert item.state == S.COMPLETED
    assert item.task.title == "MCP: test-client 9.1 via sandbox"
    facts = item.detail["gateway"]
    assert facts["upstream"] == "sandbox" and facts["tool"] == tools.SLOW_LOOKUP
    assert facts["arguments_sha256"] == arguments_hash({"seconds": 0.05, "query": "q"})
    assert facts["client_request_id"] is not None and facts["annotations_trusted"] is False
    assert facts["client_revision"] == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    # What went upstream: the mcp facts, in the revision the upstream offered.
    assert item.detail["mcp"]["annotations"]["readOnlyHint"] is True
    assert item.detail["mcp"]["revision"] == "2026-07-28"
    (upstream_call,) = gateway.party.wire("tools/call")
    assert facts["upstream_request_id"] == upstream_call["id"]  # the upstream's id, not the client's
    assert went(gateway) == one_call_went(mode)


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_error_reaches_the_client_as_it_was_and_the_call_is_recorded_failed(gateway, mode):
    gateway.party.set_fault(tools.TOOL_CALL_ERROR, target=tools.SLOW_WRITE)
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, {"key": "k", "value": "v"}), mode=mode)
    assert (raised.value.error.code, raised.value.error.message) == (-32603, "the sandbox was told to fail this call")
    (item,) = WorkItem.objects.all()
    # The upstream answered: the write did not happen, and the record says failed, not unknown.
    assert item.state == S.FAILED and item.evidence["answered"] is True
    (upstream_call,) = gateway.party.wire("tools/call")
    assert item.detail["gateway"]["upstream_request_id"] == upstream_call["id"]
    assert gateway.party.effects(tools.SLOW_WRITE) == []
    assert went(gateway) == one_call_went(mode)


def test_more_calls_at_once_than_a_connection_pool_holds_all_reach_the_upstream_together(gateway):
    """120 clients, each with a 3 s read in flight at once: the upstream has all 120 under way
    together (a pool of 100 connections, aiohttp's default, would have held 20 back unsent)."""
    calls = 120

    async def one(n: int) -> None:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60.0)) as http:
            transport = streamable_http_client(gateway.url, http_client=http)
            async with Client(transport, mode="auto", client_info=CLIENT, read_timeout_seconds=60.0) as client:  # type: ignore[arg-type]
                await client.call_tool(tools.SLOW_LOOKUP, {"query": f"q{n}", "seconds": 3})

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for n in range(calls):
                tg.start_soon(one, n)

    anyio.run(main)
    answers_recorded()
    connection.close()
    under_way = most = 0
    for entry in gateway.party.journal(tools.SLOW_LOOKUP):
        under_way += 1 if entry["event"] == "started" else -1
        most = max(most, under_way)
    assert most == calls
    assert WorkItem.objects.filter(state=S.COMPLETED).count() == calls
    assert went(gateway) == {"forwarded": calls, "sdk": 0}


@pytest.mark.parametrize("upstream_config", [{"trusted": True}])
def test_a_trusted_servers_annotations_are_recorded_trusted(gateway):
    through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}), mode="auto")
    assert WorkItem.objects.get().detail["gateway"]["annotations_trusted"] is True


def test_each_call_on_a_kept_connection_records_its_own_upstream_request_id(gateway):
    async def body(client: Client) -> Any:
        for key in ("a", "b", "c"):
            await client.call_tool(tools.READ_VALUE, {"key": key})

    through_gateway(gateway.url, body, mode="auto")
    answers_recorded()
    recorded = [i.detail["gateway"]["upstream_request_id"] for i in WorkItem.objects.order_by("pk")]
    assert recorded == [m["id"] for m in gateway.party.wire("tools/call")]
    assert len(set(recorded)) == 3


def test_the_health_check_names_the_servers_it_fronts(gateway):
    answer = httpx2.get(gateway.url.removesuffix("/mcp/sandbox") + "/healthz")
    calls = {"sandbox": {"forwarded": 0, "sdk": 0}}
    assert (answer.status_code, answer.json()) == (200, {"ok": True, "servers": ["sandbox"], "calls": calls})


def test_tools_list_is_forwarded(gateway):
    listing = through_gateway(gateway.url, lambda c: c.list_tools(), mode="auto")
    names = {t.name for t in listing.tools}
    assert {tools.SLOW_LOOKUP, tools.SLOW_WRITE, tools.READ_VALUE} <= names


def test_a_header_names_an_existing_task(gateway):
    task = make_task()
    through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}), mode="auto", task_id=task.pk)
    assert list(WorkItem.objects.values_list("task_id", flat=True)) == [task.pk]


def test_arguments_the_status_check_needs_are_asked_for_and_nothing_is_sent(gateway):
    with pytest.raises(MCPError, match="the call has no argument 'value'") as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, {"key": "k"}), mode="auto")
    assert raised.value.error.code == INVALID_PARAMS
    assert gateway.party.wire("tools/call") == []
    assert not WorkItem.objects.exists()  # refused as bad input: nothing recorded, nothing sent


def test_a_meta_key_names_an_existing_task(gateway):
    task = make_task()
    meta: Any = {TASK_META_KEY: str(task.pk)}
    through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}, meta=meta), mode="auto")
    assert list(WorkItem.objects.values_list("task_id", flat=True)) == [task.pk]


def test_a_meta_key_naming_no_task_is_refused_and_nothing_is_sent(gateway):
    meta: Any = {TASK_META_KEY: 999999}
    with pytest.raises(MCPError, match=r"io\.stopdesk/task: no task '999999'") as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}, meta=meta), mode="auto")
    assert raised.value.error.code == INVALID_PARAMS
    assert not WorkItem.objects.exists()
    assert gateway.party.wire("tools/call") == []


def test_a_header_naming_no_task_is_refused_and_nothing_is_sent(gateway):
    with pytest.raises(MCPError, match="x-stopdesk-task: no task '999999'"):
        through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}), mode="auto", task_id=999999)
    assert not WorkItem.objects.exists()
    assert gateway.party.wire("tools/call") == []


@pytest.mark.parametrize("mode", MODES)
def test_stop_during_a_long_write_answers_the_client_cancels_upstream_and_leaves_it_uncertain(gateway, mode):
    task = make_task()
    presser = stop_once_started(gateway.party, tools.SLOW_WRITE, task.pk)
    arguments = {"key": "k", "value": "v", "seconds": 5}
    began = time.monotonic()
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, arguments), mode=mode, task_id=task.pk)
    presser.join()
    # Answered at Stop: pushed (the gateway polls only every POLL_S = 5 s), not when the write would end.
    assert time.monotonic() - began < 4
    assert raised.value.error.code == STOPPED
    assert raised.value.error.message == "stopped by user:operator: wrong repository"
    (item,) = WorkItem.objects.filter(task=task)
    # Not read-only, cancelled with no answer: the outcome is unknown, and the record says so.
    assert item.state == S.UNCERTAIN
    assert item.evidence["cancel"]["sent"] == "response stream closed"  # 2026-07-28 upstream over HTTP
    # Both ids: the client's (to the gateway) and the upstream's (whose stream the gateway closed).
    assert item.detail["gateway"]["client_request_id"] is not None
    (upstream_call,) = gateway.party.wire("tools/call")
    assert item.evidence["cancel"]["request_id"] == upstream_call["id"] and upstream_call["stream_closed"]
    assert item.detail["gateway"]["upstream_request_id"] == upstream_call["id"]
    # The upstream saw its call end before the write did: interrupted, no effect.
    events = [e["event"] for e in gateway.party.journal(tools.SLOW_WRITE)]
    assert events[0] == "started" and "interrupted" in events
    assert gateway.party.effects(tools.SLOW_WRITE) == []
    assert went(gateway) == one_call_went(mode)


def test_stop_cancels_a_2025_11_25_upstream_call_with_a_notification_naming_its_id(gateway):
    gateway.party.configure(revisions="2025-11-25")  # like server-everything: no 2026-07-28
    task = make_task()
    presser = stop_once_started(gateway.party, tools.SLOW_WRITE, task.pk)
    with pytest.raises(MCPError, match="stopped by user:operator"):
        through_gateway(
            gateway.url,
            lambda c: c.call_tool(tools.SLOW_WRITE, {"key": "k", "value": "v", "seconds": 5}),
            mode="auto",
            task_id=task.pk,
        )
    presser.join()
    item = WorkItem.objects.get(task=task)
    assert item.detail["mcp"]["revision"] == "2025-11-25"
    assert item.evidence["cancel"]["sent"] == "notifications/cancelled with the request id"
    (upstream_call,) = gateway.party.wire("tools/call")
    (cancel,) = gateway.party.wire("notifications/cancelled")
    assert cancel["request_id"] == upstream_call["id"] == item.evidence["cancel"]["request_id"]
    assert item.state == S.UNCERTAIN


def test_a_stopped_write_that_landed_anyway_is_settled_by_its_status_check(gateway, clock):
    """The upstream ignores the cancel and the write lands: uncertain with a deadline, until the
    reconciler's status check (read_value on the upstream, declared in the gateway's
    configuration) shows it took effect."""
    gateway.party.set_fault(tools.IGNORE_CANCEL, target="k3")
    task = make_task()
    presser = stop_once_started(gateway.party, tools.SLOW_WRITE, task.pk)
    arguments = {"key": "k3", "value": "v3", "seconds": 0.5}
    with pytest.raises(MCPError, match="stopped by user:operator"):
        through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, arguments), mode="auto", task_id=task.pk)
    presser.join()
    item = WorkItem.objects.get(task=task)
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert "the status check (read_value) will look" in item.evidence["uncertain_because"]
    time.sleep(0.6)  # the write the upstream would not cancel lands
    assert [e["call"] for e in gateway.party.effects(tools.SLOW_WRITE)] == ["k3"]
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed; read_value shows it took effect"


def test_a_read_only_call_stopped_in_flight_ends_cancelled(gateway):
    task = make_task()
    presser = stop_once_started(gateway.party, tools.SLOW_LOOKUP, task.pk)
    with pytest.raises(MCPError, match="stopped by user:operator"):
        through_gateway(
            gateway.url,
            lambda c: c.call_tool(tools.SLOW_LOOKUP, {"query": "q", "seconds": 5}),
            mode="auto",
            task_id=task.pk,
        )
    presser.join()
    assert WorkItem.objects.get(task=task).state == S.CANCELLED


@pytest.mark.parametrize("mode", MODES)
def test_a_call_after_stop_is_refused_and_never_reaches_the_upstream(gateway, mode):
    async def call_stop_call(client: Client) -> Any:
        await client.call_tool(tools.READ_VALUE, {"key": "k"})
        task_id = await in_thread(lambda: Task.objects.get().pk)
        await anyio.to_thread.run_sync(lambda: stop(task_id, reason="enough"))
        return await client.call_tool(tools.SLOW_WRITE, {"key": "k", "value": "v", "seconds": 0.05})

    with pytest.raises(MCPError, match=r"^stopped by user:operator: enough$"):
        through_gateway(gateway.url, call_stop_call, mode=mode)
    # The same session, so the same task; the write never reached the upstream.
    assert [m["tool"] for m in gateway.party.wire("tools/call")] == [tools.READ_VALUE]
    refused = WorkItem.objects.get(detail__gateway__tool=tools.SLOW_WRITE)
    assert refused.state == S.CANCELLED
    assert refused.task_id == Task.objects.get().pk


def test_a_new_2025_11_25_session_is_a_new_task(gateway):
    for _ in range(2):
        through_gateway(gateway.url, lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"}), mode="legacy")
    assert Task.objects.count() == 2


def test_a_2026_07_28_client_keeps_its_task_until_the_task_closes(gateway):
    """No session in 2026-07-28: the client (name, version, upstream) keeps one task across
    connections, stopped or not, until the task is closed; its next call then opens a new task."""
    read = lambda c: c.call_tool(tools.READ_VALUE, {"key": "k"})  # noqa: E731
    through_gateway(gateway.url, read, mode="auto")
    through_gateway(gateway.url, read, mode="auto")
    [first] = Task.objects.all()
    assert WorkItem.objects.filter(task=first).count() == 2
    task_close(task_id=first.pk, actor="system:idle-close")
    through_gateway(gateway.url, read, mode="auto")
    second = Task.objects.exclude(pk=first.pk).get()
    assert second.title == first.title == "MCP: test-client 9.1 via sandbox"
    assert WorkItem.objects.filter(task=second).count() == 1
