"""The MCP Stop gateway: what it adds to a `tools/call`, and how soon Stop reaches the upstream.
The gateway runs as deployed, in its own process (`python -m stopdesk mcp-gateway`); the client,
the upstream (the sandbox MCP server) and the bare hop below share the benchmark's process.

- `gateway.added_ms.p50/p99`: a `read_value` call through the gateway minus the same call made
  directly to the upstream (the sandbox MCP server), both from the SDK client over one session,
  percentile against percentile.
- `gateway.added_ms.write.p50/p99`: the same for a `slow_write` (a new key each call, no wait):
  a call that may write is recorded before its client hears the answer (the retry gate reads it),
  a read just after (`stopdesk.gateway.retry_gate.answer_may_follow_reply`).
- `gateway.sdk_hop_ms.p50/p99`: the same call through a bare forwarding server built from the
  SDK's parts (a low-level `Server` on Streamable HTTP whose `tools/call` is the SDK client's call
  on one kept connection) and no ledger, in the benchmark's process, minus the direct call: what
  any MCP proxy written on this SDK adds before it records anything, measured in the same run.
- `gateway.stop_to_upstream_cancel_ms.p50/p99`: SESSIONS clients (200; `BENCH_GATEWAY_SESSIONS`),
  each on its own task with a `slow_lookup` in flight; each task is stopped in turn (in the
  benchmark's process: the Stop reaches the gateway through PostgreSQL's notifications), and the
  time runs from the Stop being pressed to the upstream seeing its call interrupted.
- `gateway.idle_queries_per_s`: the bench database's transactions (counted by PostgreSQL, as in
  `bench_watch_idle`) while the gateway sits idle after the calls above, holding their kept
  upstream connections and its ledger threads' connections.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from typing import Any

import anyio
import httpx2

from bench.harness import Figure

CALLS = 60
ROUNDS = 3
SESSIONS = int(os.environ.get("BENCH_GATEWAY_SESSIONS", "200"))
LOOKUP_S = 120  # the calls in flight outlast starting all the sessions


def run() -> list[Figure]:
    from django.db import connections

    from bench.deployed import gateway_process
    from reconcile.mechanisms.mcp.sandbox import MCPToolServer
    from stopdrill.sandbox.server import BackgroundServer

    party = MCPToolServer(default_seconds=float(LOOKUP_S))
    try:
        with BackgroundServer(party.app, name="mcp") as upstream:
            # A stopped call's connection is not kept for the progress that follows (evidence).
            config = f'[mechanisms.mcp]\nafter_cancel_s = 0.01\n[mcp.servers.sandbox]\nurl = "{upstream.url}/mcp"\n'
            with (
                gateway_process(config) as front,
                BackgroundServer(lambda: _bare_hop(upstream.url + "/mcp"), name="hop") as hop,
            ):
                direct, bare, through, direct_writes, writes = [], [], [], [], []
                for _ in range(ROUNDS):  # alternating, so a busy moment falls on all of them
                    direct += _call_times(upstream.url + "/mcp")
                    bare += _call_times(hop.url + "/mcp")
                    through += _call_times(front + "/mcp/sandbox")
                    direct_writes += _call_times(upstream.url + "/mcp", "slow_write")
                    writes += _call_times(front + "/mcp/sandbox", "slow_write")
                idle = _idle_queries_per_s(connections["default"].settings_dict["NAME"])
                stops = _stop_to_cancel(party, front + "/mcp/sandbox")
    finally:
        connections.close_all()
    return [
        Figure("gateway.added_ms.p50", statistics.median(through) - statistics.median(direct), "ms", target=2.0),
        Figure("gateway.added_ms.p99", _p99(through) - _p99(direct), "ms", target=10.0),
        Figure("gateway.added_ms.write.p50", statistics.median(writes) - statistics.median(direct_writes), "ms"),
        Figure("gateway.added_ms.write.p99", _p99(writes) - _p99(direct_writes), "ms"),
        Figure("gateway.sdk_hop_ms.p50", statistics.median(bare) - statistics.median(direct), "ms"),
        Figure("gateway.sdk_hop_ms.p99", _p99(bare) - _p99(direct), "ms"),
        Figure("gateway.call_ms.direct.p50", statistics.median(direct), "ms"),
        Figure("gateway.call_ms.through.p50", statistics.median(through), "ms"),
        Figure("gateway.stop_to_upstream_cancel_ms.p50", statistics.median(stops), "ms"),
        Figure("gateway.stop_to_upstream_cancel_ms.p99", _p99(stops), "ms", target=50.0),
        Figure("gateway.idle_queries_per_s", idle, "queries/s", target=0.0),
    ]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _idle_queries_per_s(database: str) -> float:
    from bench.bench_watch_idle import _Transactions

    with _Transactions(database) as count:  # each read waits for late statistics to land first
        before, opened = count(), count.at
        return (count() - before) / (count.at - opened)


def _bare_hop(upstream_url: str) -> Any:
    """A forwarding MCP server with no ledger: `tools/list` and `tools/call` passed to the upstream
    on one SDK client connection kept open for the server's life."""
    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager

    from mcp import Client
    from mcp.server import Server
    from starlette.applications import Starlette

    kept: list[Any] = []

    async def list_tools(ctx: Any, params: Any) -> Any:
        return await kept[0].list_tools()

    async def call_tool(ctx: Any, params: Any) -> Any:
        return await kept[0].call_tool(params.name, dict(params.arguments or {}))

    server: Server[Any] = Server("bench-hop", on_list_tools=list_tools, on_call_tool=call_tool)
    app = server.streamable_http_app(streamable_http_path="/mcp")

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with Client(upstream_url) as client, server.session_manager.run():
            kept.append(client)
            yield

    return Starlette(routes=app.routes, lifespan=lifespan)


def _call_times(url: str, tool: str = "read_value") -> list[float]:
    from mcp import Client

    timings: list[float] = []

    async def main() -> None:
        async with Client(url) as client:
            for n in range(CALLS + 5):
                # a write is a new one each time (its own key), as an agent's writes are
                arguments = {"key": "k"} if tool == "read_value" else {"key": f"w{n}", "value": "v", "seconds": 0}
                started = time.perf_counter()
                await client.call_tool(tool, arguments)
                if n >= 5:  # after a warm-up
                    timings.append((time.perf_counter() - started) * 1000)

    anyio.run(main)
    return timings


def _stop_to_cancel(party: Any, url: str) -> list[float]:
    from django.db import connection

    from stopdesk.services.items import task_create
    from stopdesk.services.stop import task_request_stop

    task_ids = [task_create(title=f"bench gateway {n}", actor="bench").pk for n in range(SESSIONS)]
    connection.close()
    callers = threading.Thread(target=anyio.run, args=(_calls_in_flight, url, task_ids))
    callers.start()
    _wait(lambda: sum(e["event"] == "started" for e in party.journal("slow_lookup")) == SESSIONS, LOOKUP_S / 2)
    pressed: dict[str, float] = {}
    for task_id in task_ids:
        pressed[f"q{task_id}"] = time.time()
        task_request_stop(task_id=task_id, actor="user:bench", reason="bench", dispatch=lambda ids: None)
    connection.close()
    _wait(lambda: sum(e["event"] == "interrupted" for e in party.journal("slow_lookup")) == SESSIONS, LOOKUP_S / 2)
    callers.join()
    ended = {e["call"]: e["at"] for e in party.journal("slow_lookup") if e["event"] == "interrupted"}
    return [(ended[call] - at) * 1000 for call, at in pressed.items()]


async def _calls_in_flight(url: str, task_ids: list[int]) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    async def one(task_id: int) -> None:
        headers = {"X-Stopdesk-Task": str(task_id)}
        async with httpx2.AsyncClient(headers=headers, timeout=LOOKUP_S + 30) as http:
            transport = streamable_http_client(url, http_client=http)
            # Answered "stopped by user:bench: bench", as expected.
            async with Client(transport) as client:  # type: ignore[arg-type]
                with contextlib.suppress(MCPError):
                    await client.call_tool("slow_lookup", {"query": f"q{task_id}", "seconds": LOOKUP_S})

    async with anyio.create_task_group() as tg:
        for task_id in task_ids:
            tg.start_soon(one, task_id)


def _wait(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the gateway bench waited too long")
        time.sleep(0.01)
