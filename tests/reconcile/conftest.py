"""Real sandbox parties on loopback for the reconcile tests, and small helpers."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.mcp.sandbox import MCPToolServer
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.server import BackgroundServer
from tests.reference_servers import EverythingServer, everything, make_repo, tee_command
from tests.reference_servers.proxy import WireRecorder

# The sandbox parties as the settings configure them (stopdesk/settings.py), kept whole when a
# test's STOPDESK_MECHANISMS drops the settings' own.
SYSTEMS = copy.deepcopy(django_settings.STOPDESK_MECHANISMS["http"]["options"]["systems"])


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    registry.reset()
    yield
    registry.reset()


@pytest.fixture
def openai_party(settings) -> Iterator[tuple[OpenAIStandin, str]]:  # type: ignore[no-untyped-def]
    """The OpenAI stand-in, configured as the openai mechanism's endpoint (the reconciler cancels
    and reads back only there)."""
    party = OpenAIStandin(queue_s=0.02, run_s=30.0, flip_after_s=0.2)
    with BackgroundServer(party.app, name="openai") as server:
        configure_openai(settings, base_url=server.url + "/v1")
        yield party, server.url + "/v1"


def configure_openai(settings, **options: object) -> None:  # type: ignore[no-untyped-def]
    mechanisms = copy.deepcopy(settings.STOPDESK_MECHANISMS)
    mechanisms.setdefault("openai", {}).setdefault("options", {}).update(options)
    settings.STOPDESK_MECHANISMS = mechanisms
    registry.reset()


@pytest.fixture
def mcp_party(settings) -> Iterator[tuple[MCPToolServer, str]]:  # type: ignore[no-untyped-def]
    """The sandbox MCP server, configured (the reconciler reaches only configured servers)."""
    party = MCPToolServer(default_seconds=2.0, poll_interval_ms=50)
    with BackgroundServer(party.app, name="mcp") as server:
        configure_mcp_server(settings, "sandbox", url=server.url + "/mcp")
        yield party, server.url + "/mcp"


def configure_mcp_server(settings, name: str, **server: object) -> None:  # type: ignore[no-untyped-def]
    mechanisms = copy.deepcopy(settings.STOPDESK_MECHANISMS)
    servers = mechanisms.setdefault("mcp", {}).setdefault("options", {}).setdefault("servers", {})
    servers[name] = {**servers.get(name, {}), **server}
    settings.STOPDESK_MECHANISMS = mechanisms
    registry.reset()


@pytest.fixture
def crm_party(settings) -> Iterator[tuple[CRM, str]]:  # type: ignore[no-untyped-def]
    """The sandbox CRM, configured as the "crm" system (the server reaches only configured ones)."""
    party = CRM()
    with BackgroundServer(party.app, name="crm") as server:
        configure_system(settings, "crm", base_url=server.url)
        yield party, server.url


@pytest.fixture
def outbox_party(settings) -> Iterator[tuple[Outbox, str]]:  # type: ignore[no-untyped-def]
    party = Outbox()
    with BackgroundServer(party.app, name="outbox") as server:
        configure_system(settings, "outbox", base_url=server.url)
        yield party, server.url


def configure_system(settings, name: str, **values: object) -> None:  # type: ignore[no-untyped-def]
    """Set (some of) the http system `name`'s configuration for this test, on a copy of the
    settings' systems, as an operator would in STOPDESK_MECHANISMS."""
    mechanisms = copy.deepcopy(settings.STOPDESK_MECHANISMS)
    systems = mechanisms.setdefault("http", {}).setdefault("options", {}).setdefault("systems", {})
    systems[name] = {**systems.get(name, copy.deepcopy(SYSTEMS.get(name, {}))), **values}
    settings.STOPDESK_MECHANISMS = mechanisms
    registry.reset()


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
