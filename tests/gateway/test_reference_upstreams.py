"""The gateway in front of upstreams no one here wrote: the official server-everything over
Streamable HTTP (it speaks 2025-11-25 only: the gateway falls back) and over stdio, and mcp-server-git over stdio
(a Python SDK server: the gateway keeps the process and its session across calls). The client is
the MCP Python SDK's, in both revisions. Each test checks what the upstream received (a recording
proxy or tee), what the client was told and how the item ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from mcp import Client
from mcp.shared.exceptions import MCPError

from stopdesk.gateway.app import gateway_app
from stopdesk.gateway.server import STOPPED
from stopdesk.models import WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.gateway.test_gateway_calls import MODES, through_gateway
from tests.reconcile.conftest import clock, configure_mcp_server, everything_party, git_repo, git_server
from tests.reconcile.helpers import sweep_until_settled
from tests.reference_servers import EVERYTHING_JS, git_log, read_wire, slow_pre_commit, tee_command

__all__ = ["clock", "everything_party", "git_repo", "git_server"]

S = ItemState
REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.reference_servers]


@pytest.fixture
def timings(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "mcp": {
            "call_timeout_s": 10.0,
            "deadline_s": 10.0,
            "backoff_initial_s": 0.5,
            "recheck_interval_s": 0.5,
            "options": {"after_cancel_s": 0.5},
        }
    }


def press_stop_when(condition: Any, task_id: int, reason: str = "enough") -> threading.Thread:
    def press() -> None:
        deadline = time.monotonic() + 30
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            task_request_stop(task_id=task_id, actor="user:operator", reason=reason, dispatch=lambda ids: None)
        finally:
            connection.close()

    thread = threading.Thread(target=press)
    thread.start()
    return thread


def gateway_for(settings, name: str, **server: object) -> Iterator[str]:  # type: ignore[no-untyped-def]
    configure_mcp_server(settings, name, **server)
    with BackgroundServer(lambda: gateway_app(poll_s=5.0), name="gateway") as started:
        yield f"{started.url}/mcp/{name}"


@pytest.fixture
def everything_gateway(settings, timings, everything_party) -> Iterator[tuple[Any, str]]:  # type: ignore[no-untyped-def]
    _server, wire, url = everything_party
    for front_url in gateway_for(settings, "everything", url=url):
        yield wire, front_url


@pytest.fixture
def git_gateway(settings, timings, git_server) -> Iterator[tuple[Path, str]]:  # type: ignore[no-untyped-def]
    for front_url in gateway_for(settings, "git", **git_server["config"]):  # type: ignore[arg-type]
        yield git_server["wire"], front_url  # type: ignore[misc]


def stop_during_the_long_operation_then_echo(url: str, mode: str, task_id: int, calls: Any) -> None:
    """server-everything's long operation through the gateway, Stop pressed once the upstream has
    it, then `echo`: the client is told at Stop (not after the 10 s operation), and the echo is
    refused with the Stop's words."""
    presser = press_stop_when(lambda: calls(), task_id)

    async def long_then_echo(client: Client) -> Any:
        with pytest.raises(MCPError) as stopped:
            await client.call_tool("trigger-long-running-operation", {"duration": 10, "steps": 5})
        assert stopped.value.error.code == STOPPED
        await client.call_tool("echo", {"message": "after stop"})

    began = time.monotonic()
    with pytest.raises(MCPError, match=r"^stopped by user:operator: enough$"):
        through_gateway(url, long_then_echo, mode=mode, task_id=task_id)
    presser.join()
    assert time.monotonic() - began < 8


@pytest.fixture
def everything_stdio_gateway(settings, timings, tmp_path) -> Iterator[tuple[Path, str]]:  # type: ignore[no-untyped-def]
    """server-everything over stdio (its default transport), behind the recording tee."""
    wire = tmp_path / "everything-wire.jsonl"
    command, args = tee_command(wire, "node", str(EVERYTHING_JS), "stdio")
    for front_url in gateway_for(settings, "everything", command=command, args=args, cwd=str(REPO)):
        yield wire, front_url


@pytest.mark.parametrize("mode", MODES)
def test_stop_during_server_everythings_long_operation_over_stdio_cancels_it_by_its_upstream_id(
    everything_stdio_gateway, mode
):
    """The same Stop with server-everything as a stdio upstream: the gateway sends
    `notifications/cancelled` down the server's stdin, naming the id the server saw; the call
    after Stop is refused and never written to the server."""
    wire, url = everything_stdio_gateway
    task = make_task()
    calls = lambda: [  # noqa: E731
        m
        for m in read_wire(wire)
        if m["dir"] == "in"
        and m["msg"].get("method") == "tools/call"
        and m["msg"]["params"]["name"].startswith("trigger")
    ]
    stop_during_the_long_operation_then_echo(url, mode, task.pk, calls)
    [call] = calls()
    received = [m["msg"] for m in read_wire(wire) if m["dir"] == "in"]
    [cancelled] = [m for m in received if m.get("method") == "notifications/cancelled"]
    assert cancelled["params"]["requestId"] == call["msg"]["id"]  # the upstream's id, not the client's
    assert [m["params"]["name"] for m in received if m.get("method") == "tools/call"] == [
        "trigger-long-running-operation"
    ]
    items = {item.detail["gateway"]["tool"]: item for item in WorkItem.objects.filter(task=task)}
    operation = items["trigger-long-running-operation"]
    assert (operation.detail["mcp"]["transport"], operation.detail["mcp"]["cancel_wire"]) == (
        "stdio",
        "notifications/cancelled",
    )
    assert operation.detail["gateway"]["upstream_request_id"] == call["msg"]["id"]
    assert operation.detail["mcp"]["revision"] == "2025-11-25"  # server-everything refused 2026-07-28
    assert operation.state == S.CANCELLED  # server-everything says it is read-only
    assert items["echo"].state == S.CANCELLED  # refused at the boundary, never sent


@pytest.mark.parametrize("mode", MODES)
def test_stop_during_server_everythings_long_operation_cancels_it_by_its_upstream_id(everything_gateway, mode):
    wire, url = everything_gateway
    task = make_task()
    calls = lambda: [m for m in wire.received("tools/call") if m["msg"]["params"]["name"].startswith("trigger")]  # noqa: E731
    stop_during_the_long_operation_then_echo(url, mode, task.pk, calls)
    [call] = calls()
    [cancelled] = wire.received("notifications/cancelled")
    assert cancelled["msg"]["params"]["requestId"] == call["msg"]["id"]  # the upstream's id, not the client's
    assert [m["msg"]["params"]["name"] for m in wire.received("tools/call")] == ["trigger-long-running-operation"]
    items = {item.detail["gateway"]["tool"]: item for item in WorkItem.objects.filter(task=task)}
    operation = items["trigger-long-running-operation"]
    assert operation.detail["mcp"]["revision"] == "2025-11-25"  # server-everything refused 2026-07-28
    assert operation.state == S.CANCELLED  # server-everything says it is read-only
    assert operation.evidence["cancel"]["request_id"] == call["msg"]["id"]
    assert items["echo"].state == S.CANCELLED  # refused at the boundary, never sent


def test_stop_during_a_git_commit_through_the_gateway_is_settled_by_git_log(git_gateway, git_repo, clock):
    """A stdio upstream: the commit is in its pre-commit hook when Stop comes; the gateway sends
    notifications/cancelled with the upstream's id, the client is told, and the commit lands anyway
    (mcp-server-git cannot stop a hook): uncertain, then completed by git_log, never "stopped"."""
    wire, url = git_gateway
    slow_pre_commit(git_repo, 3.0)
    message = f"gateway commit {time.time_ns()}"
    task = make_task()
    commits = lambda: [  # noqa: E731
        m for m in read_wire(wire) if m["dir"] == "in" and m["msg"].get("method") == "tools/call"
    ]
    presser = press_stop_when(lambda: commits() and time.sleep(0.5) is None, task.pk)
    with pytest.raises(MCPError, match=r"^stopped by user:operator: enough$"):
        through_gateway(
            url,
            lambda c: c.call_tool("git_commit", {"repo_path": str(git_repo), "message": message}),
            mode="auto",
            task_id=task.pk,
        )
    presser.join()
    item = WorkItem.objects.get(task=task)
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.detail["mcp"]["transport"] == "stdio" and item.detail["mcp"]["cancel_wire"] == "notifications/cancelled"
    [call] = commits()
    seen = read_wire(wire)
    [cancelled] = [m for m in seen if m["msg"].get("method") == "notifications/cancelled"]
    assert cancelled["msg"]["params"]["requestId"] == call["msg"]["id"]
    # The upstream's id of the call, as the stdio server saw it, is on the record too.
    assert item.detail["gateway"]["upstream_request_id"] == call["msg"]["id"]
    assert item.evidence["cancel"]["request_id"] == call["msg"]["id"]
    deadline = time.monotonic() + 15
    while not git_log(git_repo) or git_log(git_repo)[0] != message:  # the hook ends, the commit lands
        assert time.monotonic() < deadline, "the commit never landed"
        time.sleep(0.1)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed; git_log shows it took effect"
