"""The gateway driven by MCP clients no one here wrote: the official TypeScript SDK's, from a small
node script (`tests/reference_servers/ts_client.mjs`): v1 (`@modelcontextprotocol/sdk`), which
speaks 2025-11-25 with its handshake and session, and v2 (`@modelcontextprotocol/client`) asked
for `auto`, which negotiates 2026-07-28 (no session; a cancel is a closed stream). Each scenario
checks what the client was told, what the upstream received and how the item ended."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

import pytest
from django.db import connection

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.gateway.server import HELD, STOPPED
from stopdesk.models import Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from tests.factories import make_task
from tests.gateway.conftest import answers_recorded
from tests.reference_servers import TS_CLIENT

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.reference_servers]


# (SDK, its mode, the revision it ends up speaking to the gateway, the client's name and version)
CLIENTS = {
    "v1": ("v1", "legacy", "2025-11-25", "ts-sdk-test-client 1.32.2"),
    "v2-auto": ("v2", "auto", "2026-07-28", "ts-sdk-v2-test-client 2.3.1"),
}


@pytest.fixture(params=sorted(CLIENTS))
def sdk(request: pytest.FixtureRequest) -> tuple[str, str, str, str]:
    return CLIENTS[request.param]


def ts_client(
    url: str, steps: list[dict[str, Any]], sdk: tuple[str, str, str, str], *, task_id: int | None = None
) -> list[dict[str, Any]]:
    """Run the node client through the gateway; its JSON lines, the connection's first."""
    headers = {"X-Stopdesk-Task": str(task_id)} if task_id is not None else {}
    done = subprocess.run(
        ["node", str(TS_CLIENT), url, json.dumps(steps), json.dumps(headers), sdk[0], sdk[1]],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def press_stop_once_started(party: tools.MCPToolServer, tool: str, task_id: int) -> threading.Thread:
    def press() -> None:
        deadline = time.monotonic() + 30
        while not any(e["event"] == "started" for e in party.journal(tool)) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            task_request_stop(task_id=task_id, actor="user:operator", reason="wrong branch", dispatch=lambda ids: None)
        finally:
            connection.close()

    thread = threading.Thread(target=press)
    thread.start()
    return thread


def test_the_typescript_client_lists_and_calls_through_the_gateway_on_a_task_of_its_own(gateway, sdk):
    _, _, revision, client = sdk
    steps = [{"list": True}, {"call": tools.READ_VALUE, "arguments": {"key": "k"}}]
    ready, listing, call = ts_client(gateway.url, steps, sdk)
    assert ready["protocolVersion"] == revision
    # 2025-11-25: the gateway gave the session an Mcp-Session-Id; 2026-07-28 has no sessions.
    assert bool(ready["sessionId"]) == (revision == "2025-11-25")
    assert {tools.READ_VALUE, tools.SLOW_WRITE, tools.SLOW_LOOKUP} <= set(listing["result"])
    assert call["ok"] and not call["result"].get("isError")
    answers_recorded()
    item = WorkItem.objects.get()
    assert item.state == S.COMPLETED
    assert item.detail["gateway"]["client_revision"] == revision
    assert item.detail["mcp"]["transport"] == "streamable_http"
    assert Task.objects.get().title == f"MCP: {client} via sandbox"
    assert [m["tool"] for m in gateway.party.wire("tools/call")] == [tools.READ_VALUE]


def test_stop_during_a_typescript_clients_long_call_answers_it_and_refuses_the_next(gateway, sdk):
    task = make_task()
    presser = press_stop_once_started(gateway.party, tools.SLOW_LOOKUP, task.pk)
    began = time.monotonic()
    _, stopped, refused = ts_client(
        gateway.url,
        [
            {"call": tools.SLOW_LOOKUP, "arguments": {"query": "q", "seconds": 20}},
            {"call": tools.SLOW_WRITE, "arguments": {"key": "k", "value": "v", "seconds": 0.1}},
        ],
        sdk,
        task_id=task.pk,
    )
    presser.join()
    assert time.monotonic() - began < 15  # told at Stop, not after the lookup's 20 s
    for answer in (stopped, refused):
        assert answer["ok"] is False and answer["code"] == STOPPED
        assert "stopped by user:operator: wrong branch" in answer["message"]
    # The lookup was cancelled upstream; the write never reached it.
    assert [m["tool"] for m in gateway.party.wire("tools/call")] == [tools.SLOW_LOOKUP]
    assert "interrupted" in [e["event"] for e in gateway.party.journal(tools.SLOW_LOOKUP)]
    states = {item.detail["gateway"]["tool"]: item.state for item in WorkItem.objects.filter(task=task)}
    assert states == {tools.SLOW_LOOKUP: S.CANCELLED, tools.SLOW_WRITE: S.CANCELLED}


def test_a_typescript_client_that_cancels_a_write_and_sends_it_again_is_held_by_the_gate(gateway, sdk):
    """The SDK's AbortSignal sends notifications/cancelled; the write may have landed, so the same
    call sent again is not forwarded until someone knows."""
    write = {"call": tools.SLOW_WRITE, "arguments": {"key": "k7", "value": "v7", "seconds": 2}}
    _, cancelled, again = ts_client(gateway.url, [{**write, "abort_ms": 700}, write], sdk)
    assert cancelled["ok"] is False and "the user cancelled" in cancelled["message"]
    assert again["ok"] is False and again["code"] == HELD
    # Held while the earlier call was running (the SDK sends the retry before the gateway has
    # recorded the cancel) or once it was uncertain: either way, not sent. The cancel's record
    # may land after the client is done (its notification has no answer): wait for it.
    answers_recorded()
    [item] = WorkItem.objects.all()  # the repeat was neither recorded nor sent
    assert f"identical call (item {item.pk}, " in again["message"]
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["cancelled_by"] == "the client"
    assert len(gateway.party.wire("tools/call")) == 1
    assert gateway.party.effects(tools.SLOW_WRITE) == []
