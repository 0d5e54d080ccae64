"""The gateway in front of the sandbox MCP server, both on loopback in their own threads; the
client is the MCP Python SDK's, talking to the gateway over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from reconcile.mechanisms.mcp.sandbox import READ_VALUE, SLOW_WRITE, MCPToolServer
from stopdesk.gateway.app import gateway_app
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from stopdrill.sandbox.server import BackgroundServer
from tests.reconcile.conftest import clock, configure_mcp_server

__all__ = ["clock"]  # the reconciler's controllable clock, for sweeps


# The reconciler looks whether a stopped slow_write took effect with read_value, on the upstream.
CHECK = {"tool": READ_VALUE, "arguments": {"key": "{key}"}, "completed_if_contains": "{key}={value}"}


# Long, so a Stop seen within a second was pushed (StopHub), not polled.
POLL_S = 5.0


def answers_recorded(timeout_s: float = 10.0) -> None:
    """Returns once no call is left running. A forwarded read's answer (or an idempotent tool's)
    reaches its client just before the gateway records it (`answer_may_follow_reply`), so a test
    that reads the ledger the moment its client has the answer waits for the record first."""
    deadline = time.monotonic() + timeout_s
    while WorkItem.objects.filter(state=ItemState.RUNNING).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"calls still running after {timeout_s} s: their answers were never recorded")
        time.sleep(0.01)


@dataclass
class Gateway:
    party: MCPToolServer  # the upstream: the sandbox MCP server
    url: str  # the gateway's endpoint for the sandbox: /mcp/sandbox


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "mcp": {
            "call_timeout_s": 1.0,
            "deadline_s": 10.0,
            "backoff_initial_s": 1.0,
            "recheck_interval_s": 0.5,
            "options": {"after_cancel_s": 0.2},
        }
    }


@pytest.fixture
def upstream_config() -> dict[str, Any]:
    """More of the sandbox's server configuration (a test parametrizes it: `trusted`, `tools`)."""
    return {}


@pytest.fixture
def gateway(fast, settings, upstream_config) -> Iterator[Gateway]:  # type: ignore[no-untyped-def]
    party = MCPToolServer(default_seconds=2.0, poll_interval_ms=50)
    with BackgroundServer(party.app, name="mcp") as upstream:
        server = {"url": upstream.url + "/mcp", "tools": {SLOW_WRITE: {"status_check": CHECK}}, **upstream_config}
        configure_mcp_server(settings, "sandbox", **server)
        with BackgroundServer(lambda: gateway_app(poll_s=POLL_S), name="gateway") as front:
            yield Gateway(party=party, url=front.url + "/mcp/sandbox")
