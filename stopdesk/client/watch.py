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
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

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
