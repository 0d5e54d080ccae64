"""The sandbox MCP server, reached with the official mcp client and with raw JSON-RPC."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from reconcile.mechanisms.mcp.sandbox import MCP_PATH, MCPToolServer
from reconcile.mechanisms.mcp.sandbox_raw import McpRpcError, RawMcpSession
from stopdrill.sandbox.server import BackgroundServer

Tools = tuple[MCPToolServer, BackgroundServer]


def events(party: MCPToolServer, call: str) -> list[str]:
    return [entry["event"] for entry in party.journal() if entry["call"] == call]


def wait_until(predicate: Any, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def export_task(session: RawMcpSession, seconds: float, ttl: int | None = None) -> str:
    task: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
    created = session.request(
        "tools/call", {"name": "export_report", "arguments": {"name": "q3", "seconds": seconds}, "task": task}
    )
    assert created["task"]["status"] == "working"
    return str(created["task"]["taskId"])


# --- plain tool calls through the SDK --------------------------------------------------


def test_tools_carry_their_annotations_and_task_support(mcp_tools: Tools) -> None:
    _, server = mcp_tools

    async def listed() -> dict[str, types.Tool]:
        async with Client(server.url + MCP_PATH, mode="legacy") as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = anyio.run(listed)

    assert tools["slow_lookup"].annotations is not None and tools["slow_lookup"].annotations.read_only_hint is True
    write = tools["slow_write"].annotations
    assert write is not None and write.read_only_hint is False and write.destructive_hint is True
    assert tools["export_report"].execution is not None
    assert tools["export_report"].execution.task_support == "optional"


@pytest.mark.parametrize(("mode", "cancel_notifications"), [("legacy", 1), ("auto", 0)])
def test_cancelling_the_awaiting_scope_interrupts_slow_write_and_its_finally_runs(
    mcp_tools: Tools, mode: str, cancel_notifications: int
) -> None:
    party, server = mcp_tools

    async def cancelled_call() -> bool:
        async with Client(server.url + MCP_PATH, mode=mode) as client:
            with anyio.move_on_after(0.3) as scope:
                await client.call_tool("slow_write", {"key": "crm-note", "value": "x", "seconds": 2})
            # Keep the session open, so the interruption is the cancel's doing and not
            # the session teardown's.
            await anyio.sleep(0.3)
            return scope.cancelled_caught

    assert anyio.run(cancelled_call) is True
    assert wait_until(lambda: "interrupted" in events(party, "crm-note"))
    assert events(party, "crm-note") == ["started", "interrupted"]
    assert party.effects() == []
    # The handshake era sends notifications/cancelled; on the 2026-07-28 wire the SDK
    # aborts the POST instead. Either way the tool saw CancelledError.
    assert wait_until(lambda: party.counts.count("notifications/cancelled") == cancel_notifications)


@pytest.mark.parametrize(("speaks", "negotiated"), [("both", "2026-07-28"), ("2025-11-25", "2025-11-25")])
def test_the_server_speaks_both_revisions_or_only_the_one_it_is_told(
    mcp_tools: Tools, speaks: str, negotiated: str
) -> None:
    party, server = mcp_tools
    party.configure(revisions=speaks)

    async def version() -> str:
        async with Client(server.url + MCP_PATH, mode="auto") as client:
            await client.call_tool("slow_lookup", {"query": "q", "seconds": 0})
            return client.protocol_version

    assert anyio.run(version) == negotiated
    assert [m["revision"] for m in party.wire("tools/call")] == [negotiated]
    # Only the 2025-11-25 server refused the client's 2026-07-28 probe.
    assert [bool(m.get("refused")) for m in party.wire("server/discover")] == [speaks == "2025-11-25"]


def test_a_2025_11_25_only_server_answers_a_sessionless_request_400_like_server_everything(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.configure(revisions="2025-11-25")
    answer = httpx.post(
        server.url + MCP_PATH,
        json={"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}},
        headers={"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json, text/event-stream"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "Bad Request: Server not initialized"
    assert party.counts.count("tools/list") == 0  # refused at the door


def test_a_2026_07_28_only_server_refuses_the_handshake_with_the_versions_it_speaks(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.configure(revisions="2026-07-28")

    async def legacy() -> None:
        async with Client(server.url + MCP_PATH, mode="legacy"):
            pass

    with pytest.raises(BaseException) as raised:
        anyio.run(legacy)
    assert "-32022" in repr(raised.value) or "Unsupported protocol version" in repr(raised.value)
    [refused] = party.wire("initialize")
    assert refused["refused"] is True


def test_the_environment_chooses_the_revisions_a_new_server_speaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOPDESK_SANDBOX_MCP_REVISIONS", "2025-11-25")
    assert MCPToolServer().revisions == "2025-11-25"
    monkeypatch.setenv("STOPDESK_SANDBOX_MCP_REVISIONS", "1999-01-01")
    with pytest.raises(ValueError, match="revisions must be one of"):
        MCPToolServer()


def test_revisions_outside_the_choices_are_refused(mcp_tools: Tools) -> None:
    party, _server = mcp_tools
    with pytest.raises(ValueError, match="revisions must be one of"):
        party.configure(revisions="2024-11-05")


def test_read_value_shows_what_slow_write_wrote(mcp_tools: Tools) -> None:
    _party, server = mcp_tools

    async def write_then_read() -> list[str]:
        async with Client(server.url + MCP_PATH) as client:
            before = await client.call_tool("read_value", {"key": "k"})
            await client.call_tool("slow_write", {"key": "k", "value": "v", "seconds": 0})
            after = await client.call_tool("read_value", {"key": "k"})
        return [getattr(r.content[0], "text", "") for r in (before, after)]

    assert anyio.run(write_then_read) == ["k: no value", "k=v"]


def test_a_read_timeout_also_interrupts_the_tool(mcp_tools: Tools) -> None:
    party, server = mcp_tools

    async def timed_out() -> int:
        async with Client(server.url + MCP_PATH, mode="legacy") as client:
            try:
                await client.session.call_tool("slow_write", {"key": "t1", "seconds": 2}, read_timeout_seconds=0.3)
            except MCPError as exc:
                return exc.code
        return 0

    assert anyio.run(timed_out) == types.REQUEST_TIMEOUT
    assert wait_until(lambda: "interrupted" in events(party, "t1"))


def test_with_ignore_cancel_a_cancelled_slow_write_still_takes_effect(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.set_fault("ignore_cancel")

    async def cancelled_call() -> float:
        async with Client(server.url + MCP_PATH, mode="legacy") as client:
            began = time.monotonic()  # the call's own wait, not the session's setup
            with anyio.move_on_after(0.2):
                await client.call_tool("slow_write", {"key": "crm-note", "value": "x", "seconds": 0.6})
            return time.monotonic() - began

    waited = anyio.run(cancelled_call)
    assert waited < 0.55  # the caller stopped waiting long before the write
    assert wait_until(lambda: party.effects() != [])
    assert party.effects()[0]["effect"] == "written"
    assert wait_until(lambda: "cancelled_after_applying" in events(party, "crm-note"))
    effects = httpx.get(server.url + "/_control/effects").json()
    assert effects["effects"][0]["call"] == "crm-note"


def test_uncancelled_calls_complete_and_are_counted(mcp_tools: Tools) -> None:
    party, server = mcp_tools

    async def calls() -> tuple[str, str]:
        async with Client(server.url + MCP_PATH) as client:
            lookup = await client.call_tool("slow_lookup", {"query": "acme", "seconds": 0.05})
            write = await client.call_tool("slow_write", {"key": "k", "value": "v", "seconds": 0.05})
        assert isinstance(lookup.content[0], types.TextContent) and isinstance(write.content[0], types.TextContent)
        return lookup.content[0].text, write.content[0].text

    lookup, write = anyio.run(calls)

    assert "acme" in lookup
    assert write == "wrote k='v'"
    assert [e["call"] for e in party.effects("slow_write")] == ["k"]
    assert party.counts.count("tools/call", "slow_write") == 1


def test_tool_call_error_fault_answers_an_error_without_running_the_tool(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.set_fault("tool_call_error", target="slow_write")

    with RawMcpSession(server.url + MCP_PATH) as session, pytest.raises(McpRpcError):
        session.request("tools/call", {"name": "slow_write", "arguments": {"key": "k", "seconds": 0}})

    assert party.journal() == []


# --- tasks over raw JSON-RPC ---------------------------------------------------------------


def test_the_tasks_capability_is_advertised_on_the_2025_11_25_handshake(mcp_tools: Tools) -> None:
    _, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session:
        capabilities = session.initialize_result["capabilities"]

    assert capabilities["tasks"]["requests"]["tools"]["call"] == {}
    assert "cancel" in capabilities["tasks"] and "list" in capabilities["tasks"]


def test_a_task_runs_to_completion_and_tasks_result_returns_the_call_result(mcp_tools: Tools) -> None:
    party, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.3, ttl=60_000)
        polled = session.request("tasks/get", {"taskId": task_id})
        result = session.request("tasks/result", {"taskId": task_id})
        final = session.request("tasks/get", {"taskId": task_id})

    assert polled["status"] == "working"
    assert polled["ttl"] == 60_000 and polled["pollInterval"] == 50
    assert result["content"][0]["text"] == "report 'q3' exported"
    assert result["isError"] is False
    assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == task_id
    assert final["status"] == "completed"
    assert [e["effect"] for e in party.effects()] == ["exported"]


def test_tasks_cancel_marks_cancelled_before_replying_and_stops_the_work(mcp_tools: Tools) -> None:
    party, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=2)
        cancelled = session.request("tasks/cancel", {"taskId": task_id})
        with pytest.raises(McpRpcError) as again:
            session.request("tasks/cancel", {"taskId": task_id})
        with pytest.raises(McpRpcError) as result:
            session.request("tasks/result", {"taskId": task_id})

    assert cancelled["status"] == "cancelled"
    assert again.value.code == -32602
    assert result.value.code == -32000
    assert wait_until(lambda: "interrupted" in events(party, task_id))
    assert party.effects() == []


def test_with_tasks_ignore_cancel_the_task_stays_cancelled_but_the_export_happens(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.set_fault("tasks_ignore_cancel")

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.3)
        assert session.request("tasks/cancel", {"taskId": task_id})["status"] == "cancelled"
        assert wait_until(lambda: party.effects() != [])
        later = session.request("tasks/get", {"taskId": task_id})
        # Read while the session is open: closing it cleans its tasks up.
        assert wait_until(lambda: [t["workFinished"] for t in party.tasks() if t["taskId"] == task_id] == [True])

    assert later["status"] == "cancelled"
    assert party.effects()[0]["call"] == task_id


def test_cancelling_a_completed_or_unknown_task_is_invalid_params(mcp_tools: Tools) -> None:
    _, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.05)
        session.request("tasks/result", {"taskId": task_id})
        codes = []
        for target in (task_id, "no-such-task"):
            with pytest.raises(McpRpcError) as error:
                session.request("tasks/cancel", {"taskId": target})
            codes.append(error.value.code)
        with pytest.raises(McpRpcError) as unknown_get:
            session.request("tasks/get", {"taskId": "no-such-task"})

    assert codes == [-32602, -32602]
    assert unknown_get.value.code == -32602


def test_a_failed_export_is_a_failed_task_whose_result_is_an_error_result(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    party.set_fault("export_fail")

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.05)
        result = session.request("tasks/result", {"taskId": task_id})
        status = session.request("tasks/get", {"taskId": task_id})["status"]

    assert result["isError"] is True
    assert status == "failed"
    assert party.effects() == []


def test_an_expired_task_is_forgotten(mcp_tools: Tools) -> None:
    _, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.05, ttl=200)
        time.sleep(0.3)
        with pytest.raises(McpRpcError) as error:
            session.request("tasks/get", {"taskId": task_id})
        listed = session.request("tasks/list")

    assert error.value.code == -32602
    assert listed["tasks"] == []


def test_task_augmenting_a_tool_without_task_support_is_method_not_found(mcp_tools: Tools) -> None:
    _, server = mcp_tools

    with RawMcpSession(server.url + MCP_PATH) as session, pytest.raises(McpRpcError) as error:
        session.request("tools/call", {"name": "slow_write", "arguments": {"key": "k"}, "task": {}})

    assert error.value.code == -32601


def test_tasks_do_not_survive_a_server_restart_but_effects_do(mcp_tools: Tools) -> None:
    party, server = mcp_tools
    with RawMcpSession(server.url + MCP_PATH) as session:
        task_id = export_task(session, seconds=0.05)
        session.request("tasks/result", {"taskId": task_id})
    port = server.port

    server.stop()
    server.start()

    assert server.port == port
    with RawMcpSession(server.url + MCP_PATH) as session, pytest.raises(McpRpcError) as error:
        session.request("tasks/get", {"taskId": task_id})
    assert error.value.code == -32602
    assert len(party.effects()) == 1


# --- tasks through the SDK session ------------------------------------------------------------


def test_the_sdk_session_can_poll_list_and_cancel_tasks_but_not_create_them(mcp_tools: Tools) -> None:
    party, server = mcp_tools

    async def via_sdk() -> tuple[str, types.GetTaskResult, types.ListTasksResult, types.CancelTaskResult]:
        async with Client(server.url + MCP_PATH, mode="legacy") as client:
            session = client.session
            # The SDK validates every tools/call answer as a CallToolResult, so the
            # CreateTaskResult of a task-augmented call is rejected on the client side...
            with pytest.raises(ValidationError):
                await session.send_request(
                    types.CallToolRequest(
                        params=types.CallToolRequestParams(name="export_report", task=types.TaskMetadata(ttl=1000))
                    ),
                    types.CreateTaskResult,
                )
            # ...so the task is created through the session's dispatcher, in this same session
            # (tasks belong to the session that created them).
            created = await session._dispatcher.send_raw_request(
                "tools/call", {"name": "export_report", "arguments": {"seconds": 2}, "task": {}}, {"timeout": 5}
            )
            task_id = created["task"]["taskId"]
            got = await session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
            )
            listed = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            cancelled = await session.send_request(
                types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult
            )
            return task_id, got, listed, cancelled

    task_id, got, listed, cancelled = anyio.run(via_sdk)

    assert got.status == "working"
    # The rejected call was still answered by the server: it created a task too.
    assert len(listed.tasks) == 2 and task_id in [t.task_id for t in listed.tasks]
    assert cancelled.status == "cancelled"
    assert wait_until(lambda: "interrupted" in events(party, task_id))


def test_a_task_is_unknown_on_another_session_and_cleaned_up_with_its_own(mcp_tools: Tools) -> None:
    """As server-everything does: tasks are per session; closing the session ends them."""
    party, server = mcp_tools
    with RawMcpSession(server.url + MCP_PATH) as creator:
        task_id = export_task(creator, seconds=3)
        with RawMcpSession(server.url + MCP_PATH) as other:
            for method in ("tasks/get", "tasks/cancel", "tasks/result"):
                with pytest.raises(McpRpcError) as error:
                    other.request(method, {"taskId": task_id})
                assert error.value.code == -32602 and "not found" in error.value.message
            assert other.request("tasks/list", {})["tasks"] == []
        assert creator.request("tasks/get", {"taskId": task_id})["status"] == "working"
    # The creating session was deleted: the task is gone, its work stopped.
    assert wait_until(lambda: "interrupted" in events(party, task_id))
    assert party.tasks() == []
    assert [t["taskId"] for t in party.task_registry.cleaned_up] == [task_id]
