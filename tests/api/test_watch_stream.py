"""The watch of many tasks as a stream (POST /watch with "stream": true, served by the watch
server): one request stays open and carries a line the moment each Stop commits, so a client
watching many runs never asks again (re-sending, and the server re-reading, every task still
watched) between one Stop and the next. The watch server runs for real here: uvicorn on loopback
serving `stopdesk.asgi`, in this process, so it listens on the test database."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.db import connection

from stopdesk.client import AsyncClient
from stopdesk.push.hub import stop_hub
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from tests.api.watching import NO_DISPATCH, stop_later, watch_server_running

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
NDJSON = "application/x-ndjson"


@pytest.fixture
def watch_server() -> Iterator[str]:
    with watch_server_running() as url:
        yield url


def _tasks(runtime, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    return [task_create(title=f"run {i}", actor="test", runtime=runtime).pk for i in range(n)]


def _stopped(line: str) -> list[int]:
    return [info["task"] for info in json.loads(line)["stopped"]]


def _stop_closing(task_id: int) -> None:
    try:
        task_request_stop(task_id=task_id, actor="user:operator", **NO_DISPATCH)
    finally:
        connection.close()


def test_the_watch_server_streams_a_line_as_each_task_stops_on_the_one_request(watch_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 3)
    task_request_stop(task_id=tasks[0], actor="test", **NO_DISPATCH)
    body = {"tasks": tasks, "timeout": 20, "stream": True}
    with (
        httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        http.stream("POST", watch_server + "/watch", json=body) as response,
    ):
        assert response.status_code == 200 and response.headers["content-type"] == NDJSON
        lines = response.iter_lines()
        assert _stopped(next(lines)) == [tasks[0]]  # the first line: watched now, this one already stopped
        heard = []
        for task_id in tasks[1:]:
            stopper = stop_later(task_id, 0.3)
            asked = time.monotonic()
            line = json.loads(next(lines))
            heard.append(time.monotonic() - asked)
            stopper.join()
            [info] = line["stopped"]
            assert info["task"] == task_id and info["stopped"] is True and info["stop_requested_at"]
        ended = time.monotonic()
        assert [line for line in lines if line.strip()] == []  # every task stopped: the response ends
        assert time.monotonic() - ended < 5, "ended once all were stopped, not at the 20 s timeout"
    assert all(0.25 < h < 5 for h in heard), heard  # by push, on the request already open


def test_a_stream_ends_at_its_timeout_with_only_its_first_line(watch_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 2)
    started = time.monotonic()
    answer = httpx.post(
        watch_server + "/watch",
        json={"tasks": tasks, "timeout": 0.5, "stream": True},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 200 and answer.headers["content-type"] == NDJSON
    assert answer.text.splitlines() == ['{"stopped": []}']
    assert 0.4 < time.monotonic() - started < 5


def test_a_stream_is_refused_as_a_poll_is_before_any_line(watch_server, live_server, runtime_token):
    runtime, token = runtime_token
    mine = _tasks(runtime, 1)
    other, _ = runtime_create(name="someone-else", actor="test")
    theirs = task_create(title="theirs", actor="test", runtime=other).pk
    headers = {"Authorization": f"Bearer {token}"}
    url = watch_server + "/watch"
    anonymous = httpx.post(url, json={"tasks": mine, "stream": True})
    assert anonymous.status_code == 401 and anonymous.headers["content-type"] == "application/json"
    refused = httpx.post(url, json={"tasks": [*mine, theirs], "stream": True}, headers=headers)
    assert refused.status_code == 404 and refused.json()["tasks"] == [theirs]
    for door in (watch_server, live_server.url + "/api/v1"):  # both doors read the field the same way
        bad = httpx.post(door + "/watch", json={"tasks": mine, "stream": "yes"}, headers=headers)
        assert bad.status_code == 422 and bad.json()["field"] == "stream", door


def test_the_web_door_answers_a_stream_request_as_one_long_poll(live_server, runtime_token):
    """Without a watch server the web door serves the watch itself, one answer per request."""
    runtime, token = runtime_token
    tasks = _tasks(runtime, 2)
    task_request_stop(task_id=tasks[1], actor="test", **NO_DISPATCH)
    answer = httpx.post(
        live_server.url + "/api/v1/watch",
        json={"tasks": tasks, "timeout": 5, "stream": True},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert [i["task"] for i in answer.json()["stopped"]] == [tasks[1]]


def test_stops_racing_the_streams_first_read_are_each_told_once(watch_server, runtime_token):
    """Stops committed from many threads while the stream registers, reads and waits: each task is
    on exactly one line (whether its Stop was read or pushed), none is lost, and the stream ends."""
    runtime, token = runtime_token
    tasks = _tasks(runtime, 60)
    shares = [tasks[n::6] for n in range(6)]
    go = threading.Event()

    def stopper(share: list[int]) -> None:
        go.wait()
        for task_id in share:
            _stop_closing(task_id)

    threads = [threading.Thread(target=stopper, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    told: list[int] = []
    with (
        httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        http.stream("POST", watch_server + "/watch", json={"tasks": tasks, "timeout": 30, "stream": True}) as response,
    ):
        go.set()  # the stops begin while the request is on its way and its watches are registered
        for line in response.iter_lines():
            if line.strip():
                told.extend(_stopped(line))
    for thread in threads:
        thread.join()
    assert sorted(told) == sorted(tasks), "each task once"


def test_a_client_that_leaves_a_stream_leaves_no_watch_behind(watch_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 5)
    hub = stop_hub()
    before = hub.watching()
    with (
        httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        http.stream("POST", watch_server + "/watch", json={"tasks": tasks, "timeout": 30, "stream": True}) as response,
    ):
        lines = response.iter_lines()  # kept: a line iterator dropped closes the response
        assert _stopped(next(lines)) == []
        assert hub.watching() == before + len(tasks)
    deadline = time.monotonic() + 5
    while hub.watching() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.watching() == before


def _recording(sent: list[tuple[float, str]]) -> httpx.AsyncClient:
    async def record(request: httpx.Request) -> None:
        sent.append((time.monotonic(), request.url.path))

    return httpx.AsyncClient(timeout=30, event_hooks={"request": [record]})


def test_the_async_client_hears_stop_after_stop_on_one_streamed_request(
    live_server, watch_server, runtime_token, settings
):
    """Through the web door (307 to the watch server, as deployed): twenty Stops, one every 50 ms,
    each heard by push, and not one new request to the watch server between them."""
    settings.STOPDESK_WATCH_URL = watch_server.removesuffix("/api/v1")
    runtime, token = runtime_token
    tasks = _tasks(runtime, 20)
    sent: list[tuple[float, str]] = []

    async def main() -> tuple[float, list[int]]:
        watch_http = _recording(sent)
        async with AsyncClient(live_server.url, token, watch_http=watch_http) as sd:
            watches = [asyncio.ensure_future(sd.watch_stop(t, poll_s=20)) for t in tasks]
            deadline = time.monotonic() + 10
            while sd._watches.polling < len(tasks):
                assert time.monotonic() < deadline, "the tasks never went on one request"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the request's first line read: its tasks are watched
            watching_since = time.monotonic()
            for task_id in tasks:
                await asyncio.to_thread(_stop_closing, task_id)
                await asyncio.sleep(0.05)
            infos = await asyncio.wait_for(asyncio.gather(*watches), 10)
        await watch_http.aclose()
        return watching_since, [i.task for i in infos if i.stopped]

    watching_since, heard = asyncio.run(main())
    assert heard == tasks
    to_watch_server = [at for at, path in sent if path == "/api/v1/watch"]
    assert to_watch_server, "the watches went through /watch"
    assert [at for at in to_watch_server if at > watching_since] == [], "no new request between the Stops"


@pytest.fixture
def silent_stream_server() -> Iterator[tuple[str, list[float]]]:
    """A server whose /watch answers 200 with an empty stream: a broken proxy, or a server that
    died before its first line."""
    asked: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            asked.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Type", NDJSON)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_stream_that_ends_before_its_first_line_is_asked_again_after_a_pause(silent_stream_server):
    url, asked = silent_stream_server

    async def main() -> None:
        async with AsyncClient(url, "token", watch_url=url, backoff_seconds=0.2) as sd:
            watch = asyncio.ensure_future(sd.watch_stop(1, poll_s=20))
            await asyncio.sleep(1.5)
            assert not watch.done()
            watch.cancel()

    asyncio.run(main())
    assert 2 <= len(asked) <= 8, f"{len(asked)} requests in 1.5 s: asked again with backoff, not in a loop"


@pytest.fixture
def buffering_proxy(live_server) -> Iterator[tuple[str, list[bool]]]:  # type: ignore[no-untyped-def]
    """A proxy in front of the web door (which serves watches itself) that, like a buffering
    proxy, keeps a streamed answer's lines until the response ends: a request asking for a stream
    gets the stream's headers and then nothing. Any other request is the live server's. Records
    whether each /watch asked for a stream."""
    asked: list[bool] = []
    closing = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            stream = bool(json.loads(body).get("stream"))
            asked.append(stream)
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", NDJSON)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                closing.wait(30)  # the lines would come at the end
                return
            answer = httpx.post(
                live_server.url + self.path,
                content=body,
                headers={"Authorization": self.headers["Authorization"], "Content-Type": "application/json"},
                timeout=60,
            )
            self.send_response(answer.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        closing.set()
        server.shutdown()
        server.server_close()


def test_a_stream_held_back_on_the_way_makes_the_client_poll_instead(buffering_proxy, runtime_token):
    url, asked = buffering_proxy
    runtime, token = runtime_token
    [task_id] = _tasks(runtime, 1)

    async def main() -> float:
        async with AsyncClient(url, token, watch_url=url) as sd:
            sd._watches.first_line_s = 0.5
            watch = asyncio.ensure_future(sd.watch_stop(task_id, poll_s=20))
            await asyncio.sleep(1.5)  # the stream's first line never came: a poll of its own now waits
            assert not watch.done()
            asked_at = time.monotonic()
            await asyncio.to_thread(_stop_closing, task_id)
            info = await asyncio.wait_for(watch, 10)
            assert info.task == task_id and info.stopped
            return time.monotonic() - asked_at

    heard = asyncio.run(main())
    assert asked == [True, False], "one stream, then polls, remembered"
    assert heard < 5, "by the poll's push, not at the end of a held stream"


def test_on_stop_is_called_as_the_answer_is_read_not_when_watch_stop_resumes(watch_server, runtime_token):
    runtime, token = runtime_token
    tasks = _tasks(runtime, 2)
    calls: list[tuple[int, bool]] = []

    async def main() -> None:
        async with AsyncClient(watch_server.removesuffix("/api/v1"), token, watch_url=watch_server) as sd:
            watches: dict[int, asyncio.Task[object]] = {}

            def heard(info) -> None:  # type: ignore[no-untyped-def]
                # Called by the task reading the client's one request, before the watch resumes.
                calls.append((info.task, asyncio.current_task() is watches[info.task]))

            for task_id in tasks:
                watches[task_id] = asyncio.ensure_future(sd.watch_stop(task_id, poll_s=20, on_stop=heard))
            await asyncio.sleep(0.5)
            for task_id in tasks:
                await asyncio.to_thread(_stop_closing, task_id)
            infos = await asyncio.wait_for(asyncio.gather(*watches.values()), 10)
            assert [i.task for i in infos] == tasks

    asyncio.run(main())
    assert sorted(calls) == [(tasks[0], False), (tasks[1], False)], "once each, from the reader"


def test_a_runs_cancel_starts_as_the_clients_watch_reads_the_stop(live_server, watch_server, runtime_token, settings):
    """StopdeskRun over the HTTP client: the run's work is cancelled from the turn that read the
    Stop, so it gets its CancelledError before the run's own watch coroutine has even resumed."""
    from stopdesk.agent.frameworks.core import RunStopped, StopdeskRun

    settings.STOPDESK_WATCH_URL = watch_server.removesuffix("/api/v1")
    runtime, token = runtime_token
    [task_id] = _tasks(runtime, 1)
    seen: dict[str, bool] = {}

    async def main() -> None:
        async with (
            AsyncClient(live_server.url, token) as sd,
            StopdeskRun(sd, task_id, framework="test", agent="waiting") as run,
        ):

            async def work() -> None:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    assert run._watcher is not None
                    seen["watcher_done"] = run._watcher.done()
                    raise

            async def stop_soon() -> None:
                await asyncio.sleep(0.5)
                await asyncio.to_thread(_stop_closing, task_id)

            stopper = asyncio.ensure_future(stop_soon())
            with pytest.raises(RunStopped):
                await asyncio.wait_for(run.run(work()), 10)
            await stopper

    asyncio.run(main())
    assert seen == {"watcher_done": False}
