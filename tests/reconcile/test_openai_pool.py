"""The OpenAI clients' connection pools against a server that closes idle keep-alive connections.

A server closes a connection once it has been idle for its keep-alive timeout. A client that still
counts the connection as fresh at that moment sends its request into the close and gets "Server
disconnected" back, before the server read it. The clients must drop an idle connection well before
any such timeout; the stand-in's server (uvicorn) closes after 5 s.
"""

from __future__ import annotations

import ast
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest

from reconcile.mechanisms.base import ItemRef, Seen
from reconcile.mechanisms.openai.adapter import (
    OpenAIResponses,
    client_for,
    environment_proxy,
    http_client_for,
    plain_endpoint_for,
)
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdrill.sandbox.server import BackgroundServer

LIBRARIES = frozenset({"httpx", "httpx2", "openai", "httpcore"})

# The stand-in's server (uvicorn) closes a connection idle for 5 s, counted from its answer. The
# client counts from when it has read the answer and let go of the connection: on a loaded machine
# that is up to a few hundred milliseconds later, so the server's clock runs that far ahead.
SERVER_IDLE_S = 5.0
LAG_S = 0.5
IDLE_S = SERVER_IDLE_S - LAG_S  # the server's timeout, as the client's clock sees it
PAUSE_S = SERVER_IDLE_S - 0.3  # a pause between two calls, under the server's own timeout
RESPONSE = {"id": "resp_pool", "object": "response", "status": "cancelled", "created_at": 0, "model": "m", "output": []}


class IdleClosingServer(socketserver.ThreadingTCPServer):
    """HTTP/1.1 keep-alive on loopback, with an idle timeout that fires exactly when the next request
    arrives late: the connection is closed without an answer, as a server closing it at that moment
    would. Counts the connections it accepted and the requests it answered."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.answered = 0
        self.closed_on_arrival = 0
        self.heads: list[bytes] = []


class _Handler(socketserver.BaseRequestHandler):
    server: IdleClosingServer

    def handle(self) -> None:
        self.server.connections += 1
        conn: socket.socket = self.request
        idle_since = time.monotonic()
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            self.server.heads.append(head)
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(buffer) < length:
                buffer += conn.recv(65536)
            buffer = buffer[length:]
            if time.monotonic() - idle_since > IDLE_S:
                self.server.closed_on_arrival += 1
                conn.close()
                return
            self.server.answered += 1  # before the answer: the client may look as soon as it has it
            body = json.dumps(RESPONSE).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            idle_since = time.monotonic()


@pytest.fixture
def idle_closing_server() -> Iterator[tuple[IdleClosingServer, str]]:
    server = IdleClosingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_read_back_client_does_not_reuse_a_connection_the_server_is_closing(idle_closing_server):
    server, url = idle_closing_server
    client = http_client_for(base_url=url, api_key="sk-pool", timeout_s=5.0)
    assert client.get("responses/resp_pool").json()["status"] == "cancelled"
    time.sleep(PAUSE_S)
    assert client.get("responses/resp_pool").json()["status"] == "cancelled"
    assert (server.answered, server.closed_on_arrival, server.connections) == (2, 0, 2)


def test_the_sdk_client_creates_go_through_does_not_reuse_a_connection_the_server_is_closing(idle_closing_server):
    server, url = idle_closing_server
    client = client_for(base_url=url, api_key="sk-pool", timeout_s=5.0)
    assert client.responses.retrieve("resp_pool").status == "cancelled"
    time.sleep(PAUSE_S)
    # With the SDK's retries off (as for a create), a request sent into the close is an error.
    assert client.responses.retrieve("resp_pool").status == "cancelled"
    assert (server.answered, server.closed_on_arrival, server.connections) == (2, 0, 2)


def test_the_cancel_and_read_back_path_does_not_reuse_a_connection_the_server_is_closing(idle_closing_server):
    # The adapter's cancel and read-back go straight to the client's transport: the same pool.
    server, url = idle_closing_server
    endpoint = plain_endpoint_for(base_url=url, api_key="sk-plain", timeout_s=5.0)
    assert endpoint.send("POST", "responses/resp_pool/cancel").status_code == 200
    time.sleep(PAUSE_S)
    assert endpoint.send("GET", "responses/resp_pool").json()["status"] == "cancelled"
    assert (server.answered, server.closed_on_arrival, server.connections) == (2, 0, 2)
    cancel, read_back = (head.lower().split(b"\r\n") for head in server.heads)
    assert cancel[0] == b"post /v1/responses/resp_pool/cancel http/1.1"
    assert read_back[0] == b"get /v1/responses/resp_pool http/1.1"
    for lines in (cancel, read_back):
        assert b"authorization: bearer sk-plain" in lines
        assert f"host: 127.0.0.1:{server.server_address[1]}".encode() in lines
    assert b"content-length: 0" in cancel


class SilentServer(socketserver.ThreadingTCPServer):
    """Accepts connections and reads requests, and never answers."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Silent)


class _Silent(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while self.request.recv(65536):
            pass


def test_the_cancel_and_read_back_path_keeps_the_clients_timeout():
    server = SilentServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = plain_endpoint_for(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="sk-silent", timeout_s=0.5
        )
        raised: list[BaseException] = []

        def read_back() -> None:
            try:
                endpoint.send("GET", "responses/resp_silent")
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=read_back, daemon=True)
        started = time.monotonic()
        caller.start()
        caller.join(timeout=10)
        assert not caller.is_alive(), "the read-back waited past its timeout"
        assert len(raised) == 1 and isinstance(raised[0], httpx.ReadTimeout)
        assert time.monotonic() - started < 5
    finally:
        server.shutdown()
        server.server_close()


class ConnectionsSeen:
    """The stand-in's app behind a count of the TCP connections its requests came on (each
    connection has its own client address and port)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.peers: list[tuple[str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.peers.append(tuple(scope["client"]))
        await self.app(scope, receive, send)


def _item(handle: str) -> ItemRef:
    return ItemRef(
        id=1,
        task_id=1,
        kind="model_request",
        mechanism="openai",
        handle=handle,
        idempotency_key="",
        state="running",
        detail={},
    )


def test_cancels_against_the_stand_in_reuse_one_connection_of_the_endpoints_pool():
    """What sending straight to the endpoint's transport must keep: every cancel and read-back of a
    canceller goes over the pooled connection, with the bearer key the server expects."""
    party = OpenAIStandin(queue_s=0.02, run_s=5.0)
    seen: list[ConnectionsSeen] = []

    def app() -> Any:
        seen.append(ConnectionsSeen(party.app()))
        return seen[-1]

    with BackgroundServer(app, name="openai-connections") as server:
        url = server.url + "/v1"
        creator = openai.OpenAI(base_url=url, api_key="sk-count", max_retries=0, timeout=5.0)
        ids = [creator.responses.create(model="gpt-sandbox", input=f"job {n}", background=True).id for n in range(5)]
        creator.close()
        seen[-1].peers.clear()
        adapter = OpenAIResponses(
            OpenAIResponses.defaults.merged({"options": {"base_url": url, "api_key": "sk-count"}})
        )
        observed = [adapter.cancel(_item(response_id)) for response_id in ids]
        assert [o.seen for o in observed] == [Seen.CANCELLED] * 5
        assert all(o.cancel_sent for o in observed)
        # Ten requests (a cancel and a read-back each), one connection.
        assert len(seen[-1].peers) == 10 and len(set(seen[-1].peers)) == 1
        assert [party.get(i)["status"] for i in ids] == ["cancelled"] * 5
        # The plain client (the same endpoint, key and timeout) rides the same pool.
        client = http_client_for(base_url=url, api_key="sk-count", timeout_s=adapter.settings.call_timeout_s)
        assert client.get(f"responses/{ids[0]}").json()["status"] == "cancelled"
        assert len(set(seen[-1].peers)) == 1


def test_the_endpoint_transport_takes_the_environments_proxy_as_the_client_would(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    assert environment_proxy("https://api.openai.com/v1") == "http://proxy.example:3128"
    assert environment_proxy("https://internal.example/v1") is None
    assert environment_proxy("http://127.0.0.1:8080/v1") is None  # no HTTP_PROXY named
    monkeypatch.delenv("HTTPS_PROXY")
    assert environment_proxy("https://api.openai.com/v1") is None


def test_the_cancel_path_goes_through_the_environments_proxy_as_httpx_would(idle_closing_server, monkeypatch):
    # The loopback server plays an HTTP proxy: it sees the absolute URL a proxied request names.
    server, _url = idle_closing_server
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    endpoint = plain_endpoint_for(base_url="http://api.example.invalid/v1", api_key="sk-proxied", timeout_s=5.0)
    assert endpoint.send("GET", "responses/resp_pool").json()["status"] == "cancelled"
    with httpx.Client() as plain:  # httpx's own choice from the same environment
        assert plain.get("http://api.example.invalid/v1/responses/resp_pool").status_code == 200
    ours, httpx_own = (head.split(b"\r\n")[0] for head in server.heads)
    assert ours == httpx_own == b"GET http://api.example.invalid/v1/responses/resp_pool HTTP/1.1"


PRODUCT = ("stopdesk", "reconcile", "stopdrill")


def _private_client_names() -> set[str]:
    kinds = (httpx.Client, httpx.AsyncClient, httpx.HTTPTransport, httpx.AsyncHTTPTransport)
    kinds += (openai.OpenAI, openai.AsyncOpenAI, httpx2.Client, httpx2.AsyncClient)
    return {n for kind in kinds for n in dir(kind) if n.startswith("_") and not n.startswith("__")}


def test_no_product_module_uses_private_parts_of_httpx_or_openai():
    """A private name of the HTTP libraries (a client's `_transport_for_url`, a module such as
    `httpx._utils`) breaks on an upgrade without notice; the product keeps to their public API."""
    private = _private_client_names()
    root = Path(__file__).resolve().parents[2]
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.ImportFrom) and node.module:
                    parts = node.module.split(".")
                    if parts[0] in LIBRARIES and any(p.startswith("_") for p in parts[1:]):
                        found.append(f"{where} from {node.module}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        parts = alias.name.split(".")
                        if parts[0] in LIBRARIES and any(p.startswith("_") for p in parts[1:]):
                            found.append(f"{where} import {alias.name}")
                elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                    base = node.value
                    if isinstance(base, ast.Name) and base.id in LIBRARIES | {"sdk"}:
                        found.append(f"{where} {base.id}.{node.attr}")
                    elif node.attr in private and not (isinstance(base, ast.Name) and base.id in {"self", "cls"}):
                        found.append(f"{where} .{node.attr}")
    assert found == []
