"""The asyncio supervisor for in-process agent code.

    async with supervise(actor="agent:planner") as group:
        group.start(item_a, draft_invoice)            # async def draft_invoice(child): ...
        group.start(item_b, send_reminder)

Each child passes the boundary before it runs, and its outcome is recorded when it ends. The
supervisor heartbeats its children and watches the ledger; when Stop is requested it cancels
them, gives their `finally` blocks `cleanup_s` to run, and records each one:
- returned: completed (even after the stop: the work finished, and says so);
- raised: failed;
- cancelled before any external action: cancelled;
- cancelled after `await child.submit(key)`: awaiting_reconciliation. Cancelling a coroutine only
  stops our waiting; it proves nothing about what the remote side received or committed;
- still running after cleanup_s: awaiting_reconciliation (it cannot be forced).

The adapter that reads these outcomes back is `reconcile.mechanisms.asyncio.adapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from stopdesk.protocol.errors import StopRequested
from stopdesk.push.hub import stop_hub
from stopdesk.services.errors import IllegalTransition, TaskStopped
from stopdesk.services.items import item_finish, item_heartbeat, item_record_detail, item_task_id
from stopdesk.services.stop_notify import stopped_among
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState

log = logging.getLogger(__name__)
T = TypeVar("T")


def item_start_for_task(*, item_id: int, actor: str) -> int:
    """Pass the boundary; returns the item's task id, whose Stop the supervisor then watches."""
    item_start(item_id=item_id, actor=actor, worker="asyncio")
    return item_task_id(item_id=item_id)


async def in_thread[T](fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a ledger call in a worker thread. Inside `ledger_threads` it runs on that pool, whose
    threads keep their connection; elsewhere on a fresh thread whose connection is closed after."""
    pool = _ledger_pool.get()
    if pool is not None:
        return await pool.run(fn, **kwargs)

    def call() -> T:
        try:
            return fn(**kwargs)
        finally:
            connection.close()

    return await asyncio.to_thread(call)


class LedgerThreads:
    """A few threads that each keep one database connection across ledger calls: a long-lived
    process making many small calls (the gateway) then pays no connection set-up per call."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="stopdesk-ledger")

    async def run[T](self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(_on_kept_connection, fn, kwargs))

    def close(self) -> None:
        """Close every thread's connection on that thread (a connection belongs to its thread),
        then the threads. The barrier makes each of the `size` threads take one close."""
        barrier = threading.Barrier(self.size, timeout=10.0)

        def close_mine() -> None:
            connection.close()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

        for _ in range(self.size):
            self._executor.submit(close_mine)
        self._executor.shutdown(wait=True)


# A connection idle longer than this is checked before use (Django's health check, one ping);
# one in steady use is not pinged before every call (it would double the round trips).
CHECK_AFTER_IDLE_S = 1.0
_last_used = threading.local()


def _on_kept_connection[T](fn: Callable[..., T], kwargs: dict[str, Any]) -> T:
    if connection.errors_occurred or time.monotonic() - getattr(_last_used, "at", 0.0) > CHECK_AFTER_IDLE_S:
        # Drop it if it broke or outlived CONN_MAX_AGE, as Django does per request.
        close_old_connections()
    try:
        return fn(**kwargs)
    finally:
        _last_used.at = time.monotonic()
        if connection.in_atomic_block:  # never hand the next call an open transaction
            connection.close()


_ledger_pool: ContextVar[LedgerThreads | None] = ContextVar("stopdesk_ledger_pool", default=None)


@contextlib.contextmanager
def ledger_threads(pool: LedgerThreads) -> Iterator[None]:
    """`in_thread` calls made in this context (and the tasks it starts) use `pool`."""
    token = _ledger_pool.set(pool)
    try:
        yield
    finally:
        _ledger_pool.reset(token)


@dataclass
class Child:
    item_id: int
    actor: str
    submitted: bool = False
    outcome: str = ""
    overran: bool = False  # its cleanup outlived cleanup_s after Stop, and that was recorded
    task: asyncio.Task[Any] | None = field(default=None, repr=False)
    task_id: int = 0  # the stopdesk task it belongs to, known once it passed the boundary

    async def submit(self, idempotency_key: str) -> None:
        """Pass the boundary before an external action. Raises TaskStopped if Stop came first."""
        await in_thread(item_submit, item_id=self.item_id, idempotency_key=idempotency_key, actor=self.actor)
        self.submitted = True

    async def declare(self, detail: dict[str, Any]) -> None:
        """Record how the external action can be looked up (e.g. {"http": {...lookup_url...}})."""
        await in_thread(item_record_detail, item_id=self.item_id, detail=detail, actor=self.actor)


class Group:
    def __init__(self, actor: str, cleanup_s: float) -> None:
        self.actor = actor
        self.cleanup_s = cleanup_s
        self.children: list[Child] = []
        self.stopped = asyncio.Event()
        self._started: list[asyncio.Task[None]] = []
        self._stops: asyncio.Queue[int] = asyncio.Queue()  # stopdesk tasks whose Stop arrived
        self._stopped_tasks: set[int] = set()
        self._unwatch: dict[int, Callable[[], None]] = {}

    def start(self, item_id: int, body: Callable[[Child], Coroutine[Any, Any, Any]]) -> Child:
        child = Child(item_id, self.actor)
        self.children.append(child)
        self._started.append(asyncio.create_task(self._run(child, body), name=f"stopdesk-child-{item_id}"))
        return child

    async def _run(self, child: Child, body: Callable[[Child], Coroutine[Any, Any, Any]]) -> None:
        try:
            task_id = await in_thread(item_start_for_task, item_id=child.item_id, actor=self.actor)
        except (TaskStopped, IllegalTransition) as exc:
            child.outcome = "not started"
            log.info("child %s not started: %s", child.item_id, exc)
            return
        child.task_id = task_id
        self._watch_task(task_id)
        # A Stop that committed between the start and the watch was not pushed to us: look once.
        if await in_thread(stopped_among, task_ids=[task_id]):
            self._stop_arrived(task_id)
        child.task = asyncio.create_task(body(child), name=f"stopdesk-body-{child.item_id}")
        if task_id in self._stopped_tasks:
            # Stop arrived while this child was starting, after its task's cancel went out.
            child.task.cancel("stop requested")
        try:
            result = await asyncio.shield(child.task)
        except asyncio.CancelledError:
            if not child.task.done():
                raise  # the supervisor itself is being cancelled; _finish_stopped records it
            return await self._record_cancelled(child)
        except StopRequested:
            # The child heard of Stop itself (a boundary refusal, LocalRuntime.heartbeat, the
            # client): the same class every door raises, recorded as a stop, never a failure.
            return await self._record_cancelled(child, after_stop=True)
        except Exception as exc:
            if child.submitted:
                # Raising after the action went out says nothing about whether it landed (a client
                # that timed out while the server went on): reconcile it, never "failed".
                await self._record_unsure(child, f"raised after its external action was sent: {type(exc).__name__}")
                return
            child.outcome = "failed"
            await self._finish(child, False, f"{type(exc).__name__}: {exc}"[:200])
            return
        child.outcome = "completed"
        await self._finish(child, True, "completed" if not self.stopped.is_set() else "completed despite the stop")
        del result

    async def _finish(self, child: Child, succeeded: bool, outcome: str) -> None:
        await in_thread(item_finish, item_id=child.item_id, succeeded=succeeded, actor=self.actor, outcome=outcome)

    async def _record_cancelled(self, child: Child, *, after_stop: bool = False) -> None:
        if not after_stop and child.task is not None and child.task.done() and not child.task.cancelled():
            # It caught the cancellation and ended on its own terms: record what it did.
            exc = child.task.exception()
            child.outcome = "completed" if exc is None else "failed"
            await self._finish(child, exc is None, "completed despite the stop" if exc is None else repr(exc)[:200])
            return
        if child.submitted:
            await self._record_unsure(child, "cancelled after its external action was sent")
            return
        child.outcome = "cancelled"
        try:
            await in_thread(
                item_transition,
                item_id=child.item_id,
                to_state=ItemState.CANCELLED,
                actor=self.actor,
                outcome="cancelled before any external action",
                allowed_from=frozenset({ItemState.RUNNING}),
            )
        except IllegalTransition as exc:
            log.info("child %s: %s", child.item_id, exc)

    async def _record_unsure(self, child: Child, outcome: str) -> None:
        """The child ended after its external action was sent: look the action up."""
        child.outcome = "awaiting_reconciliation"
        try:
            await in_thread(
                item_transition,
                item_id=child.item_id,
                to_state=ItemState.AWAITING_RECONCILIATION,
                actor=self.actor,
                outcome=outcome,
                allowed_from=frozenset({ItemState.RUNNING}),
                next_check_at=timezone.now(),
            )
        except IllegalTransition as exc:
            log.info("child %s: %s", child.item_id, exc)

    async def cancel_all(self) -> None:
        """Cancel every running child, give their cleanup a bounded time, record the rest."""
        await self._cancel(list(self.children))

    async def cancel_task(self, task_id: int) -> None:
        """Cancel the running children of one stopdesk task (its Stop arrived)."""
        await self._cancel([c for c in self.children if c.task_id == task_id])

    async def _cancel(self, children: list[Child]) -> None:
        self.stopped.set()
        bodies = [c.task for c in children if c.task is not None and not c.task.done()]
        for body in bodies:
            body.cancel("stop requested")
        if bodies:
            await asyncio.wait(bodies, timeout=self.cleanup_s)
        for child in children:
            if child.task is not None and not child.task.done() and not child.overran:
                await self._record_overrun(child)

    async def _record_overrun(self, child: Child) -> None:
        child.outcome = "awaiting_reconciliation"
        with contextlib.suppress(IllegalTransition):
            await in_thread(
                item_transition,
                item_id=child.item_id,
                to_state=ItemState.AWAITING_RECONCILIATION,
                actor=self.actor,
                outcome=f"cleanup did not finish within {self.cleanup_s:g}s",
                allowed_from=frozenset({ItemState.RUNNING}),
                next_check_at=timezone.now(),
            )
        child.overran = True

    def settled(self) -> bool:
        """Every child's runner has recorded its outcome, or the child overran its cleanup after
        Stop (recorded; its runner waits on a body that cannot be forced, so nobody waits for it).
        A body that has merely finished is not enough: its runner may still be writing."""
        return all(runner.done() or child.overran for child, runner in zip(self.children, self._started, strict=True))

    def _watch_task(self, task_id: int) -> None:
        """Have Stop pushed for this child's task (once per task): the hub calls back from its
        thread the moment the stop request commits."""
        if task_id in self._unwatch:
            return
        loop = asyncio.get_running_loop()

        def wake(stopped: int, __: object) -> None:
            loop.call_soon_threadsafe(self._stop_arrived, stopped)

        self._unwatch[task_id] = stop_hub().watch(task_id, wake)

    def _stop_arrived(self, task_id: int) -> None:
        """On the loop: a task's Stop committed (pushed, read, or answered by a heartbeat)."""
        if task_id not in self._stopped_tasks:
            self._stopped_tasks.add(task_id)
            self._stops.put_nowait(task_id)

    async def _on_stop(self) -> None:
        cancels: set[asyncio.Task[None]] = set()
        try:
            while True:
                task_id = await self._stops.get()
                cancel = asyncio.create_task(self.cancel_task(task_id), name=f"stopdesk-cancel-{task_id}")
                cancels.add(cancel)
                cancel.add_done_callback(cancels.discard)
        finally:
            for cancel in list(cancels):
                cancel.cancel()

    async def _beat(self, heartbeat_s: float) -> None:
        """Keep the running children's leases alive. Their answer also says whether Stop was
        requested: a fallback should a push be lost, not the way Stop arrives."""
        while True:
            await asyncio.sleep(heartbeat_s)
            running = [c for c in self.children if c.task is not None and not c.task.done()]
            if running:
                answers = await asyncio.gather(*(in_thread(item_heartbeat, item_id=c.item_id) for c in running))
                for child, stopped in zip(running, answers, strict=True):
                    if stopped:
                        self._stop_arrived(child.task_id)

    def _close(self) -> None:
        for unwatch in self._unwatch.values():
            unwatch()
        self._unwatch.clear()


@contextlib.asynccontextmanager
async def supervise(*, actor: str, poll_s: float | None = None, cleanup_s: float = 5.0) -> AsyncIterator[Group]:
    """Run children; leave the block when every child has ended and been recorded. Stop is pushed
    (PostgreSQL LISTEN/NOTIFY through the process's one listener), so the children are cancelled the
    moment it commits; `poll_s` is how often their leases are renewed (default: the heartbeat
    setting, STOPDESK_HEARTBEAT_SECONDS)."""
    heartbeat_s = poll_s if poll_s is not None else float(settings.STOPDESK["HEARTBEAT_SECONDS"])
    group = Group(actor, cleanup_s)
    helpers = [
        asyncio.create_task(group._on_stop(), name="stopdesk-on-stop"),
        asyncio.create_task(group._beat(heartbeat_s), name="stopdesk-heartbeat"),
    ]
    try:
        yield group
        while not group.settled():
            pending = [runner for runner in group._started if not runner.done()]
            await asyncio.wait(pending, return_when=asyncio.ALL_COMPLETED, timeout=heartbeat_s)
    finally:
        group._close()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        # Children still running after an overrun cannot be forced; stop waiting for their runners.
        for runner in group._started:
            if not runner.done():
                runner.cancel()
        await asyncio.gather(*group._started, return_exceptions=True)
