"""GET /api/v1/tasks/{task_id}/stop/watch?timeout=S: a long poll that answers the moment the task's
Stop commits (`stopped: true`), or after `timeout` seconds with `stopped: false` (watch again).

A waiting watcher is a future on the event loop, woken by the process's one listening connection
(`stopdesk.push.hub`). The token check and the first read of the task run on a small,
fixed pool of threads (so of database connections) shared by every watch, in batches: polls that
arrive together share their queries (`_Reads`). Under the ASGI server
(`python -m stopdesk watch`, uvicorn) `stopdesk.asgi` routes this path to `asgi_watch`, a plain
ASGI handler outside Django's request cycle, which would otherwise hold a thread for every request
in flight: a thousand watchers then cost no threads and no connections, and no query while a poll
waits. Each poll does cost queries: the health check of its thread's connection, the token, the
task (3; fewer each when polls arrive together and share a batch). At the clients' poll of 25 s an
idle watcher costs at most about 432 queries an hour (434 measured, polls apart)
(`BENCH=watch_idle python -m bench`).
The Django view (`watch_stop`) is the web door's: with a watch server configured
(`STOPDESK_WATCH_URL`) it answers at once with a 307 naming it (`elsewhere`), which the clients
follow and remember, so no watch holds a page-serving thread; without one it serves the same
answers itself under WSGI, one thread per watcher (tests, a single-process deployment).

POST /api/v1/watch {"tasks": [ids], "timeout": S} is the same watch for many tasks in one long poll
(`answer_many`): it answers `{"stopped": [...]}` the moment any of them is stopped (with every one
stopped by then), or `{"stopped": []}` after `timeout`. A client watching a thousand runs holds one
request, not a thousand, so a Stop of all of them reaches it as a few answers, not a thousand at once.
The same rules as one task's watch: the token may watch only its runtime's tasks (404 naming the
others in `tasks`), and the web door sends it on to the watch server (307) the same way. Its first
read is one batch of its own (`_read_many`), the same 3 queries however many tasks it names, so an
idle client costs its 3 queries a poll, not a poll's worth per task; polls of many tasks that
arrive together are not gathered into one batch as one task's are.

With `"stream": true` the watch server (`asgi_watch_many`) keeps that one request open instead of
answering once: a first line once the tasks are read and watched (those already stopped, or none),
then a line the moment any of them stops, each line the same `{"stopped": [...]}` as a poll's
answer (newline-delimited JSON, `application/x-ndjson`), until every task is stopped or `timeout`
passes, when the response ends and the client asks again. A client watching a thousand runs then
hears each Stop as one short line on a request already waiting, not as an answer after which it
must ask again with every task still watched (the tasks registered and read again, each time, while
the next Stop waits). The web door serving watches itself (WSGI, no watch server) answers such a
request as a long poll, one JSON answer; clients read either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, quote

from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from stopdesk.asgi_io import read_body, request_headers, send_json
from stopdesk.models import Task
from stopdesk.protocol.errors import (
    InvalidRequest,
    MalformedRequest,
    MethodNotAllowed,
    NotFound,
    StopdeskError,
)
from stopdesk.protocol.ids import path_id
from stopdesk.protocol.types import StopWatchInfo
from stopdesk.push.hub import resolve, stop_hub
from stopdesk.services.runtimes import runtime_for
from stopdesk.services.sql import close_thread_connections

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 25.0
MAX_TIMEOUT_S = 55.0  # under the usual 60 s idle timeout of proxies in front
PATH = "/tasks/{task_id}/stop/watch"
MANY_PATH = "/watch"
MAX_TASKS = 10_000  # tasks in one poll: a bound on one request's size (about 70 kB of ids)
DB_THREADS = 4
BATCH_MAX = 500  # first reads per query: a bound on one query's size, not on how many wait
# The watches' database work (token, scope, first read): a few threads, so a few connections, for
# any number of watchers.
_db = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="stopdesk-watch-db")
SERVER_ERROR = {"error": "server_error", "detail": "Internal error; nothing was written."}


# A watch's answer, whichever server it goes through: its status, JSON body and headers (a
# refusal's own, `StopdeskError.headers`).
Answer = tuple[int, dict[str, Any], list[tuple[str, str]]]


async def answer(*, method: str, authorization: str, task_id: str, timeout: str | None) -> Answer:
    """The answer to one watch request, whichever server it came through."""
    try:
        if method != "GET":
            raise MethodNotAllowed("Use GET here.", allow=["GET"])
        seconds = _timeout(timeout)
        pk = path_id(task_id, "task_id")
        return 200, (await _watch(authorization, pk, seconds)).to_json(), []
    except StopdeskError as exc:
        return exc.status, exc.to_json(), exc.headers()
    except Exception:
        log.exception("stop watch for task %s failed", task_id)
        return 500, SERVER_ERROR, []


async def answer_many(*, method: str, authorization: str, body: bytes) -> Answer:
    """The answer to one watch of many tasks, whichever server it came through."""
    try:
        if method != "POST":
            raise MethodNotAllowed("Use POST here.", allow=["POST"])
        tasks, seconds, _ = _many_request(body)  # one answer here, streamed or not (the WSGI door)
        stopped = await _watch_many(authorization, tasks, seconds)
        return 200, _stopped_body(stopped), []
    except StopdeskError as exc:
        return exc.status, exc.to_json(), exc.headers()
    except Exception:
        log.exception("stop watch of many tasks failed")
        return 500, SERVER_ERROR, []


def _stopped_body(stopped: list[StopWatchInfo]) -> dict[str, Any]:
    return {"stopped": [info.to_json() for info in stopped]}


@csrf_exempt
async def watch_stop(request: HttpRequest, task_id: str) -> JsonResponse:
    # A look with no wait (`timeout=0`, the clients' `task_stopped`) is one indexed read that holds
    # no thread, so the web door answers it itself; only a watch that waits goes to the watch server.
    if settings.STOPDESK_WATCH_URL and request.method == "GET" and not _no_wait(request.GET.get("timeout")):
        return elsewhere(settings.STOPDESK_WATCH_URL, task_id, request.META.get("QUERY_STRING", ""))
    status, body, headers = await answer(
        method=request.method or "",
        authorization=request.headers.get("Authorization", ""),
        task_id=task_id,
        timeout=request.GET.get("timeout"),
    )
    return _json_response(status, body, headers)


@csrf_exempt
async def watch_many(request: HttpRequest) -> JsonResponse:
    if settings.STOPDESK_WATCH_URL and request.method == "POST":
        return elsewhere(settings.STOPDESK_WATCH_URL, None, "")
    status, body, headers = await answer_many(
        method=request.method or "", authorization=request.headers.get("Authorization", ""), body=request.body
    )
    return _json_response(status, body, headers)


def _no_wait(timeout: str | None) -> bool:
    try:
        return timeout is not None and float(timeout) == 0
    except ValueError:
        return False  # the watch server refuses it, naming the field


def elsewhere(watch_url: str, task_id: str | None, query: str) -> JsonResponse:
    """The web door's answer when a watch server is configured: at once, no database, no waiting.
    A 307 to the same watch there (one task's, or many's when `task_id` is None); the body names
    the server, which the clients remember."""
    path = MANY_PATH if task_id is None else PATH.format(task_id=quote(task_id, safe=""))
    location = f"{watch_url}/api/v1{path}" + (f"?{query}" if query else "")
    response = JsonResponse(
        {
            "error": "watch_elsewhere",
            "detail": "Stop is watched at the watch server, not here: repeat this request at watch_url.",
            "watch_url": watch_url,
        },
        status=307,
    )
    response["Location"] = location
    return response


async def asgi_watch(scope: dict[str, Any], receive: Any, send: Any, task_id: str) -> None:
    headers = request_headers(scope)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    request = asyncio.ensure_future(
        answer(
            method=scope.get("method", ""),
            authorization=headers.get("authorization", ""),
            task_id=task_id,
            timeout=query.get("timeout", [None])[0],
        )
    )
    await _answer_unless_gone(request, receive, send)


async def _answer_unless_gone(request: asyncio.Future[Answer], receive: Any, send: Any) -> None:
    gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(receive))
    waits: list[asyncio.Future[Any]] = [request, gone]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if not request.done():  # the client left: stop waiting for it
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        return
    gone.cancel()
    await send_json(send, *request.result())


async def asgi_watch_many(scope: dict[str, Any], receive: Any, send: Any) -> None:
    headers = request_headers(scope)
    body = await read_body(receive)
    if body is None:
        return  # the client left before sending its request
    authorization = headers.get("authorization", "")
    streamed = _stream_asked(body) if scope.get("method") == "POST" else None
    if streamed is not None:
        await _stream_many(authorization, *streamed, receive, send)
        return
    request = asyncio.ensure_future(answer_many(method=scope.get("method", ""), authorization=authorization, body=body))
    await _answer_unless_gone(request, receive, send)


def _stream_asked(body: bytes) -> tuple[list[int], float] | None:
    """The tasks and timeout of a well-formed request asking for a stream; None for any other (a
    malformed one is refused as a poll's answer)."""
    try:
        tasks, seconds, stream = _many_request(body)
    except StopdeskError:
        return None
    return (tasks, seconds) if stream else None


STREAM_HEADERS = [
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-store"),
    # A proxy in front (nginx) would otherwise hold the lines back in its buffer.
    (b"x-accel-buffering", b"no"),
]


async def _stream_many(authorization: str, tasks: list[int], seconds: float, receive: Any, send: Any) -> None:
    """The watch of many tasks as one open response: a line when the watch begins, then a line
    as each Stop commits (the Stops of one commit on one line), until all are stopped or the
    timeout passes. A refusal (token, tasks) is the poll's JSON answer, before any line."""
    loop = asyncio.get_running_loop()
    pushed: list[StopWatchInfo] = []
    woken = asyncio.Event()

    def wake(task_id: int, at: datetime | None) -> None:
        loop.call_soon_threadsafe(_pushed_line, pushed, woken, StopWatchInfo(task_id, True, at))

    hub = stop_hub()
    unwatch = [hub.watch(task_id, wake) for task_id in tasks]  # watch first, then read, as a poll does
    gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(receive))
    try:
        first = asyncio.ensure_future(_read_all(authorization, tasks))
        await asyncio.wait([first, gone], return_when=asyncio.FIRST_COMPLETED)
        if not first.done():  # the client left during the first read
            first.cancel()
            return
        try:
            stopped = first.result()
        except StopdeskError as exc:
            await send_json(send, exc.status, exc.to_json(), exc.headers())
            return
        except Exception:
            log.exception("stop watch of many tasks failed")
            await send_json(send, 500, SERVER_ERROR)
            return
        await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
        await _send_line(send, stopped)  # even empty: the client knows its tasks are watched
        left = set(tasks) - {info.task for info in stopped}
        deadline = loop.time() + seconds
        while left:
            if not pushed:
                waiting = asyncio.ensure_future(woken.wait())
                await asyncio.wait([waiting, gone], timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if gone.done():
                    return  # the client left: nothing more to send
                if not pushed:
                    break  # the timeout: the response ends, the client asks again
                await asyncio.sleep(0)  # the other Stops of the same commit, already queued on the loop
            line = [info for info in pushed if info.task in left]  # each task once (read, then pushed)
            pushed.clear()
            woken.clear()
            if line:
                left.difference_update(info.task for info in line)
                await _send_line(send, line)
        await send({"type": "http.response.body", "body": b""})
    finally:
        gone.cancel()
        for forget in unwatch:
            forget()


def _pushed_line(pushed: list[StopWatchInfo], woken: asyncio.Event, info: StopWatchInfo) -> None:
    pushed.append(info)
    woken.set()


async def _send_line(send: Any, stopped: list[StopWatchInfo]) -> None:
    line = json.dumps(_stopped_body(stopped)).encode() + b"\n"
    await send({"type": "http.response.body", "body": line, "more_body": True})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _watch(authorization: str, task_id: int, timeout: float) -> StopWatchInfo:
    loop = asyncio.get_running_loop()
    pushed: asyncio.Future[datetime | None] = loop.create_future()

    def wake(_: int, at: datetime | None) -> None:
        loop.call_soon_threadsafe(resolve, pushed, at)

    # Watch first, then read: a Stop that commits in between is seen by one or the other.
    unwatch = stop_hub().watch(task_id, wake)
    try:
        requested_at = await _read(authorization, task_id)
        if requested_at is not None:
            return StopWatchInfo(task_id, True, requested_at)
        with contextlib.suppress(TimeoutError):
            return StopWatchInfo(task_id, True, await asyncio.wait_for(pushed, timeout))
        return StopWatchInfo(task_id, False)
    finally:
        unwatch()


async def _watch_many(authorization: str, tasks: list[int], timeout: float) -> list[StopWatchInfo]:
    loop = asyncio.get_running_loop()
    pushed: list[StopWatchInfo] = []
    woken: asyncio.Future[None] = loop.create_future()

    def wake(task_id: int, at: datetime | None) -> None:
        loop.call_soon_threadsafe(_pushed, pushed, woken, StopWatchInfo(task_id, True, at))

    hub = stop_hub()
    unwatch = [hub.watch(task_id, wake) for task_id in tasks]  # watch first, then read, as above
    try:
        stopped = await _read_all(authorization, tasks)
        if stopped:
            return stopped
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken, timeout)
            await asyncio.sleep(0)  # the other Stops of the same commit, already queued on the loop
        return pushed
    finally:
        for forget in unwatch:
            forget()


def _pushed(pushed: list[StopWatchInfo], woken: asyncio.Future[None], info: StopWatchInfo) -> None:
    pushed.append(info)
    resolve(woken)


async def _read_all(authorization: str, tasks: list[int]) -> list[StopWatchInfo]:
    """The tasks already stopped; refuses the whole watch if the token may not watch any of them."""
    # One read for the lot (it is a batch already), not one queued read per task.
    answers = await asyncio.get_running_loop().run_in_executor(_db, _read_many, [(authorization, t) for t in tasks])
    refusal = next((a for a in answers if isinstance(a, BaseException) and not isinstance(a, NotFound)), None)
    if refusal is not None:
        raise refusal
    unknown = [task_id for task_id, a in zip(tasks, answers, strict=True) if isinstance(a, NotFound)]
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
        raise NotFound(f"No task {shown}.", field="tasks", tasks=unknown)
    return [StopWatchInfo(t, True, at) for t, at in zip(tasks, answers, strict=True) if isinstance(at, datetime)]


class _Reads:
    """The watches' first reads (token, scope, stop state), gathered per event loop: whatever waits
    when one of the DB_THREADS is free goes in one batch, so a thousand polls arriving at once (a
    client's watches all re-polling together) cost a few queries and milliseconds, not three
    queries each, one after another, while their Stop waits behind the queue."""

    def __init__(self) -> None:
        self.waiting: list[tuple[str, int, asyncio.Future[Any]]] = []
        self.draining = 0

    async def read(self, authorization: str, task_id: int) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting.append((authorization, task_id, done))
        if self.draining < DB_THREADS:
            self.draining += 1
            asyncio.get_running_loop().create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        try:
            while self.waiting:
                batch, self.waiting = self.waiting[:BATCH_MAX], self.waiting[BATCH_MAX:]
                asks = [(authorization, task_id) for authorization, task_id, _ in batch]
                try:
                    answers = await asyncio.get_running_loop().run_in_executor(_db, _read_many, asks)
                except Exception as exc:  # the database failed them all: each request answers 500
                    answers = [exc] * len(batch)
                for (_, _, done), answer in zip(batch, answers, strict=True):
                    if done.done():
                        continue  # its client left
                    if isinstance(answer, BaseException):
                        done.set_exception(answer)
                    else:
                        done.set_result(answer)
        finally:
            self.draining -= 1


_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reads] = weakref.WeakKeyDictionary()


def _read(authorization: str, task_id: int) -> Awaitable[Any]:
    """The stop time of the task the token may watch (None: not stopped); raises like the API."""
    loop = asyncio.get_running_loop()
    reads = _reads.get(loop)
    if reads is None:
        reads = _reads[loop] = _Reads()
    return reads.read(authorization, task_id)


def _read_many(asks: list[tuple[str, int]]) -> list[Any]:
    """One batch, on a DB thread: each distinct token once, the tasks in one query. Each answer is
    the task's stop time, or the refusal that request gets."""
    close_old_connections()  # these threads see no request signals: check the connection here
    runtimes: dict[str, Any] = {}
    for authorization in {authorization for authorization, _ in asks}:
        try:
            runtimes[authorization] = runtime_for(authorization).pk
        except StopdeskError as exc:
            runtimes[authorization] = exc
    ids = {task_id for _, task_id in asks}
    tasks = {
        pk: (runtime_id, stopped)
        for pk, runtime_id, stopped in Task.objects.filter(pk__in=ids).values_list(
            "pk", "runtime_id", "stop_requested_at"
        )
    }
    answers: list[Any] = []
    for authorization, task_id in asks:
        runtime = runtimes[authorization]
        found = tasks.get(task_id)
        if isinstance(runtime, StopdeskError):
            answers.append(runtime)
        elif found is None or found[0] != runtime:
            answers.append(NotFound(f"No task {task_id}."))
        else:
            answers.append(found[1])
    return answers


def _timeout(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_TIMEOUT_S:
        raise InvalidRequest(f"timeout must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}.", field="timeout")
    return value


def _many_request(raw: bytes) -> tuple[list[int], float, bool]:
    """The task ids (distinct, in order), the timeout and whether a stream is asked, of a watch of
    many tasks; 4xx naming the field."""
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise MalformedRequest('The body must be a JSON object: {"tasks": [ids], "timeout": seconds}.')
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not 1 <= len(tasks) <= MAX_TASKS:
        raise InvalidRequest(f"tasks must be a list of 1 to {MAX_TASKS} task ids.", field="tasks")
    if not all(type(t) is int and t > 0 for t in tasks):
        raise InvalidRequest("tasks must hold task ids (positive integers).", field="tasks")
    timeout = body.get("timeout")
    if timeout is not None and (type(timeout) not in (int, float)):
        raise InvalidRequest(f"timeout must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}.", field="timeout")
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise InvalidRequest("stream must be true or false.", field="stream")
    return list(dict.fromkeys(tasks)), _timeout(None if timeout is None else str(timeout)), stream


def _json_response(status: int, body: dict[str, Any], headers: list[tuple[str, str]]) -> JsonResponse:
    response = JsonResponse(body, status=status)
    for name, value in headers:
        response[name] = value
    return response


def close_connections() -> None:
    """Close the database connections the watch threads hold (tests, before dropping the database)."""
    close_thread_connections(_db, DB_THREADS)
