"""Real sandbox parties on loopback for the reconcile tests, and small helpers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.sandbox.crm import CRM
from reconcile.sandbox.mcp_server import MCPToolServer
from reconcile.sandbox.openai_standin import OpenAIStandin
from reconcile.sandbox.outbox import Outbox
from reconcile.sandbox.server import BackgroundServer
from tests.reference_servers import EverythingServer, everything, make_repo, tee_command
from tests.reference_servers.proxy import WireRecorder


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    registry.reset()
    yield
    registry.reset()


@pytest.fixture
def openai_party() -> Iterator[tuple[OpenAIStandin, str]]:
    party = OpenAIStandin(queue_s=0.02, run_s=30.0, flip_after_s=0.2)
    with BackgroundServer(party.app, name="openai") as server:
        yield party, server.url + "/v1"


@pytest.fixture
def mcp_party() -> Iterator[tuple[MCPToolServer, str]]:
    party = MCPToolServer(default_seconds=2.0, poll_interval_ms=50)
    with BackgroundServer(party.app, name="mcp") as server:
        yield party, server.url + "/mcp"


@pytest.fixture
def crm_party() -> Iterator[tuple[CRM, str]]:
    party = CRM()
    with BackgroundServer(party.app, name="crm") as server:
        yield party, server.url


@pytest.fixture
def outbox_party() -> Iterator[tuple[Outbox, str]]:
    party = Outbox()
    with BackgroundServer(party.app, name="outbox") as server:
        yield party, server.url


class Clock:
    """A controllable clock: the services take `now`, so deadlines pass without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or timezone.now()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def __call__(self):  # type: ignore[no-untyped-def]
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def everything_party(tmp_path: Path) -> Iterator[tuple[EverythingServer, WireRecorder, str]]:
    """server-everything over Streamable HTTP on a free port, behind a recording proxy; the URL
    is the proxy's."""
    with everything(tmp_path / "server-everything.log") as server:
        recorder = WireRecorder(server.url)
        with BackgroundServer(recorder.app, name="wire") as proxy:
            yield server, recorder, proxy.url + "/mcp"


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A temporary git repository with one change staged, for mcp-server-git."""
    return make_repo(tmp_path / "repo")


@pytest.fixture
def git_server(tmp_path: Path) -> dict[str, object]:
    """mcp-server-git over stdio (behind the recording tee), configured as server "git" with
    git_log as git_commit's status check."""
    wire = tmp_path / "git-wire.jsonl"
    command, args = tee_command(wire)
    return {
        "wire": wire,
        "config": {
            "command": command,
            "args": args,
            "cwd": str(Path(__file__).resolve().parents[2]),
            "tools": {
                "git_commit": {
                    "status_check": {
                        "tool": "git_log",
                        "arguments": {"repo_path": "{repo_path}", "max_count": 5},
                        "completed_if_contains": "Message: {message}",
                    }
                }
            },
        },
    }
