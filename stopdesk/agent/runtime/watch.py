"""`LocalRuntime.watch_stop`'s handle: set by push (the process's one listener, `stopdesk.push.hub`)
when the task's Stop commits; a thread waits on it, an event loop is called back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from stopdesk.protocol.types import StopWatchInfo
from stopdesk.push.hub import stop_hub


class LocalStopWatch:
    """`Client.watch_stop`'s handle, in-process: set by push when the task's Stop commits."""

    def __init__(self, task_id: int) -> None:
        self.task_id = task_id
        self.info: StopWatchInfo | None = None
        self.error: Exception | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._unwatch = stop_hub().watch_checked(task_id, self._set)

    def _set(self, task_id: int, requested_at: datetime | None) -> None:
        self.info = StopWatchInfo(task_id, True, requested_at)
        with self._lock:
            self._stopped.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, from the thread that sets the handle (at once if it is set): an
        event loop awaits Stop with it instead of looking."""
        with self._lock:
            if not self._stopped.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def is_set(self) -> bool:
        return self._stopped.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def cancel(self) -> None:
        self._unwatch()
