"""One long poll for many tasks (POST /watch): it answers the moment any of them is stopped, with
the same token rules as one task's watch; and the AsyncClient puts all its watch_stop calls on one
such poll, falling back to one poll per task on a server without it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from stopdesk.client import AsyncClient
from stopdesk.protocol.errors import NotFound
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from tests.api.watching import NO_DISPATCH, stop_later

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _tasks(runtime, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    return [task_create(title=f"run {i}", actor="test", runtime=runtime).pk for i in range(n)]


def test_a_watch_of_many_answers_the_moment_any_is_stopped_with_that_one(live_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 3)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=live_server.url + "/api/v1", headers=headers, timeout=30) as http:
        quiet = http.post("/watch", json={"tasks": tasks, "timeout": 0.3})
        assert quiet.status_code == 200 and quiet.json() == {"stopped": []}
        stopper = stop_later(tasks[1], 0.5)
        started = time.monotonic()
        pushed = http.post("/watch", json={"tasks": tasks, "timeout": 20})
        waited = time.monotonic() - started
        stopper.join()
        assert pushed.status_code == 200
        [info] = pushed.json()["stopped"]
        assert info["task"] == tasks[1] and info["stopped"] is True and info["stop_requested_at"]
        assert 0.4 < waited < 5  # by push, well before the 20 s poll ends
        task_request_stop(task_id=tasks[2], actor="test", **NO_DISPATCH)
        at_once = http.post("/watch", json={"tasks": tasks, "timeout": 20})
    assert sorted(i["task"] for i in at_once.json()["stopped"]) == [tasks[1], tasks[2]]


def test_a_watch_of_many_needs_the_runtimes_token_and_only_its_own_tasks(live_server, runtime_token):
    runtime, token = runtime_token
    mine = _tasks(runtime, 2)
    other, _ = runtime_create(name="someone-else", actor="test")
    theirs = task_create(title="theirs", actor="test", runtime=other).pk
    task_request_stop(task_id=theirs, actor="test", **NO_DISPATCH)
    url = live_server.url + "/api/v1/watch"
    assert httpx.post(url, json={"tasks": mine, "timeout": 0}).status_code == 401
    headers = {"Authorization": f"Bearer {token}"}
    refused = httpx.post(url, json={"tasks": [*mine, theirs, 999_999], "timeout": 5}, headers=headers)
    assert refused.status_code == 404
    assert refused.json()["error"] == "not_found" and refused.json()["tasks"] == [theirs, 999_999]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"tasks": []}, 422, "tasks"),
        ({"tasks": "1,2"}, 422, "tasks"),
        ({"tasks": [1, "2"]}, 422, "tasks"),
        ({"tasks": [True]}, 422, "tasks"),
        ({"tasks": [0]}, 422, "tasks"),
        ({}, 422, "tasks"),
        ({"tasks": [1], "timeout": "soon"}, 422, "timeout"),
        ({"tasks": [1], "timeout": 600}, 422, "timeout"),
        ([1, 2], 400, None),
    ],
)
def test_a_watch_of_many_refuses_bad_input_naming_the_field(live_server, runtime_token, body, status, field):
    _, token = runtime_token
    answer = httpx.post(live_server.url + "/api/v1/watch", json=body, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == status
    assert answer.json().get("field") == field


def test_a_watch_of_many_is_a_post(live_server, runtime_token):
    _, token = runtime_token
    answer = httpx.get(live_server.url + "/api/v1/watch", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 405 and answer.headers["Allow"] == "POST"


def test_the_web_door_sends_a_watch_of_many_to_the_watch_server(live_server, settings):
    settings.STOPDESK_WATCH_URL = "http://watch.example:8001"
    answer = httpx.post(live_server.url + "/api/v1/watch", json={"tasks": [1]}, headers={"Authorization": "Bearer x"})
    assert answer.status_code == 307
    assert answer.headers["Location"] == "http://watch.example:8001/api/v1/watch"
    assert answer.json()["watch_url"] == "http://watch.example:8001"


def _recording_watch_http(sent: list[str]) -> httpx.AsyncClient:
    async def record(request: httpx.Request) -> None:
        sent.append(request.url.path)

    return httpx.AsyncClient(timeout=30, event_hooks={"request": [record]})


def test_the_async_client_watches_all_its_tasks_on_one_poll(live_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 20)
    sent: list[str] = []

    async def main() -> list[float]:
        watch_http = _recording_watch_http(sent)
        async with AsyncClient(live_server.url, token, watch_http=watch_http) as sd:
            watches = [asyncio.ensure_future(sd.watch_stop(t, poll_s=20)) for t in tasks]
            await asyncio.sleep(0.5)
            assert not any(w.done() for w in watches), "answered before any Stop"
            started = time.monotonic()
            stoppers = [stop_later(t, 0.0) for t in tasks]
            infos = await asyncio.wait_for(asyncio.gather(*watches), 10)
            heard = time.monotonic() - started
            for stopper in stoppers:
                stopper.join()
        await watch_http.aclose()
        assert [i.task for i in infos] == tasks and all(i.stopped for i in infos)
        return [heard]

    [heard] = asyncio.run(main())
    assert heard < 5
    assert sent and set(sent) == {"/api/v1/watch"}, "every watch went on the poll of many"
    assert len(sent) < len(tasks), f"{len(sent)} polls for {len(tasks)} watches"


def test_the_async_clients_poll_ends_a_refused_watch_and_keeps_the_others(live_server, runtime_token):
    runtime, token = runtime_token
    [mine] = _tasks(runtime, 1)
    other, _ = runtime_create(name="someone-else", actor="test")
    theirs = task_create(title="theirs", actor="test", runtime=other).pk

    async def main() -> None:
        async with AsyncClient(live_server.url, token) as sd:
            kept = asyncio.ensure_future(sd.watch_stop(mine, poll_s=20))
            with pytest.raises(NotFound):
                await asyncio.wait_for(sd.watch_stop(theirs, poll_s=20), 10)
            assert not kept.done()
            stopper = stop_later(mine, 0.0)
            info = await asyncio.wait_for(kept, 10)
            stopper.join()
            assert info.task == mine and info.stopped

    asyncio.run(main())


@pytest.fixture
def older_server(live_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A server from before the watch of many tasks: /watch is an unknown path (JSON 404); every
    other request is the live server's."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"error": "not_found", "detail": f"No API endpoint at {self.path}."}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            answer = httpx.get(live_server.url + self.path, headers={"Authorization": self.headers["Authorization"]})
            self.send_response(answer.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_async_client_watches_task_by_task_on_a_server_without_the_poll_of_many(older_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 3)
    sent: list[str] = []

    async def main() -> None:
        watch_http = _recording_watch_http(sent)
        async with AsyncClient(older_server, token, watch_http=watch_http) as sd:
            watches = [asyncio.ensure_future(sd.watch_stop(t, poll_s=20)) for t in tasks]
            await asyncio.sleep(0.5)
            assert not any(w.done() for w in watches)
            stoppers = [stop_later(t, 0.0) for t in tasks]
            infos = await asyncio.wait_for(asyncio.gather(*watches), 10)
            for stopper in stoppers:
                stopper.join()
            assert [i.task for i in infos] == tasks and all(i.stopped for i in infos)
            assert not sd._watches.offered
        await watch_http.aclose()

    asyncio.run(main())
    assert sent.count("/api/v1/watch") == 1, "asked once, then remembered"
    assert {f"/api/v1/tasks/{t}/stop/watch" for t in tasks} <= set(sent)


def test_on_stop_is_called_once_on_a_server_without_the_watch_of_many(older_server, runtime_token):
    runtime, token = runtime_token
    [task_id] = _tasks(runtime, 1)
    calls: list[int] = []

    async def main() -> None:
        async with AsyncClient(older_server, token) as sd:
            watch = asyncio.ensure_future(sd.watch_stop(task_id, poll_s=20, on_stop=lambda i: calls.append(i.task)))
            await asyncio.sleep(0.5)
            stopper = stop_later(task_id, 0.0)
            stopper.join()
            info = await asyncio.wait_for(watch, 10)
            assert info.stopped and calls == [task_id]

    asyncio.run(main())
