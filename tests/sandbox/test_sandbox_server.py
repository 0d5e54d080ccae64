"""The background server helper and `start_all`."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.server import BackgroundServer, start_all


def test_a_server_accepts_connections_as_soon_as_start_returns() -> None:
    with BackgroundServer(Outbox().app, name="outbox") as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert httpx.get(server.url + "/messages").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/messages")


def test_stop_is_bounded_even_with_a_request_parked_forever() -> None:
    party = Outbox()
    party.set_fault("hang")
    server = BackgroundServer(party.app, name="outbox").start()

    def parked_send() -> None:
        # The server going away is the expected end of this request.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(server.url + "/messages", json={"to": "a@example.test"}, timeout=30)

    sender = threading.Thread(target=parked_send, daemon=True)
    sender.start()
    time.sleep(0.2)
    began = time.monotonic()
    server.stop()

    assert time.monotonic() - began < 3.0
    assert not server.running
    sender.join(3.0)
    assert not sender.is_alive()


def test_a_restart_builds_a_fresh_app_on_the_same_port() -> None:
    builds = []

    def factory() -> Starlette:
        builds.append(1)

        async def hello(request: Request) -> PlainTextResponse:
            return PlainTextResponse(f"build {len(builds)}")

        return Starlette(routes=[Route("/", hello)])

    server = BackgroundServer(factory, name="hello").start()
    port = server.port
    server.stop()
    server.start()
    try:
        assert server.port == port
        assert httpx.get(server.url).text == "build 2"
        with pytest.raises(RuntimeError):
            server.start()
    finally:
        server.stop()
    server.stop()  # stopping twice is harmless


def test_start_all_serves_the_four_parties_and_the_webhook_receiver_and_stops_them() -> None:
    with start_all() as sandbox:
        urls = sandbox.urls
        client = openai.OpenAI(base_url=urls["openai"], api_key="sk-sandbox", max_retries=0)
        created = client.responses.create(model="gpt-sandbox", input="hi", background=True)
        statuses = {
            name: httpx.get(url.removesuffix("/v1").removesuffix("/mcp").removesuffix("/hooks") + "/_control/stats")
            for name, url in urls.items()
        }
        crm = httpx.post(urls["crm"] + "/records", json={"name": "Acme"}, headers={"Idempotency-Key": "k"})

    assert set(urls) == {"openai", "mcp", "crm", "outbox", "webhooks"}
    assert urls["openai"].endswith("/v1") and urls["mcp"].endswith("/mcp")
    assert created.status == "queued"
    assert all(response.status_code == 200 for response in statuses.values())
    assert crm.status_code == 201
    assert not any(server.running for server in sandbox.servers.values())
