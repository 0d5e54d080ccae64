"""The process's threads for a framework run's calls to a synchronous runtime (the in-process
`LocalRuntime`, or the sync `Client`): "lanes", shared by the runs, whose database connections last
from run to run as Django's do. "writes" carries the boundary's calls (commits wait for the disk),
"results" the results (they need not, if the runtime's operator allows it), "watch" Stop's watch, apart so it never queues behind
writes. The runtime looks after a lane thread's resources (`thread_prepare` before each call,
`thread_close` at the end, where it offers them); this module knows nothing of Django."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The process's, shared by its runs: a thread (and its connection) starts only when the others are
# busy. "writes" is the boundary's, with room for parallel tool calls and several runs at once.
LANE_THREADS = {"writes": 8, "results": 4, "watch": 2}

_lanes: dict[str, ThreadPoolExecutor] = {}
_lanes_lock = threading.Lock()
# What closes a lane thread's resources: the runtimes' `thread_close` (the in-process runtime's
# closes the thread's database connections), gathered from the runtimes the lanes served.
_closers: set[Callable[[], None]] = set()


def lane(name: str, runtime: Any) -> ThreadPoolExecutor:
    """The lane's threads, for a call of `runtime`."""
    closer = getattr(runtime, "thread_close", None)
    with _lanes_lock:
        if closer is not None:
            _closers.add(closer)
        pool = _lanes.get(name)
        if pool is None:
            pool = _lanes[name] = ThreadPoolExecutor(LANE_THREADS[name], thread_name_prefix=f"stopdesk-{name}")
        return pool


def in_lane(
    fn: Callable[..., Any],
    prepare: Callable[[bool], None] | None,
    wait_for_flush: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    # These threads see no requests: the runtime checks their connection (`thread_prepare`), as
    # Django checks one per request.
    if prepare is not None:
        prepare(wait_for_flush)
    return fn(*args, **kwargs)


def close_connections() -> None:
    """Close the database connections of the stopdesk threads and end them (a program done with
    stopdesk, or tests before dropping their database); the next run starts new ones."""
    with _lanes_lock:
        pools = list(_lanes.items())
        _lanes.clear()
        closers = list(_closers)
    for name, pool in pools:
        threads = LANE_THREADS[name]
        barrier = threading.Barrier(threads)
        jobs = [pool.submit(_close_thread, barrier, closers) for _ in range(threads)]
        for job in jobs:
            with contextlib.suppress(Exception):
                job.result(timeout=10)
        pool.shutdown(wait=True)


def _close_thread(barrier: threading.Barrier, closers: list[Callable[[], None]]) -> None:
    # Every thread of the pool waits here, so each one takes exactly one of these jobs.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=5)
    for closer in closers:
        closer()


def _forget_lanes() -> None:
    # A forked child has none of the parent's threads: it starts its own.
    global _lanes_lock
    _lanes.clear()
    _lanes_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_lanes)
