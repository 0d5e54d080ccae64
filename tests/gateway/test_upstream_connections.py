"""The gateway keeps a session's upstream connection across its calls: one handshake and one
`tools/list` for many calls, and a call that Stop ends runs on it like any other (or, forwarded
as it came, on no session connection at all). A connection left idle is closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.mechanisms.mcp.servers import resolve
from stopdesk.gateway.server import STOPPED
from stopdesk.gateway.upstreams import UpstreamConnections
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.gateway.conftest import answers_recorded
from tests.gateway.test_gateway_calls import stop_once_started, through_gateway

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
HANDSHAKES = ("server/discover", "initialize")  # how a new upstream connection begins, per revision


def handshakes(party: tools.MCPToolServer) -> int:
    return sum(len(party.wire(method)) for method in HANDSHAKES)


def listing_first(tool: str, arguments: dict[str, Any]) -> Callable[[Client], Awaitable[Any]]:
    async def body(client: Client) -> Any:
        await client.list_tools()
        return await client.call_tool(tool, arguments)

    return body


async def list_then_call_three_times(client: Client) -> list[Any]:
    await client.list_tools()  # so the client does not list again after its first call
    return [await client.call_tool(tools.READ_VALUE, {"key": f"k{n}"}) for n in range(3)]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_sessions_calls_share_one_upstream_connection(gateway, mode):
    task = make_task()
    results = through_gateway(gateway.url, list_then_call_three_times, mode=mode, task_id=task.pk)
    assert [r.is_error for r in results] == [False, False, False]
    assert len(gateway.party.wire("tools/call")) == 3
    # The client's tools/list is forwarded on the connection kept for listings. Through the SDK
    # (2025-11-25), the first call takes that connection over for its session (it had none) and the
    # three calls share it; forwarded (2026-07-28), the calls are stateless requests that need no
    # connection of their own. So one handshake and one listing in all, either way. Opened per
    # call, it would have been four of each.
    assert handshakes(gateway.party) == 1
    assert len(gateway.party.wire("tools/list")) == 1
    answers_recorded()
    assert set(WorkItem.objects.values_list("state", flat=True)) == {ItemState.COMPLETED}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_call_stop_ends_runs_on_the_kept_connection_and_nothing_follows_it(gateway, mode):
    """A 2025-11-25 client's calls go through the SDK, on the session's kept connection; a
    2026-07-28 client's are forwarded as they came, each its own request, and open no session
    connection at all (the connection kept for listings is the only one)."""
    forwarded = mode == "auto"
    task = make_task()
    read = listing_first(tools.READ_VALUE, {"key": "k"})
    through_gateway(gateway.url, read, mode=mode, task_id=task.pk)
    assert handshakes(gateway.party) == 1  # the client's listing's, which a session's call took over
    pressing = stop_once_started(gateway.party, tools.SLOW_LOOKUP, task.pk)
    with pytest.raises(MCPError) as raised:
        through_gateway(
            gateway.url,
            listing_first(tools.SLOW_LOOKUP, {"query": "q", "seconds": 5}),
            mode=mode,
            task_id=task.pk,
        )
    pressing.join()
    assert raised.value.error.code == STOPPED
    # Through the SDK, one new connection, for listings again: the stopped call ran on the
    # session's kept one, which the Stop closed. Forwarded, the listing connection was never lent.
    assert handshakes(gateway.party) == (1 if forwarded else 2)
    # After the Stop the task's calls are refused as they are registered, before any upstream
    # connection is taken: only the client's own listing reaches the upstream, on its connection.
    with pytest.raises(MCPError) as refused:
        through_gateway(gateway.url, read, mode=mode, task_id=task.pk)
    assert refused.value.error.code == STOPPED
    assert handshakes(gateway.party) == (1 if forwarded else 2)
    assert len(gateway.party.wire("tools/list")) == 3  # the client's three listings, nothing more
    assert len(gateway.party.wire("tools/call")) == 2


def test_a_connection_left_idle_is_closed_and_the_next_call_opens_another():
    party = tools.MCPToolServer()
    with BackgroundServer(party.app, name="mcp") as upstream:
        spec = resolve(upstream.url + "/mcp", {})
        connections = UpstreamConnections(spec, timeout_s=10.0, idle_close_s=0.2)

        async def lend_twice_with_a_pause() -> tuple[bool, bool]:
            async with connections.running():
                async with connections.lend(1) as first:
                    await first.list_tools()
                async with connections.lend(1) as again:  # given back just now: the same one
                    same = again is first
                await anyio.sleep(0.6)  # longer than idle_close_s (and its check's period)
                async with connections.lend(1) as later:
                    await later.list_tools()
                    return same, later is first

        same, reused_after_idle = anyio.run(lend_twice_with_a_pause)
    assert same and not reused_after_idle
    assert handshakes(party) == 2
