"""Stop, pushed: the stop request's commit reaches every watcher in a process at once.

The stop request's transaction sends `pg_notify('stopdesk_stop', '<task id> <stop time>')` in the
statement that sets the task's stop time (`stopdesk.services.stop`; the channel and payload are
`stopdesk.services.stop_notify`'s), which PostgreSQL delivers only when (and as soon as) that
transaction commits. Each process keeps one listening
connection, in one thread (`StopHub`), and fans each notification out to the watchers of that
task in the process: a thousand watchers cost one connection and one thread, and the hub sends no
query while nothing happens. (A remote watcher's long polls cost queries of their own, at each
poll: `stopdesk.push.watch`.) Notifications sent while the listener was not connected are lost, so
after every (re)connection it reads the stop state of every watched task once.

SQLite has no LISTEN: there the hub polls instead, one query per interval for all watched tasks
together (the zero-setup local run; its figure is the polling one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.db import connection

from stopdesk.services.sql import is_postgres
from stopdesk.services.stop_notify import CHANNEL, stopped_among

log = logging.getLogger(__name__)
# Called with the task id and the stop request's time, once, when that task's Stop commits.
Callback = Callable[[int, datetime | None], None]


class _Watch:
    __slots__ = ("callback", "task_id")

    def __init__(self, task_id: int, callback: Callback) -> None:
        self.task_id = task_id
        self.callback = callback


class StopHub:
    """One listener per process; `watch(task_id, callback)` calls `callback(task_id)` once, from the
    hub's thread, when that task's Stop commits. Callbacks must be quick and thread-safe (set an
    Event, `loop.call_soon_threadsafe`)."""

    def __init__(self, *, poll_s: float = 0.5, reconnect_s: float = 1.0) -> None:
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._watches: dict[int, set[_Watch]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.listening = threading.Event()  # set while a LISTEN connection is up (PostgreSQL)
        self._closing = threading.Event()
        self.connections = 0  # how many times the listener connected (tests, diagnostics)

    # Watching
    def watch(self, task_id: int, callback: Callback) -> Callable[[], None]:
        """Register first, then check: a Stop that commits in between is seen either way. The
        check is the caller's (`already_stopped`), so async callers can run it off the loop."""
        entry = _Watch(task_id, callback)
        with self._lock:
            self._watches.setdefault(task_id, set()).add(entry)
            self._ensure_running()
        return lambda: self._forget(entry)

    def watch_checked(self, task_id: int, callback: Callback) -> Callable[[], None]:
        """`watch`, then one read: calls back at once if the task was already stopped."""
        unwatch = self.watch(task_id, callback)
        self._fire(stopped_among([task_id]))
        return unwatch

    async def wait_async(self, task_id: int, timeout: float | None = None) -> bool:
        """Wait on the event loop (no thread, no connection held) until the task's Stop commits.
        Returns whether it did within `timeout`."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def wake(_: int, __: datetime | None) -> None:
            loop.call_soon_threadsafe(resolve, done)

        unwatch = self.watch(task_id, wake)
        try:
            if await asyncio.to_thread(_closing(stopped_among), [task_id]):
                return True  # stopped before the watch began
            await asyncio.wait_for(done, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            unwatch()

    def watching(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._watches.values())

    def _forget(self, entry: _Watch) -> None:
        with self._lock:
            entries = self._watches.get(entry.task_id)
            if entries is not None:
                entries.discard(entry)
                if not entries:
                    del self._watches[entry.task_id]

    def _fire(self, stopped: Mapping[int, datetime | None]) -> None:
        with self._lock:
            fired = [entry for task_id in stopped for entry in self._watches.pop(task_id, ())]
        for entry in fired:
            try:
                entry.callback(entry.task_id, stopped[entry.task_id])
            except Exception:
                log.exception("a stop watcher for task %s failed", entry.task_id)

    # The listener
    def _ensure_running(self) -> None:
        # A forked child (Celery's prefork pool) has the parent's hub object but not its thread.
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="stopdesk-stop-hub", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and close the listener's connection (tests; a process that ends)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                try:
                    if is_postgres():
                        self._listen()
                    else:
                        self._poll()
                except Exception:
                    self.listening.clear()
                    log.exception("the stop listener lost its connection; reconnecting")
                    time.sleep(self.reconnect_s)
        finally:
            connection.close()

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(**_conninfo(), autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.connections += 1
            # Anything that committed while nobody listened: one read for every watched task.
            self._fire(self._stopped_via(conn, self._watched()))
            self.listening.set()
            while not self._closing.is_set():
                # Blocks in the driver until a notification or the timeout: no query either way.
                for note in conn.notifies(timeout=1.0):
                    with contextlib.suppress(ValueError):
                        task_id, _, at = note.payload.partition(" ")
                        self._fire({int(task_id): datetime.fromisoformat(at) if at else None})
            self.listening.clear()

    def _poll(self) -> None:
        self.listening.clear()
        while not self._closing.is_set():
            watched = self._watched()
            if watched:
                self._fire(_closing(stopped_among)(watched))
            time.sleep(self.poll_s)

    def _watched(self) -> list[int]:
        with self._lock:
            return list(self._watches)

    @staticmethod
    def _stopped_via(conn: Any, task_ids: list[int]) -> dict[int, datetime | None]:
        if not task_ids:
            return {}
        rows = conn.execute(
            "SELECT id, stop_requested_at FROM stopdesk_task WHERE id = ANY(%s) AND stop_requested_at IS NOT NULL",
            [task_ids],
        ).fetchall()
        return {row[0]: row[1] for row in rows}


def resolve(future: asyncio.Future[Any], value: Any = None) -> None:
    """On the loop: complete a waiter unless it already was (or was cancelled)."""
    if not future.done():
        future.set_result(value)


def _conninfo() -> dict[str, Any]:
    """The same database Django uses (the test database under tests)."""
    db = connection.settings_dict
    info = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"], "host": db["HOST"]}
    if db.get("PORT"):
        info["port"] = db["PORT"]
    return {k: v for k, v in info.items() if v not in (None, "")}


def _closing[**P, T](fn: Callable[P, T]) -> Callable[P, T]:
    """Run `fn` in a helper thread and close that thread's connection after it."""

    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return call


_hub: StopHub | None = None
_hub_lock = threading.Lock()


def stop_hub() -> StopHub:
    """The process's hub."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = StopHub()
        return _hub


def stop_hub_close() -> None:
    """Close the process's hub (a new one starts on the next watch)."""
    global _hub
    with _hub_lock:
        hub, _hub = _hub, None
    if hub is not None:
        hub.close()
