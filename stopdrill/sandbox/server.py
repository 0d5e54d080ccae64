"""Run an ASGI app under uvicorn on 127.0.0.1 in a background thread.

Every sandbox party is a real HTTP server so that the code under test goes through its
real client stack (httpx, the openai SDK's retries, the mcp SDK's transport). Each server
gets its own thread and event loop, so a party that hangs a request never blocks the
caller's loop or another party.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Self

import uvicorn
from starlette.types import ASGIApp

from reconcile.mechanisms import folders
from stopdrill.sandbox.common import SandboxParty
from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.webhooks import WebhookReceiver

logger = logging.getLogger(__name__)

AppFactory = Callable[[], ASGIApp]

LOOPBACK = "127.0.0.1"


class BackgroundServer:
    """One uvicorn server for one ASGI app, on loopback, in a daemon thread.

    `app_factory` is called on every `start()`: some apps (the MCP session manager) can
    only run once, so a restart needs a fresh app. The port is chosen by the OS on the
    first start and reused on restarts, so `url` stays stable across a drill's
    "the remote side restarted" step.
    """

    def __init__(
        self,
        app_factory: AppFactory,
        *,
        name: str = "sandbox",
        port: int = 0,
        graceful_shutdown_s: float = 0.5,
        startup_timeout_s: float = 10.0,
    ) -> None:
        self.name = name
        self._app_factory = app_factory
        self._port = port
        # Requests parked by a `hang` fault never finish on their own; uvicorn cancels
        # whatever is still running after this long, which keeps stop() bounded.
        self._graceful_shutdown_s = graceful_shutdown_s
        self._startup_timeout_s = startup_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{self.name} server has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Self:
        if self.running:
            raise RuntimeError(f"{self.name} server is already running on {self.url}")
        sock = _bind(self._port)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app_factory(),
            log_level="warning",
            access_log=False,
            lifespan="auto",
            loop="asyncio",
            http="h11",
            ws="none",
            # Annotated int upstream, but it only reaches asyncio.wait_for, which takes a float.
            timeout_graceful_shutdown=self._graceful_shutdown_s,  # type: ignore[arg-type]
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"sandbox-{self.name}", daemon=True
        )
        self._server, self._thread = server, thread
        thread.start()
        self._wait_until_accepting()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout_s)
        if thread.is_alive():
            # The graceful path is stuck (a lifespan that will not end); skip the rest.
            logger.warning("%s server did not stop in %.1fs; forcing exit", self.name, timeout_s)
            server.force_exit = True
            thread.join(timeout_s)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_until_accepting(self) -> None:
        assert self._server is not None and self._thread is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.name} server thread died during startup")
            # `started` flips after lifespan startup and after the listener is serving;
            # the connect proves the accept loop is really running.
            if self._server.started and _accepts(self._port):
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.name} server did not start within {self._startup_timeout_s}s")


def _bind(port: int) -> socket.socket:
    # The protocol must say TCP: asyncio turns TCP_NODELAY on only for such sockets, and without
    # it every answer waits on Nagle and delayed ACKs (about 40 ms a call on loopback).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # A restart on the same port must not trip over the previous run's TIME_WAIT sockets.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.set_inheritable(True)
    return sock


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def mechanism_parties() -> dict[str, ModuleType]:
    """The sandbox parts of the mechanism folders that have one, by party name, in port order."""
    found = {}
    for name in folders.listed():
        part = folders.part(name, "sandbox")
        if part is not None:
            found[part.PARTY_NAME] = part
    return found


# Parties no mechanism owns, served after the mechanisms' own.
SHARED: dict[str, Callable[[], SandboxParty]] = {"outbox": Outbox, "webhooks": WebhookReceiver}


def party_names() -> list[str]:
    """Every party start_all serves, in port order (the webhook receiver last)."""
    return [*mechanism_parties(), *SHARED]


@dataclass
class Sandbox:
    """The external parties and the webhook receiver, each served on its own loopback port.

    A party is an attribute by its name (`sandbox.openai`, `sandbox.crm`, `sandbox.outbox`)."""

    parties: dict[str, SandboxParty]
    servers: dict[str, BackgroundServer]
    suffixes: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the dataclass does not have: the parties.
        parties = self.__dict__.get("parties") or {}
        if name not in parties:
            raise AttributeError(name)
        return parties[name]

    @property
    def urls(self) -> dict[str, str]:
        """Base URLs to configure clients with (OpenAI's includes `/v1`, MCP's `/mcp`), for the
        parties that are served."""
        suffix = {**self.suffixes, "webhooks": "/hooks"}
        return {name: server.url + suffix.get(name, "") for name, server in self.servers.items()}

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def reset(self) -> None:
        for party in self.parties.values():
            party.reset()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_all(
    *,
    ports: dict[str, int] | None = None,
    only: Collection[str] | None = None,
    **given: SandboxParty,
) -> Sandbox:
    """Start every party (the mechanism folders' and the shared ones: the outbox and the webhook
    receiver), fresh ones unless given by name (`openai=OpenAIStandin(run_s=600)`), and return
    them with their servers.

    `ports` pins ports by party name (`openai`, `mcp`, `crm`, `outbox`, `webhooks`), e.g. for a
    management command whose URLs go into settings; unpinned parties get a free port.
    `only` serves just those parties (the others exist, unserved, with no URL).
    """
    ports = ports or {}
    own = mechanism_parties()
    makers: dict[str, Callable[[], SandboxParty]] = {name: part.PARTY for name, part in own.items()} | SHARED
    unknown = set(given) - set(makers)
    if unknown:
        raise TypeError(f"start_all() has no party called {', '.join(sorted(unknown))}")
    parties = {name: given.get(name) or make() for name, make in makers.items()}
    servers: dict[str, BackgroundServer] = {}
    try:
        for name, party in parties.items():
            if only is None or name in only:
                servers[name] = BackgroundServer(party.app, name=name, port=ports.get(name, 0)).start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return Sandbox(parties=parties, servers=servers, suffixes={name: part.URL_SUFFIX for name, part in own.items()})
