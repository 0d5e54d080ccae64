"""`python -m stopdesk mcp-gateway`, a real process: it serves the MCP servers named in the
configuration file, and a Stop pressed in another process reaches it (its StopHub's LISTEN)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import httpx
import pytest
from django.db import connection
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp.sandbox import READ_VALUE, SLOW_LOOKUP, MCPToolServer
from stopdesk.models import Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from stopdrill.launcher import free_port
from stopdrill.sandbox.server import BackgroundServer
from tests.run.helpers import PYTHON, ROOT, clean_env

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def wait_until_serving(base: str, server: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        try:
            return dict(httpx.get(f"{base}/healthz", timeout=2).json())
        except httpx.TransportError:
            assert time.monotonic() < deadline and server.poll() is None, "the gateway did not start"
            time.sleep(0.2)


def stop_when_started(party: MCPToolServer) -> None:
    while not any(e["event"] == "started" for e in party.journal(SLOW_LOOKUP)):
        time.sleep(0.02)
    try:
        task_request_stop(
            task_id=Task.objects.get().pk, actor="user:operator", reason="enough", dispatch=lambda ids: None
        )
    finally:
        connection.close()


def test_the_gateway_command_serves_the_configured_server_and_hears_stop_from_another_process(pg_dsn, tmp_path: Path):
    party = MCPToolServer(default_seconds=5.0)
    with BackgroundServer(party.app, name="mcp") as upstream:
        config = tmp_path / "stopdesk.toml"
        config.write_text(f'[mcp.servers.sandbox]\nurl = "{upstream.url}/mcp"\n')
        port = free_port()
        env = clean_env(
            tmp_path,
            DATABASE_URL=pg_dsn,
            GATEWAY_PORT=str(port),
            STOPDESK_CONFIG_FILE=str(config),
            STOPDESK_BIND_HOST="127.0.0.1",
        )
        server = subprocess.Popen(
            [PYTHON, "-m", "stopdesk", "mcp-gateway", "--log-level", "warning"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            idle = {"sandbox": {"forwarded": 0, "sdk": 0}}
            assert wait_until_serving(base, server) == {"ok": True, "servers": ["sandbox"], "calls": idle}

            async def main() -> None:
                async with Client(f"{base}/mcp/sandbox") as client:
                    assert not (await client.call_tool(READ_VALUE, {"key": "k"})).is_error
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(anyio.to_thread.run_sync, stop_when_started, party)
                        with pytest.raises(MCPError, match=r"^stopped by user:operator: enough$"):
                            await client.call_tool(SLOW_LOOKUP, {"query": "q", "seconds": 5})

            began = time.monotonic()
            anyio.run(main)
            assert time.monotonic() - began < 4  # answered at Stop, not after the lookup's 5 s
            # Both calls were a 2026-07-28 client's plain calls to a 2026-07-28 upstream: forwarded.
            assert httpx.get(f"{base}/healthz", timeout=2).json()["calls"] == {"sandbox": {"forwarded": 2, "sdk": 0}}
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
    states = dict(WorkItem.objects.values_list("noun", "state"))
    assert states == {"sandbox: read_value": ItemState.COMPLETED, "sandbox: slow_lookup": ItemState.CANCELLED}
    assert [e["event"] for e in party.journal(SLOW_LOOKUP)] == ["started", "interrupted"]
