"""The stdio shim, a real process (`python -m stopdesk mcp-stdio -- <server command>`) that the MCP
Python SDK's stdio client starts, as a client's config would: it starts the server itself (a small
SDK server behind a tee that records every JSON-RPC line it receives), records each call as an
item of the shim's task, and Stop from another process ends the call upstream."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.db import connection
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

from reconcile.mechanisms.mcp import sandbox
from reconcile.mechanisms.mcp.sandbox import MCPToolServer
from stopdesk.gateway.server import STOPPED
from stopdesk.models import Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.gateway.stdio_upstream import READ_VALUE, SLOW_LOOKUP, SLOW_WRITE
from tests.run.helpers import PYTHON, ROOT, clean_env

S = ItemState
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
CLIENT = Implementation(name="test-desktop", version="3.2")
NAME = "notes"  # the upstream's name, as the client's config gives it with --name


@dataclass
class Shim:
    env: dict[str, str]
    wire_path: Path  # every JSON-RPC line the upstream received or sent, from the tee
    journal_path: Path  # the upstream's own record of its tools' starts, ends and interruptions

    def argv(self, *options: str) -> list[str]:
        upstream = [PYTHON, "-m", "tests.gateway.stdio_upstream", str(self.journal_path)]
        tee = [PYTHON, "-m", "tests.reference_servers.tee", str(self.wire_path), "--", *upstream]
        return ["-m", "stopdesk", "mcp-stdio", "--name", NAME, *options, "--", *tee]

    def run(self, body: Callable[[Client], Awaitable[Any]], *options: str, mode: str = "auto") -> Any:
        """`body` with an SDK client connected to a shim it started, as a client's config would."""
        params = StdioServerParameters(command=PYTHON, args=self.argv(*options), env=self.env, cwd=ROOT)

        async def main() -> Any:
            async with Client(stdio_client(params), mode=mode, client_info=CLIENT, read_timeout_seconds=30.0) as client:  # type: ignore[arg-type]
                return await body(client)

        try:
            return anyio.run(main)
        except BaseExceptionGroup as group:  # the transport's task groups wrap what the call raised
            raise leaf(group) from None

    def received(self, method: str) -> list[dict[str, Any]]:
        """The messages of `method` the upstream received (every upstream process the shim started)."""
        if not self.wire_path.exists():
            return []
        lines = [json.loads(line) for line in self.wire_path.read_text().splitlines()]
        return [line["msg"] for line in lines if line["dir"] == "in" and line["msg"].get("method") == method]

    def upstream_processes(self) -> set[int]:
        """The upstream processes the shim started (each behind a tee of its own)."""
        if not self.wire_path.exists():
            return set()
        return {json.loads(line)["pid"] for line in self.wire_path.read_text().splitlines()}

    def journal(self) -> list[tuple[str, str]]:
        if not self.journal_path.exists():
            return []
        return [(e["event"], e["tool"]) for e in map(json.loads, self.journal_path.read_text().splitlines())]


def leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@pytest.fixture
def shim(pg_dsn, tmp_path: Path) -> Shim:
    env = clean_env(tmp_path, DATABASE_URL=pg_dsn, LOG_LEVEL="WARNING")
    return Shim(env=env, wire_path=tmp_path / "wire.jsonl", journal_path=tmp_path / "journal.jsonl")


def stop_once_started(shim: Shim, tool: str, reason: str = "wrong notebook") -> threading.Thread:
    """Press Stop (as the dashboard would, from another process's point of view) once the
    upstream has started the tool."""

    def press() -> None:
        deadline = time.monotonic() + 20
        while ("started", tool) not in shim.journal() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            task_request_stop(
                task_id=Task.objects.get().pk, actor="user:operator", reason=reason, dispatch=lambda ids: None
            )
        finally:
            connection.close()

    thread = threading.Thread(target=press)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_call_through_the_shim_is_an_item_of_its_task(shim, mode):
    result = shim.run(lambda c: c.call_tool(READ_VALUE, {"key": "k"}), mode=mode)
    assert not result.is_error and result.content[0].text == "read_value done"
    (item,) = WorkItem.objects.all()
    assert item.state == S.COMPLETED
    assert item.task.title == f"MCP: test-desktop 3.2 via {NAME}"
    assert item.detail["gateway"]["upstream"] == NAME and item.detail["gateway"]["tool"] == READ_VALUE
    assert item.detail["gateway"]["client_revision"] == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    mcp = item.detail["mcp"]
    assert (mcp["server"], mcp["tool"], mcp["transport"], mcp["configured"]) == (NAME, READ_VALUE, "stdio", False)
    assert mcp["revision"] == "2026-07-28"  # upstream: the newest revision the server offers
    assert mcp["cancel_wire"] == "notifications/cancelled"
    assert len(shim.received("tools/call")) == 1


def test_tools_list_is_forwarded_and_every_call_goes_to_one_task(shim):
    async def body(client: Client) -> set[str]:
        listing = await client.list_tools()
        await client.call_tool(READ_VALUE, {"key": "a"})
        await client.list_tools()
        await client.call_tool(READ_VALUE, {"key": "b"})
        return {tool.name for tool in listing.tools}

    assert shim.run(body) == {READ_VALUE, SLOW_LOOKUP, SLOW_WRITE}
    assert Task.objects.count() == 1 and WorkItem.objects.filter(task=Task.objects.get()).count() == 2
    # Two server processes in all: one kept for listings, one for the session's calls; not one
    # started per tools/list.
    assert len(shim.upstream_processes()) == 2


def test_the_task_option_files_the_calls_under_an_existing_task(shim):
    task = make_task()
    shim.run(lambda c: c.call_tool(READ_VALUE, {"key": "k"}), "--task", str(task.pk))
    assert list(WorkItem.objects.values_list("task_id", flat=True)) == [task.pk]


@pytest.mark.parametrize(("tool", "ends"), [(SLOW_WRITE, S.UNCERTAIN), (SLOW_LOOKUP, S.CANCELLED)])
def test_stop_during_a_call_cancels_it_upstream_and_a_later_call_is_refused_unsent(shim, tool, ends):
    answers: list[BaseException] = []

    async def body(client: Client) -> None:
        presser = stop_once_started(shim, tool)
        try:
            for name, arguments in ((tool, {"key": "k", "seconds": 20}), (READ_VALUE, {"key": "k"})):
                with pytest.raises(MCPError) as raised:
                    await client.call_tool(name, arguments)
                answers.append(raised.value)
        finally:
            await anyio.to_thread.run_sync(presser.join)

    began = time.monotonic()
    shim.run(body)
    assert time.monotonic() - began < 15  # answered at Stop, not after the tool's 20 s
    assert len(answers) == 2  # the call Stop ended, and the call after it
    for answer in answers:
        assert answer.error.code == STOPPED and str(answer) == "stopped by user:operator: wrong notebook"
    # The upstream heard the cancel, naming its own request id of the call, and its tool stopped.
    (call,) = shim.received("tools/call")
    assert call["params"]["name"] == tool
    cancels = [c for c in shim.received("notifications/cancelled") if c["params"]["requestId"] == call["id"]]
    assert len(cancels) == 1
    assert ("interrupted", tool) in shim.journal() and ("finished", tool) not in shim.journal()
    # The call after Stop was refused and never sent: the upstream saw only the first call, and
    # no other server process was started for it (nor for listings: the call took that one over).
    assert len(shim.upstream_processes()) == 1
    states = dict(WorkItem.objects.values_list("detail__gateway__tool", "state"))
    assert states == {tool: ends, READ_VALUE: S.CANCELLED}
    # The upstream's id of the call is on the record, as the upstream saw it.
    stopped = WorkItem.objects.get(detail__gateway__tool=tool)
    assert stopped.detail["gateway"]["upstream_request_id"] == call["id"]


def shim_exits(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The shim run with `args`, for the command lines it refuses before serving anyone."""
    return subprocess.run(
        [PYTHON, "-m", "stopdesk", "mcp-stdio", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_command_line_missing_its_server_command_exits_2_with_one_line(shim):
    for args, says in [
        (["--name", "x", "--"], "stopdesk-mcp: no server command after --"),
        (["my-server"], "stopdesk-mcp: put the server's command after --: stopdesk-mcp -- my-server"),
        (["--task", "soon", "--", "my-server"], "stopdesk-mcp: --task needs a task number, not 'soon'"),
        (["--task", "999999", "--", "my-server"], "stopdesk-mcp: --task 999999: there is no such task"),
    ]:
        done = shim_exits(args, shim.env)
        assert (done.returncode, done.stdout) == (2, ""), args
        assert done.stderr.splitlines()[0] == says


def test_a_database_that_does_not_answer_is_one_line(shim):
    done = shim_exits(["--", "my-server"], {**shim.env, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/nothing"})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("stopdesk-mcp: cannot reach the database at postgres://postgres@127.0.0.1:1/nothing")


def test_a_configured_server_is_reached_by_its_name_alone_also_over_streamable_http(shim, tmp_path):
    party = MCPToolServer()
    with BackgroundServer(party.app, name="mcp") as upstream:
        config = tmp_path / "stopdesk.toml"
        config.write_text(f'[mcp.servers.research]\nurl = "{upstream.url}/mcp"\n')
        shim.env["STOPDESK_CONFIG_FILE"] = str(config)
        params = StdioServerParameters(
            command=PYTHON, args=["-m", "stopdesk", "mcp-stdio", "--name", "research"], env=shim.env, cwd=ROOT
        )

        async def main() -> Any:
            async with Client(stdio_client(params), client_info=CLIENT) as client:  # type: ignore[arg-type]
                return await client.call_tool(sandbox.READ_VALUE, {"key": "k"})

        assert not anyio.run(main).is_error
    item = WorkItem.objects.get()
    assert (item.state, item.task.title) == (S.COMPLETED, "MCP: test-desktop 3.2 via research")
    assert (item.detail["mcp"]["transport"], item.detail["mcp"]["configured"]) == ("streamable_http", True)
    assert len(party.wire("tools/call")) == 1


def test_a_configured_name_with_another_command_is_refused(shim, tmp_path):
    config = tmp_path / "stopdesk.toml"
    config.write_text('[mcp.servers.git]\ncommand = "mcp-server-git"\n')
    done = shim_exits(["--name", "git", "--", "some-other-server"], {**shim.env, "STOPDESK_CONFIG_FILE": str(config)})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("stopdesk-mcp: the MCP server 'git' is configured with another command")
