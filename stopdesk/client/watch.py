"""Waiting for a task's Stop over HTTP: long polls of GET /tasks/{id}/stop/watch, which the server
answers the moment the stop request commits.

`Client.watch_stop(task_id)` returns a `StopWatch`, set like a `threading.Event` (one daemon thread
long-polls); `AsyncClient.watch_stop(task_id)` is awaited and returns when Stop commits. Lost
connections and 5xx answers are retried with backoff: a watch is a read, safe to repeat.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Protocol

import httpx

from stopdesk.client.calls import Call
from stopdesk.client.transport import backoff, read_answer
from stopdesk.protocol.errors import ServerError, StopdeskError
from stopdesk.protocol.types import StopWatchInfo


class Client(Protocol):
    watch_base: str
    http: httpx.Client
    backoff_seconds: float


class AsyncClient(Protocol):
    watch_base: str
    http: httpx.AsyncClient
    backoff_seconds: float


POLL_S = 25.0
SLACK_S = 10.0  # the HTTP timeout is the poll plus this, so the server always answers first


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
        call = watch_call(self.task_id)
        url = self._client.watch_base + call.path
        attempt = 0
        while not self._ended.is_set():
            try:
                response = self._client.http.get(url, params={"timeout": self._poll_s}, timeout=self._poll_s + SLACK_S)
                info = read_answer(call, response)
            except (httpx.TransportError, ServerError):
                time.sleep(min(backoff(attempt, self._client.backoff_seconds), 5.0))
                attempt += 1
                continue
            except StopdeskError as exc:
                self.error = exc
                self._ended.set()
                return
            attempt = 0
            if info.stopped:
                self.info = info
                with self._lock:
                    self._stopped.set()
                    callbacks, self._callbacks = self._callbacks, []
                self._ended.set()
                for callback in callbacks:
                    callback()
                return


async def watch_stop_async(client: AsyncClient, task_id: int, *, poll_s: float = POLL_S) -> StopWatchInfo:
    call = watch_call(task_id)
    url = client.watch_base + call.path
    attempt = 0
    while True:
        try:
            response = await client.http.get(url, params={"timeout": poll_s}, timeout=poll_s + SLACK_S)
            info = read_answer(call, response)
        except (httpx.TransportError, ServerError):
            await asyncio.sleep(min(backoff(attempt, client.backoff_seconds), 5.0))
            attempt += 1
            continue
        attempt = 0
        if info.stopped:
            return info
