"""Waiting for a task's Stop over HTTP: long polls of GET /tasks/{id}/stop/watch, which the server
answers the moment the stop request commits.

A web door with a watch server configured answers a watch at once with a 307 naming that server
(`watch_url`); the client then watches there, and every later watch of the client goes there
directly. Watches use connection pools of their own (`WatchPools`: no connection limit, at most 32 watches
a pool), so a thousand of them never queue the client's other calls behind them.

`Client.watch_stop(task_id)` returns a `StopWatch`, set like a `threading.Event` (one daemon thread
long-polls); `AsyncClient.watch_stop(task_id)` is awaited and returns when Stop commits. Lost
connections and 5xx answers are retried with backoff: a watch is a read, safe to repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NamedTuple, Protocol

import httpx

from stopdesk.client.calls import Call
from stopdesk.client.transport import api_base, backoff, read_answer
from stopdesk.protocol.errors import ServerError, StopdeskError
from stopdesk.protocol.types import StopWatchInfo


class WatchPools[H: (httpx.Client, httpx.AsyncClient)]:
    """The watches' connections, apart from the client's other calls, in pools of at most
    PER_POOL watches each (more pools as more watches wait). httpcore's pool does work that grows
    with the square of its connections on every request, so one pool of a thousand long polls
    spends seconds of CPU whenever they re-poll together, and Stop waits behind that."""

    PER_POOL = 32

    def __init__(self, make: Callable[[], H], *, given: H | None = None) -> None:
        self._make: Callable[[], H] = make
        self._given: H | None = given  # the caller's own client: every watch uses it, and it is not closed here
        self._lock = threading.Lock()
        self._pools: list[list[Any]] = []  # [client, watches using it]

    @contextlib.contextmanager
    def lease(self) -> Iterator[H]:
        if self._given is not None:
            yield self._given
            return
        with self._lock:
            entry = next((e for e in self._pools if e[1] < self.PER_POOL), None)
            if entry is None:
                entry = [self._make(), 0]
                self._pools.append(entry)
            entry[1] += 1
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1

    def owned(self) -> list[H]:
        """The pools made here, for the client to close."""
        with self._lock:
            return [entry[0] for entry in self._pools]


class Client(Protocol):
    watch_base: str
    watch_pools: WatchPools[httpx.Client]
    backoff_seconds: float


class AsyncClient(Protocol):
    watch_base: str
    watch_pools: WatchPools[httpx.AsyncClient]
    backoff_seconds: float


POLL_S = 25.0
SLACK_S = 10.0  # the HTTP timeout is the poll plus this, so the server always answers first
HOPS = 3  # 307s in a row before a watch gives up: servers that send watches round in a circle


def moved_to(response: httpx.Response) -> str | None:
    """The watch server a web door's 307 names (`watch_url`), if this answer is one."""
    if response.status_code != 307:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    url = body.get("watch_url") if isinstance(body, dict) else None
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def follow(client: Client | AsyncClient, response: httpx.Response, hops: int) -> bool:
    """Remember the watch server a 307 names, for this and every later watch of the client.
    Returns whether the answer was one; raises when the hops run out."""
    moved = moved_to(response)
    if moved is None:
        return False
    if hops >= HOPS:
        raise StopdeskError(f"The watch was sent on {hops} times; last to {moved}.", code="watch_redirect_loop")
    client.watch_base = api_base(moved)
    return True


def watch_call(task_id: int) -> Call[StopWatchInfo]:
    return Call("GET", f"/tasks/{task_id}/stop/watch", None, StopWatchInfo.from_json, safe=True)


class StopWatch:
    """Set once the task's Stop committed. `wait(timeout)` and `is_set()` as on threading.Event;
    `info` then holds the answer. A refusal (unknown task, revoked token) ends the watch unset,
    with `error` saying why."""

    def __init__(self, client: Client, task_id: int, *, poll_s: float = POLL_S) -> None:
        self.task_id = task_id
        self.info: StopWatchInfo | None = None
        self.error: StopdeskError | None = None
        self._client = client
        self._poll_s = poll_s
        self._stopped = threading.Event()
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name=f"stopdesk-watch-{task_id}", daemon=True)
        self._thread.start()

    def is_set(self) -> bool:
        return self._stopped.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, from the watch's thread when Stop is seen (at once if it was): an
        event loop awaits Stop with it instead of looking."""
        with self._lock:
            if not self._stopped.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def cancel(self) -> None:
        """Stop watching (the current long poll is abandoned by the server at its timeout)."""
        self._ended.set()

    def _run(self) -> None:
        with self._client.watch_pools.lease() as http:
            self._watch(http)

    def _watch(self, http: httpx.Client) -> None:
        call = watch_call(self.task_id)
        attempt = hops = 0
        while not self._ended.is_set():
            try:
                response = _poll(http, self._client.watch_base + call.path, self._poll_s)
                if response is None:
                    return  # the client was closed: its watches end with it
                if follow(self._client, response, hops):
                    hops += 1
                    continue
                info = read_answer(call, response)
            except (httpx.TransportError, ServerError):
                time.sleep(min(backoff(attempt, self._client.backoff_seconds), 5.0))
                attempt += 1
                continue
            except StopdeskError as exc:
                self.error = exc
                self._ended.set()
                return
            attempt = hops = 0
            if info.stopped:
                self._set(info)
                return

    def _set(self, info: StopWatchInfo) -> None:
        self.info = info
        with self._lock:
            self._stopped.set()
            callbacks, self._callbacks = self._callbacks, []
        self._ended.set()
        for callback in callbacks:
            callback()


def _poll(http: httpx.Client, url: str, poll_s: float) -> httpx.Response | None:
    try:
        return http.get(url, params={"timeout": poll_s}, timeout=poll_s + SLACK_S)
    except RuntimeError:
        if http.is_closed:
            return None
        raise


async def watch_stop_async(client: AsyncClient, task_id: int, *, poll_s: float = POLL_S) -> StopWatchInfo:
    with client.watch_pools.lease() as http:
        return await _watch_async(client, http, task_id, poll_s)


async def _watch_async(client: AsyncClient, http: httpx.AsyncClient, task_id: int, poll_s: float) -> StopWatchInfo:
    call = watch_call(task_id)
    attempt = hops = 0
    while True:
        url = client.watch_base + call.path
        try:
            response = await http.get(url, params={"timeout": poll_s}, timeout=poll_s + SLACK_S)
            if follow(client, response, hops):
                hops += 1
                continue
            info = read_answer(call, response)
        except (httpx.TransportError, ServerError):
            await asyncio.sleep(min(backoff(attempt, client.backoff_seconds), 5.0))
            attempt += 1
            continue
        attempt = hops = 0
        if info.stopped:
            return info


MANY_MAX = 10_000  # the server's bound on tasks in one watch; watches beyond it poll one task each
OnStop = Callable[[StopWatchInfo], object]


class _Waiter(NamedTuple):
    done: asyncio.Future[StopWatchInfo]
    poll_s: float
    on_stop: OnStop | None


def _heard(info: StopWatchInfo, on_stop: OnStop | None) -> StopWatchInfo:
    if on_stop is not None:
        on_stop(info)
    return info


COALESCE_S = 0.005  # runs that start together join one re-issued poll, not one poll each


class _NotOffered(Exception):
    """The server has no watch of many tasks (an older one): watch each task on its own."""


class AsyncWatches:
    """One AsyncClient's watch_stop calls on one request of POST /watch for all the tasks they
    wait on. It asks for a stream: the watch server then sends a line as each Stop commits, on the
    request already open, so Stops that come one after another (a person stopping task after task,
    a dashboard stopping hundreds) are each one short line, with no new request and no re-read of
    every task still watched in between. A server that answers once instead (the web door serving
    watches itself) is a long poll, asked again after each answer with the tasks still waited on.
    Either is re-issued when a task is added (a new run), and when the stream ends (its timeout). A
    stream whose first line does not come (held back on the way, by a buffering proxy) is
    remembered, and the client long-polls from then on. A server without /watch (404 or 405) is
    remembered, and every watch then long-polls its own task as before."""

    def __init__(self, client: AsyncClient) -> None:
        self.offered = True
        self._client = client
        self._waiting: dict[int, list[_Waiter]] = {}
        self._changed: asyncio.Event | None = None
        self._poller: asyncio.Task[None] | None = None
        self.polling = 0  # tasks in the poll in flight (diagnostics, the bench)
        self.stream = True  # ask for a stream, until one's first line is held back on the way
        self.first_line_s = FIRST_LINE_S

    async def watch(self, task_id: int, poll_s: float, on_stop: OnStop | None = None) -> StopWatchInfo:
        """The task's Stop. `on_stop(info)` is called once before this returns: on the request shared
        by the client's watches, as the answer is read, so what it starts (a run's cancel) does not
        wait for this coroutine's turn on the loop."""
        if not self.offered or (task_id not in self._waiting and len(self._waiting) >= MANY_MAX):
            return _heard(await watch_stop_async(self._client, task_id, poll_s=poll_s), on_stop)
        entry = _Waiter(asyncio.get_running_loop().create_future(), poll_s, on_stop)
        self._waiting.setdefault(task_id, []).append(entry)
        self._wake()
        try:
            return await entry.done
        except _NotOffered:
            return _heard(await watch_stop_async(self._client, task_id, poll_s=poll_s), on_stop)
        finally:
            self._forget(task_id, entry)

    def _wake(self) -> None:
        loop = asyncio.get_running_loop()
        if self._poller is None or self._poller.done() or self._poller.get_loop() is not loop:
            self._changed = asyncio.Event()
            self._poller = loop.create_task(self._poll_while_waited())
        assert self._changed is not None
        self._changed.set()

    def _forget(self, task_id: int, entry: _Waiter) -> None:
        entries = self._waiting.get(task_id, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self._waiting.pop(task_id, None)  # still in the poll under way: harmless, gone at the next
        if not self._waiting and self._changed is not None:
            self._changed.set()  # nothing left to wait on: end the poll now, not at its timeout

    async def _poll_while_waited(self) -> None:
        try:
            with self._client.watch_pools.lease() as http:
                await self._poll_loop(http)
        except BaseException as exc:  # the poller ended early: its waiters must not wait on forever
            self._fail(list(self._waiting), exc if isinstance(exc, Exception) else StopdeskError("The watch ended."))
            raise

    async def _poll_loop(self, http: httpx.AsyncClient) -> None:
        attempt = hops = 0
        while self._waiting and self.offered:
            assert self._changed is not None
            if self._changed.is_set():  # tasks were added: let the runs starting with them join
                await asyncio.sleep(COALESCE_S)
            self._changed.clear()
            tasks = list(self._waiting)
            poll_s = min(entry.poll_s for entries in self._waiting.values() for entry in entries)
            try:
                response = await self._poll_until_changed(http, tasks, poll_s)
                if response is None:  # a stream ended, a task was added (ask again with it), or none is left
                    attempt = hops = 0
                    continue
                if follow(self._client, response, hops):
                    hops += 1
                    continue
                self._answered(tasks, response)
            except (httpx.TransportError, ServerError):
                await asyncio.sleep(min(backoff(attempt, self._client.backoff_seconds), 5.0))
                attempt += 1
                continue
            except StopdeskError as exc:  # sent round in a circle: these watches end with the reason
                self._fail(tasks, exc)
            attempt = hops = 0

    async def _poll_until_changed(
        self, http: httpx.AsyncClient, tasks: list[int], poll_s: float
    ) -> httpx.Response | None:
        """The answer of a poll; None when the tasks changed first or the answer was a stream
        (its Stops already handed out, line by line)."""
        assert self._changed is not None
        body = {"tasks": tasks, "timeout": poll_s, "stream": self.stream}
        poll = asyncio.ensure_future(self._exchange(http, body, poll_s))
        changed = asyncio.ensure_future(self._changed.wait())
        self.polling = len(tasks)
        try:
            await asyncio.wait([poll, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.polling = 0
            changed.cancel()
            if not poll.done():
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poll
        return poll.result() if not poll.cancelled() else None

    async def _exchange(self, http: httpx.AsyncClient, body: dict[str, Any], poll_s: float) -> httpx.Response | None:
        """One request. A stream is read line by line, each line's Stops handed to their waiters as
        it arrives (None once it ends); any other answer is read whole and returned."""
        request = http.build_request("POST", self._client.watch_base + "/watch", json=body, timeout=poll_s + SLACK_S)
        response = await http.send(request, stream=True)
        try:
            if response.status_code != 200 or not response.headers.get("content-type", "").startswith(STREAM_TYPE):
                await response.aread()
                return response
            lines = aiter(response.aiter_lines())
            try:
                # The server sends its first line as soon as the tasks are watched. Held back, it is
                # something in between that keeps the lines until the response ends (a buffering
                # proxy): then Stop would wait for the poll's end, so poll once per answer instead.
                first = await asyncio.wait_for(_next_line(lines), self.first_line_s)
            except TimeoutError:
                self.stream = False
                return None
            if first is None:  # not even the line a watch begins with: ask again after a pause, not at once
                raise ServerError("The watch's stream ended before its first line.", code="bad_response")
            self._deliver(_stream_line(first))
            while (line := await _next_line(lines)) is not None:
                self._deliver(_stream_line(line))
            return None
        finally:
            await response.aclose()

    def _deliver(self, stopped: list[StopWatchInfo]) -> None:
        for info in stopped:
            for entry in self._waiting.pop(info.task, []):
                if entry.done.done():
                    continue
                try:
                    _heard(info, entry.on_stop)
                except Exception as exc:  # the caller's callback failed: its watch_stop raises it
                    entry.done.set_exception(exc)
                else:
                    entry.done.set_result(info)

    def _answered(self, tasks: list[int], response: httpx.Response) -> None:
        """Hand each waiter its answer: its task's Stop, its refusal, or (older server) _NotOffered."""
        body = _json_object(response)
        if response.status_code in (404, 405) and "tasks" not in body:
            self.offered = False
            self._fail(tasks, _NotOffered())
            return
        try:
            stopped = [StopWatchInfo.from_json(info) for info in read_answer(_MANY, response)]
        except StopdeskError as exc:  # refused: the tasks it names, or all of them
            if isinstance(exc, ServerError):
                raise
            named = body.get("tasks")
            self._fail(named if isinstance(named, list) else tasks, exc)
            return
        self._deliver(stopped)

    def _fail(self, tasks: list[int], exc: Exception) -> None:
        for task_id in tasks:
            for entry in self._waiting.pop(task_id, []):
                if not entry.done.done():
                    entry.done.set_exception(exc)


_MANY: Call[list[dict[str, Any]]] = Call("POST", "/watch", None, lambda body: list(body["stopped"]), safe=True)
STREAM_TYPE = "application/x-ndjson"
# A stream's first line comes once the server has read and watched the tasks (milliseconds; under
# heavy load, well under a second). Not here by then, something in between is holding it back.
FIRST_LINE_S = 10.0


async def _next_line(lines: AsyncIterator[str]) -> str | None:
    """The stream's next line that is not blank; None at its end."""
    async for line in lines:
        if line.strip():
            return line
    return None


def _stream_line(line: str) -> list[StopWatchInfo]:
    """One line of a watch's stream: `{"stopped": [...]}`, as a poll's answer."""
    try:
        body = json.loads(line)
        return [StopWatchInfo.from_json(info) for info in body["stopped"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(
            f"A line of the watch's stream is not a watch answer: {line[:200]!r}", code="bad_response"
        ) from exc


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
