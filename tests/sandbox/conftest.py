"""Each sandbox party served for real on loopback.

A server is started once per module (starting and stopping uvicorn costs a few hundred
milliseconds); every test gets its party back reset to a clean state and to the module's
configuration. A test that stops the server gets it restarted for the next one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.mcp.sandbox import MCPToolServer
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdrill.sandbox.common import SandboxParty
from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.server import BackgroundServer


def _serve[P: SandboxParty](party: P, name: str) -> Iterator[tuple[P, BackgroundServer]]:
    with BackgroundServer(party.app, name=name) as server:
        yield party, server


def _fresh[P: SandboxParty](served: tuple[P, BackgroundServer]) -> Iterator[tuple[P, BackgroundServer]]:
    party, server = served
    defaults = party.config()
    if not server.running:
        server.start()
    yield party, server
    party.reset()
    party.configure(**defaults)


@pytest.fixture(scope="module")
def _openai_served() -> Iterator[tuple[OpenAIStandin, BackgroundServer]]:
    yield from _serve(OpenAIStandin(queue_s=0.02, run_s=0.4, flip_after_s=0.3), "openai")


@pytest.fixture(scope="module")
def _mcp_served() -> Iterator[tuple[MCPToolServer, BackgroundServer]]:
    yield from _serve(MCPToolServer(default_seconds=2.0, poll_interval_ms=50), "mcp")


@pytest.fixture(scope="module")
def _crm_served() -> Iterator[tuple[CRM, BackgroundServer]]:
    yield from _serve(CRM(), "crm")


@pytest.fixture(scope="module")
def _outbox_served() -> Iterator[tuple[Outbox, BackgroundServer]]:
    yield from _serve(Outbox(), "outbox")


@pytest.fixture
def openai_standin(
    _openai_served: tuple[OpenAIStandin, BackgroundServer],
) -> Iterator[tuple[OpenAIStandin, BackgroundServer]]:
    yield from _fresh(_openai_served)


@pytest.fixture
def mcp_tools(_mcp_served: tuple[MCPToolServer, BackgroundServer]) -> Iterator[tuple[MCPToolServer, BackgroundServer]]:
    yield from _fresh(_mcp_served)


@pytest.fixture
def crm(_crm_served: tuple[CRM, BackgroundServer]) -> Iterator[tuple[CRM, BackgroundServer]]:
    yield from _fresh(_crm_served)


@pytest.fixture
def outbox(_outbox_served: tuple[Outbox, BackgroundServer]) -> Iterator[tuple[Outbox, BackgroundServer]]:
    yield from _fresh(_outbox_served)
