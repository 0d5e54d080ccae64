"""An MCP client's session, seen and stopped in the dashboard as a person would: the session is a
task named after the client and its server; while its tool call is in flight the operator opens
it from the task list, reads it, types a reason and presses Stop. The client is told who stopped
it and why, the upstream's call is cancelled, and the page says what happened."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.models import Task, WorkItem
from stopdesk.states import ItemState
from tests.gateway.conftest import fast, gateway, upstream_config
from tests.gateway.test_gateway_calls import started, through_gateway

__all__ = ["fast", "gateway", "upstream_config"]

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 120
TITLE = "MCP: test-client 9.1 via sandbox"


def client_in_a_thread(url: str) -> dict[str, Any]:
    """The client reads once, then starts a long lookup; what it is told lands in the dict."""
    outcome: dict[str, Any] = {}

    async def body(client: Client) -> None:
        await client.call_tool(tools.READ_VALUE, {"key": "k"})
        await client.call_tool(tools.SLOW_LOOKUP, {"query": "quarterly figures", "seconds": 60})

    def run() -> None:
        try:
            outcome["result"] = through_gateway(url, body, mode="auto")
        except MCPError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_a_person_finds_an_mcp_clients_session_and_stops_it_mid_call(live_server, operator_page, gateway, eager, shots):
    page = operator_page
    client = client_in_a_thread(gateway.url)
    deadline = time.monotonic() + 20
    while not started(gateway.party, tools.SLOW_LOOKUP):
        assert time.monotonic() < deadline, "the client's call never reached the upstream"
        time.sleep(0.05)

    page.goto(f"{live_server.url}/tasks/")
    page.get_by_role("link", name=TITLE).click()
    page.get_by_role("heading", name=TITLE).wait_for()
    page.wait_for_timeout(1500)  # a person reads the page: one call done, one in flight
    assert page.get_by_text("sandbox: slow_lookup").first.is_visible()
    session = page.locator("#gateway-session").inner_text()
    assert session == (
        "An MCP client's session through the gateway · the client speaks MCP 2026-07-28 · "
        "server sandbox, reached over streamable http in 2026-07-28"
    )
    page.screenshot(path=str(shots / "gateway-session-running.png"), full_page=True)

    page.get_by_role("link", name="Stop…").click()
    page.get_by_role("heading", name="Stop this task?").wait_for()
    page.get_by_label("Reason").press_sequentially("Wrong repository", delay=KEY_DELAY_MS)
    page.wait_for_timeout(1200)
    page.get_by_role("button", name="Stop the task").click()
    page.locator("#stop-state", has_text=re.compile("Stopping|Stopped")).wait_for()

    client["thread"].join(20)
    assert "result" not in client
    assert str(client["error"]) == "stopped by operator: Wrong repository"
    assert "interrupted" in [e["event"] for e in gateway.party.journal(tools.SLOW_LOOKUP)]
    task = Task.objects.get(title=TITLE)
    states = {item.detail["gateway"]["tool"]: item.state for item in WorkItem.objects.filter(task=task)}
    assert states == {tools.READ_VALUE: ItemState.COMPLETED, tools.SLOW_LOOKUP: ItemState.CANCELLED}
    page.locator("#summary", has_text="Stopped new work.").wait_for(timeout=15000)
    page.screenshot(path=str(shots / "gateway-session-stopped.png"), full_page=True)
