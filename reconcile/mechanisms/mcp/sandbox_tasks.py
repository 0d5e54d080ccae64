"""MCP tasks for the sandbox MCP server: 2025-11-25's core tasks (experimental) and 2026-07-28's
`io.modelcontextprotocol/tasks` extension.

The mcp 2.3.0 SDK defines the task types but never dispatches task messages, so this
module supplies what the spec asks of a receiver:

- a task-augmented `tools/call` returns `CreateTaskResult` at once and the work runs on;
- `tasks/get` reports the task, `tasks/list` pages through them;
- `tasks/result` blocks until the task is terminal and returns what the plain call would
  have returned (a `CallToolResult`, with `isError` for a failed run);
- `tasks/cancel` sets `cancelled` *before* replying, then tries to stop the work; the task
  stays `cancelled` even if the work finishes anyway;
- unknown, expired and already-terminal tasks are JSON-RPC -32602;
- tasks belong to the session that created them, as in the reference servers: any other
  session gets -32602 "Task not found", and closing the session cleans its tasks up (their
  work is stopped and they are gone).

In 2026-07-28 (the extension) there is no session: a task is known by its id alone. The server
answers a `tools/call` from a client that declared the extension with the task itself
(`resultType: "task"`, `ttlMs`, `pollIntervalMs`); `tasks/get` answers the task with its result;
`tasks/cancel` answers an empty acknowledgement, and cancellation is eventually consistent: a task
whose work does not stop (`keep_working`) stays `working` and may end `completed`.

Two kinds of callers touch the registry: handlers on the server's event loop, and the
Python control API on another thread. Everything async (cancel scopes, events) belongs to
the loop and is only touched there; the plain fields are guarded by the owner's lock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

TERMINAL = frozenset({"completed", "failed", "cancelled"})
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# Not fixed by the spec; -32000 is what other task servers use for "Task cancelled".
TASK_CANCELLED = -32000

Work = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class TaskRecord:
    task_id: str
    tool: str
    created: float  # wall clock
    session: str
    ttl_ms: int | None
    poll_interval_ms: int
    status: str = "working"
    status_message: str | None = None
    last_updated: float = 0.0
    result: dict[str, Any] | None = None
    work_finished: bool = False
    # Loop-only objects: created and used on the server's event loop.
    settled: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None

    def expired(self, now: float) -> bool:
        return self.ttl_ms is not None and now > self.created + self.ttl_ms / 1000

    def to_json(self) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.last_updated or self.created),
            "ttl": self.ttl_ms,  # always present: null means unlimited
            "pollInterval": self.poll_interval_ms,
        }
        if self.status_message:
            task["statusMessage"] = self.status_message
        return task

    def to_extension_json(self) -> dict[str, Any]:
        """The task as the 2026-07-28 extension spells it, with its result once completed."""
        task = self.to_json()
        task["ttlMs"] = task.pop("ttl")
        task["pollIntervalMs"] = task.pop("pollInterval")
        if self.status == "completed" and self.result is not None:
            task["result"] = self.result
        if self.status == "failed" and self.result is None:
            task["error"] = {"code": -32603, "message": self.status_message or "failed"}
        return task


class TaskRegistry:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._tasks: dict[str, TaskRecord] = {}
        self.cleaned_up: list[dict[str, Any]] = []  # tasks removed with their session, for tests

    # --- called on the server loop ----------------------------------------------------

    def create(self, tool: str, *, session: str, ttl_ms: int | None, poll_interval_ms: int) -> TaskRecord:
        now = time.time()
        record = TaskRecord(
            task_id=str(uuid.uuid4()),
            tool=tool,
            session=session,
            created=now,
            last_updated=now,
            ttl_ms=ttl_ms,
            poll_interval_ms=poll_interval_ms,
        )
        with self._lock:
            self._tasks[record.task_id] = record
        return record

    async def run(self, record: TaskRecord, work: Work) -> None:
        """Run `work` for `record`; started in the app's task group, so it outlives the call."""
        try:
            # Our own scope, so tasks/cancel can stop this work and nothing else.
            with anyio.CancelScope() as scope:
                record.scope = scope
                try:
                    result = await work()
                except Exception as exc:  # a crashing tool is a failed task, not a dead server
                    text = f"{type(exc).__name__}: {exc}"
                    result = {"content": [{"type": "text", "text": text}], "isError": True}
                self._finish(record, result)
        finally:
            record.scope = None
            if not record.settled.is_set():
                # Only the server shutting down gets here: the app's task group was cancelled.
                self._settle(record, "failed", "server stopped before the task finished", None)

    def _finish(self, record: TaskRecord, result: dict[str, Any]) -> None:
        with self._lock:
            record.work_finished = True
            if record.status in TERMINAL:
                # Cancelled first: the spec keeps it cancelled even though the work finished.
                return
        status = "failed" if result.get("isError") else "completed"
        self._settle(record, status, None, result)

    def _settle(self, record: TaskRecord, status: str, message: str | None, result: dict[str, Any] | None) -> None:
        with self._lock:
            record.status = status
            record.status_message = message
            record.result = result
            record.last_updated = time.time()
        record.settled.set()

    def get(self, task_id: str, session: str) -> TaskRecord:
        with self._lock:
            record = self._tasks.get(task_id)
            if record is not None and record.expired(time.time()):
                # The receiver MAY delete a task and its result once its ttl has passed.
                del self._tasks[task_id]
                record = None
        if record is None or record.session != session:
            # Another session's task is as unknown as a deleted one (server-everything's answer).
            raise MCPError(code=INVALID_PARAMS, message=f"Task not found: {task_id}")
        return record

    def close_session(
        self, session: str, *, only: str | None = None, keep_working: Callable[[str], bool] = lambda _: False
    ) -> None:
        """The session ended (DELETE): its tasks are cleaned up and their work stopped (unless
        `keep_working(task_id)`: a server that never stops work). With `only`, just that task
        goes (a server that drops a task early)."""
        with self._lock:
            gone = [t for t in self._tasks.values() if t.session == session and only in (None, t.task_id)]
            for record in gone:
                del self._tasks[record.task_id]
                self.cleaned_up.append({"taskId": record.task_id, "session": session, "status": record.status})
        for record in gone:
            if record.scope is not None and not keep_working(record.task_id):
                record.scope.cancel()

    def cancel(self, task_id: str, session: str, *, stop_work: bool) -> dict[str, Any]:
        record = self.get(task_id, session)
        with self._lock:
            if record.status in TERMINAL:
                raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} is already {record.status}")
        # `cancelled` is recorded before the reply is written, as the spec requires.
        self._settle(record, "cancelled", "cancelled by the requestor", None)
        if stop_work and record.scope is not None:
            record.scope.cancel()
        with self._lock:
            return record.to_json()

    def cancel_eventually(self, task_id: str, *, stop_work: bool) -> dict[str, Any]:
        """2026-07-28: acknowledge with nothing. The work is asked to stop; only if it does is the
        task `cancelled`, otherwise it stays `working` and ends however its work ends."""
        record = self.get(task_id, "")
        with self._lock:
            if record.status in TERMINAL:
                return {}
        if stop_work and record.scope is not None:
            self._settle(record, "cancelled", "cancelled by the requestor", None)
            record.scope.cancel()
        return {}

    async def result(self, task_id: str, session: str) -> dict[str, Any]:
        record = self.get(task_id, session)
        await record.settled.wait()
        meta = {RELATED_TASK_META: {"taskId": task_id}}
        with self._lock:
            if record.status == "cancelled":
                raise MCPError(code=TASK_CANCELLED, message="Task was cancelled", data={"_meta": meta})
            assert record.result is not None
            return {**record.result, "_meta": meta}

    def page(self, cursor: str | None, session: str, page_size: int = 50) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            live = [t for t in self._tasks.values() if not t.expired(now) and t.session == session]
        start = int(cursor) if cursor and cursor.isdigit() else 0
        chunk = live[start : start + page_size]
        with self._lock:
            body: dict[str, Any] = {"tasks": [t.to_json() for t in chunk]}
        if start + page_size < len(live):
            body["nextCursor"] = str(start + page_size)
        return body

    # --- safe from any thread --------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {**t.to_json(), "tool": t.tool, "session": t.session, "workFinished": t.work_finished}
                for t in self._tasks.values()
            ]

    def clear(self) -> None:
        with self._lock:
            self._tasks.clear()
            self.cleaned_up.clear()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
