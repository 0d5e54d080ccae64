"""The MCP Stop gateway as it runs in production: more than one `python -m stopdesk mcp-gateway`
process on one database, and a process that dies with calls in flight.

- Two gateway processes hold calls of one task (a load balancer sent the client's requests to
  both): a Stop pressed in a third process reaches both (each process's LISTEN), each cancels the
  upstream call it holds, and both clients are told who stopped them.
- A gateway SIGKILLed in the middle of a write: nothing in any process remembers the call, but
  the ledger does. Its lease runs out, the reaper hands it to reconciliation, and the status check
  declared for the tool settles it as it really ended (the upstream finished the write after the
  gateway was gone): never left running, never called cancelled."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.db import connection
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.models import Event, WorkItem
from stopdesk.services.reaper import items_reap_stale
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from stopdrill.launcher import free_port
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.reconcile.conftest import clock, configure_mcp_server
from tests.reconcile.helpers import sweep_until_settled
from tests.run.helpers import PYTHON, ROOT, clean_env

__all__ = ["clock"]

S = ItemState
pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BOUND_S = 60.0
LEASE_S = 8  # the gateways' lease on a call in flight (they renew it every 5 s)
CLIENT = Implementation(name="fault-client", version="1.0")
CHECK = {"tool": tools.READ_VALUE, "arguments": {"key": "{key}"}, "completed_if_contains": "{key}={value}"}


class GatewayProcess:
    """`python -m stopdesk mcp-gateway` on a port of its own, serving the sandbox upstream."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "stopdesk", "mcp-gateway", "--log-level", "warning"],
            cwd=ROOT,
            env={**env, "GATEWAY_PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.base}/healthz", timeout=2).raise_for_status()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "the gateway did not start"
                time.sleep(0.2)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp/sandbox"

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(10)


@pytest.fixture
def upstream(settings, tmp_path: Path) -> Iterator[tuple[tools.MCPToolServer, dict[str, str]]]:  # type: ignore[no-untyped-def]
    """The sandbox MCP server, named in a configuration file the gateways read and configured the
    same way in this process (whose reconciler settles what a dead gateway left)."""
    settings.STOPDESK_MECHANISMS = {
        "mcp": {"call_timeout_s": 2.0, "deadline_s": 30.0, "backoff_initial_s": 1.0, "recheck_interval_s": 0.5}
    }
    party = tools.MCPToolServer(default_seconds=2.0, poll_interval_ms=50)
    with BackgroundServer(party.app, name="mcp") as server:
        configure_mcp_server(
            settings, "sandbox", url=server.url + "/mcp", tools={tools.SLOW_WRITE: {"status_check": CHECK}}
        )
        config = tmp_path / "stopdesk.toml"
        config.write_text(
            f'[mcp.servers.sandbox]\nurl = "{server.url}/mcp"\n'
            f"[mcp.servers.sandbox.tools.{tools.SLOW_WRITE}.status_check]\n"
            f'tool = "{tools.READ_VALUE}"\narguments = {{ key = "{{key}}" }}\n'
            f'completed_if_contains = "{{key}}={{value}}"\n'
        )
        yield party, {"STOPDESK_CONFIG_FILE": str(config)}


def gateway_env(tmp_path: Path, pg_dsn: str, extra: dict[str, str]) -> dict[str, str]:
    return clean_env(
        tmp_path,
        DATABASE_URL=pg_dsn,
        STOPDESK_BIND_HOST="127.0.0.1",
        STOPDESK_LEASE_SECONDS=str(LEASE_S),
        **extra,
    )


def call_in_thread(url: str, tool: str, arguments: dict[str, Any], *, task_id: int | None, mode: str) -> dict[str, Any]:
    """A client's call through a gateway, in a thread of its own; what it got lands in the dict.
    With `task_id` the call names the task (X-Stopdesk-Task); without, the gateway picks it."""
    outcome: dict[str, Any] = {}
    headers = {"X-Stopdesk-Task": str(task_id)} if task_id is not None else {}

    async def main() -> None:
        async with httpx2.AsyncClient(headers=headers, timeout=30.0) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=mode, client_info=CLIENT, read_timeout_seconds=30.0) as client:  # type: ignore[arg-type]
                outcome["result"] = await client.call_tool(tool, arguments)

    def run() -> None:
        try:
            anyio.run(main)
        except BaseException as exc:  # what the client saw is the test's evidence
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def wait_for(condition: Any, timeout: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def started(party: tools.MCPToolServer, tool: str, n: int = 1) -> bool:
    return sum(e["event"] == "started" for e in party.journal(tool)) >= n


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_stop_reaches_the_calls_of_one_task_held_by_two_gateway_processes(upstream, pg_dsn, tmp_path, mode):
    party, extra = upstream
    env = gateway_env(tmp_path, pg_dsn, extra)
    first, second = GatewayProcess(env), GatewayProcess(env)
    try:
        task = make_task()
        lookup = call_in_thread(first.url, tools.SLOW_LOOKUP, {"query": "q", "seconds": 20}, task_id=task.pk, mode=mode)
        write = call_in_thread(
            second.url, tools.SLOW_WRITE, {"key": "k1", "value": "v1", "seconds": 20}, task_id=task.pk, mode=mode
        )
        wait_for(lambda: started(party, tools.SLOW_LOOKUP) and started(party, tools.SLOW_WRITE))
        pressed = time.monotonic()
        try:
            task_request_stop(task_id=task.pk, actor="user:operator", reason="two doors", dispatch=lambda ids: None)
        finally:
            connection.close()
        for outcome in (lookup, write):
            outcome["thread"].join(BOUND_S)
            assert isinstance(outcome.get("error"), MCPError), outcome
            assert str(outcome["error"]) == "stopped by user:operator: two doors"
        answered_s = time.monotonic() - pressed
    finally:
        first.kill(signal.SIGTERM)
        second.kill(signal.SIGTERM)

    assert answered_s < 5  # both heard the Stop by push, long before their 20 s calls would end
    items = {item.detail["gateway"]["tool"]: item for item in WorkItem.objects.filter(task=task)}
    assert items[tools.SLOW_LOOKUP].state == S.CANCELLED  # read-only, cancelled upstream
    assert items[tools.SLOW_WRITE].state == S.UNCERTAIN and items[tools.SLOW_WRITE].investigate_by is not None
    for item in items.values():
        assert item.cancel_requested_at is not None
    # Each process cancelled the call it held, upstream; neither write landed.
    assert {e["event"] for e in party.journal(tools.SLOW_LOOKUP)} == {"started", "interrupted"}
    assert party.effects(tools.SLOW_WRITE) == []


def test_a_2026_07_28_client_sent_to_two_gateway_processes_is_one_task_and_one_stop_reaches_both(
    upstream, pg_dsn, tmp_path
):
    """2026-07-28 has no session to stick to: a load balancer may send each call to another
    process. Both file the client's calls under one task (kept in the database), so the Stop a
    person presses on it refuses the next call wherever it lands; a restarted process agrees."""
    party, extra = upstream
    env = gateway_env(tmp_path, pg_dsn, extra)
    first, second = GatewayProcess(env), GatewayProcess(env)
    try:
        for gateway in (first, second, first):
            done = call_in_thread(gateway.url, tools.READ_VALUE, {"key": "k"}, task_id=None, mode="auto")
            done["thread"].join(BOUND_S)
            assert "result" in done, done
        [task_id] = {item.task_id for item in WorkItem.objects.all()}
        assert WorkItem.objects.count() == 3
        try:
            task_request_stop(task_id=task_id, actor="user:operator", reason="enough", dispatch=lambda ids: None)
        finally:
            connection.close()
        second.kill()
        restarted = GatewayProcess(env)
        try:
            for gateway in (first, restarted):
                refused = call_in_thread(
                    gateway.url, tools.SLOW_WRITE, {"key": "k", "value": "v"}, task_id=None, mode="auto"
                )
                refused["thread"].join(BOUND_S)
                assert str(refused.get("error")) == "stopped by user:operator: enough", refused
        finally:
            restarted.kill(signal.SIGTERM)
    finally:
        first.kill(signal.SIGTERM)
        second.kill(signal.SIGTERM)
    assert {item.task_id for item in WorkItem.objects.all()} == {task_id}
    assert [m["tool"] for m in party.wire("tools/call")] == [tools.READ_VALUE] * 3  # no write went upstream


def test_a_gateway_killed_mid_write_leaves_the_call_to_reconciliation_which_settles_it_as_it_ended(
    upstream, pg_dsn, tmp_path, clock
):
    party, extra = upstream
    party.set_fault(tools.IGNORE_CANCEL, target="k2")  # the write finishes even without its caller
    gateway = GatewayProcess(gateway_env(tmp_path, pg_dsn, extra))
    task = make_task()
    try:
        write = call_in_thread(
            gateway.url, tools.SLOW_WRITE, {"key": "k2", "value": "v2", "seconds": 1.5}, task_id=task.pk, mode="auto"
        )
        wait_for(lambda: started(party, tools.SLOW_WRITE))
        gateway.kill()
        killed = time.monotonic()
    finally:
        gateway.kill()
    write["thread"].join(BOUND_S)
    assert "result" not in write  # the client never got an answer
    item = WorkItem.objects.get(task=task)
    assert item.state == S.RUNNING  # nobody knows yet; the ledger still holds it

    wait_for(lambda: [e["call"] for e in party.effects(tools.SLOW_WRITE)] == ["k2"])  # it landed after all
    wait_for(lambda: WorkItem.objects.get(pk=item.pk).lease_until < timezone.now(), LEASE_S + 10)
    assert items_reap_stale() == 1
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION
    assert Event.objects.filter(item=item, kind="lease_expired").exists()

    clock.now = timezone.now()
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    known_s = time.monotonic() - killed
    assert item.state == S.COMPLETED, (item.state, item.outcome, item.evidence)
    assert item.outcome == "completed; read_value shows it took effect"
    assert item.cancel_requested_at is None  # nobody pressed Stop: not counted as Stop's work
    print(f"fault.gateway_killed items=1 time_to_known_s={known_s:.1f} lost=0")
