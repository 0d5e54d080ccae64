"""Each sandbox party served for real on loopback, fresh for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reconcile.sandbox.crm import CRM
from reconcile.sandbox.mcp_server import MCPToolServer
from reconcile.sandbox.openai_standin import OpenAIStandin
from reconcile.sandbox.outbox import Outbox
from reconcile.sandbox.server import BackgroundServer


@pytest.fixture
def openai_standin() -> Iterator[tuple[OpenAIStandin, BackgroundServer]]:
    party = OpenAIStandin(queue_s=0.02, run_s=0.4, flip_after_s=0.3)
    with BackgroundServer(party.app, name="openai") as server:
        yield party, server


@pytest.fixture
def mcp_tools() -> Iterator[tuple[MCPToolServer, BackgroundServer]]:
    party = MCPToolServer(default_seconds=2.0, poll_interval_ms=50)
    with BackgroundServer(party.app, name="mcp") as server:
        yield party, server


@pytest.fixture
def crm() -> Iterator[tuple[CRM, BackgroundServer]]:
    party = CRM()
    with BackgroundServer(party.app, name="crm") as server:
        yield party, server


@pytest.fixture
def outbox() -> Iterator[tuple[Outbox, BackgroundServer]]:
    party = Outbox()
    with BackgroundServer(party.app, name="outbox") as server:
        yield party, server
