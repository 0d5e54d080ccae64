"""The gateway's connections to one upstream, kept open across calls.

Opening an MCP connection costs a handshake (and, before the first call, a `tools/list`); paid
per call it was most of what the gateway added. Each gateway task (a client session) keeps the
connections its calls opened and lends an idle one to its next call, one call at a time on each
(so a connection's last request id and progress are that call's). A connection is closed when a
Stop of its task ended or refused a call, when a call on it failed or was cancelled, when it sat
idle for `idle_close_s` (a session the client ended says nothing to the gateway), and when the
gateway shuts down. Each connection is held open by a task of its own in the gateway's task group
(an SDK client must be entered and left in one task)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from reconcile.mechanisms.mcp.servers import Connection, ServerSpec, open_client

IDLE_CLOSE_S = 60.0
# How long an idle HTTP connection to an upstream is kept for the next request. An upstream closes
# one it kept idle for its keep-alive (5 s in uvicorn, Hypercorn and Node), counted from before our
# side sees the connection idle (by more under load); a request sent on it just then is lost in the
# close, and HTTP/1.1 leaves the retry to the client, which neither httpx nor aiohttp makes for a
# POST. So the gateway lets the connection go well before: the next request opens a new one.
KEEPALIVE_S = 2.0


@dataclass(eq=False)
class Kept:
    """One open connection and the task that holds it open."""

    task_id: int
    conn: Connection | None = None
    error: Exception | None = None
    closing: anyio.Event = field(default_factory=anyio.Event)
    closed: bool = False
    idle_since: float | None = None  # monotonic time it was given back, while nobody holds it

    def close(self) -> None:
        self.closed = True
        self.closing.set()


class UpstreamConnections:
    def __init__(self, spec: ServerSpec, *, timeout_s: float, idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.idle_close_s = idle_close_s
        self._idle: dict[int, list[Kept]] = {}
        self._lent: dict[int, set[Kept]] = {}
        self._holders: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the gateway's lifetime; every connection is closed as it ends."""
        async with anyio.create_task_group() as holders:
            self._holders = holders
            try:
                yield
            finally:
                self._holders = None
                holders.cancel_scope.cancel()

    @asynccontextmanager
    async def lend(self, task_id: int, *, or_from: int | None = None) -> AsyncIterator[Connection]:
        """An idle connection of the task's, else an idle one of `or_from`'s (the connection kept
        for listings, which then becomes the task's: a stdio server is not started twice for a
        client's first call), or a new one; kept for the task's next call if the call ended
        normally, closed otherwise (a failed or cancelled call may leave it broken)."""
        kept = self._take_idle(task_id) or self._adopt(or_from, task_id) or await self._open(task_id)
        assert kept.conn is not None
        kept.conn.sent_ids.clear()  # the previous call's ids are not this one's
        self._lent.setdefault(task_id, set()).add(kept)
        ended_normally = False
        try:
            yield kept.conn
            ended_normally = True
        finally:
            self._lent[task_id].discard(kept)
            if ended_normally and not kept.closed:
                kept.idle_since = time.monotonic()
                self._idle.setdefault(task_id, []).append(kept)
            else:
                kept.close()

    def listed(self) -> list[Connection]:
        """The open connections, idle or lent, whose tool list is kept: to describe a call from
        (reading what one keeps, never sending on it), with no connection taken."""
        everyone = [*self._idle.values(), *self._lent.values()]
        return [k.conn for group in everyone for k in group if not k.closed and k.conn is not None and k.conn.tools]

    def close_task(self, task_id: int) -> None:
        """The task was stopped: close its connections (those lent out as their calls end)."""
        for kept in [*self._idle.pop(task_id, []), *self._lent.get(task_id, ())]:
            kept.close()

    def _adopt(self, from_id: int | None, task_id: int) -> Kept | None:
        kept = self._take_idle(from_id) if from_id is not None else None
        if kept is not None:
            kept.task_id = task_id
        return kept

    def _take_idle(self, task_id: int) -> Kept | None:
        idle = self._idle.get(task_id, [])
        while idle:
            kept = idle.pop()
            if not kept.closed:
                kept.idle_since = None
                return kept
        self._idle.pop(task_id, None)
        return None

    async def _open(self, task_id: int) -> Kept:
        if self._holders is None:
            raise RuntimeError("the gateway's upstream connections are not running")
        kept = Kept(task_id=task_id)
        ready = anyio.Event()
        self._holders.start_soon(self._hold, kept, ready)
        await ready.wait()
        if kept.error is not None:
            raise kept.error
        return kept

    async def _hold(self, kept: Kept, ready: anyio.Event) -> None:
        try:
            async with open_client(self.spec, timeout_s=self.timeout_s, keepalive_s=KEEPALIVE_S) as conn:
                kept.conn = conn
                ready.set()
                await self._until_closed_or_idle(kept)
        except Exception as exc:  # the caller's to record (not sent), not the task group's
            kept.error = exc
        finally:
            kept.closed = True  # also when the connection broke by itself: never lent again
            ready.set()
            self._forget(kept)

    async def _until_closed_or_idle(self, kept: Kept) -> None:
        while not kept.closing.is_set():
            with anyio.move_on_after(self.idle_close_s):
                await kept.closing.wait()
            if kept.idle_since is not None and time.monotonic() - kept.idle_since >= self.idle_close_s:
                kept.close()

    def _forget(self, kept: Kept) -> None:
        idle = self._idle.get(kept.task_id)
        if idle is not None and kept in idle:
            idle.remove(kept)
        if not idle:
            self._idle.pop(kept.task_id, None)
