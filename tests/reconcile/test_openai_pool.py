"""The OpenAI clients' connection pools against a server that closes idle keep-alive connections.

A server closes a connection once it has been idle for its keep-alive timeout. A client that still
counts the connection as fresh at that moment sends its request into the close and gets "Server
disconnected" back, before the server read it. The clients must drop an idle connection well before
any such timeout; the stand-in's server (uvicorn) closes after 5 s.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from reconcile.mechanisms.openai.adapter import client_for, http_client_for, plain_endpoint_for

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
