"""Tool bodies that Stop cannot interrupt, and the check a tool body can make for Stop.

All three frameworks run a plain `def` tool in a thread (the Agents SDK with `asyncio.to_thread`,
LangChain with the loop's default executor, pydantic-ai with the executor its
`Agent.using_thread_executor` names). Cancelling the run's task ends the *await* of that thread,
never the thread: the function runs on to its end. So a run makes the loop's default executor a
`ToolThreads` (and hands the same one to pydantic-ai), which remembers, for each thread it starts,
the tool call whose context asked for it (`CALL`, set around the tool's body). When Stop ends the
await while such a thread still runs, the tool call is recorded as still running ("cannot be
interrupted; waiting for it to finish") and settled with what the thread really did.

A tool body can stop of its own accord: `stop_requested()` (also `stopdesk.stop_requested()`)
answers, from any thread the call started or from the run's own task, whether the run has heard
Stop; a body that then raises `ToolStopped` is recorded as stopped when Stop asked.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

UNINTERRUPTIBLE = "cannot be interrupted; waiting for it to finish"


class ToolStopped(Exception):
    """Raise it from a tool body that saw `stop_requested()` and stopped: the call is recorded as
    stopped when Stop asked, not as failed."""

    def __init__(self, message: str = "stopped when Stop asked") -> None:
        super().__init__(message)


class Awaited(Future[Any]):
    """What the awaiting side gets for a thread's work. asyncio cancels it when the await of it is
    cancelled (before the awaiting task sees CancelledError), which marks it `abandoned`: that
    thread's work was the tool body's, and Stop did not end it. Work not yet begun is cancelled."""

    def __init__(self, work: Future[Any]) -> None:
        super().__init__()
        self.work = work
        self.abandoned = False
        work.add_done_callback(self._copy)

    def cancel(self) -> bool:
        self.abandoned = True
        if self.work.cancel():
            return super().cancel()
        return False

    def _copy(self, work: Future[Any]) -> None:
        if work.cancelled():
            super().cancel()
        elif (error := work.exception()) is not None:
            self.set_exception(error)
        else:
            self.set_result(work.result())


@dataclass
class CallThreads:
    """One tool call's view of Stop (the run's flag, readable from any thread) and the threads
    started from its context."""

    stop: threading.Event
    threads: list[Awaited] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def adopt(self, future: Awaited) -> None:
        with self.lock:
            self.threads.append(future)

    def abandoned(self) -> list[Future[Any]]:
        """The work of threads whose await was cancelled and that did run (or still runs)."""
        with self.lock:
            return [f.work for f in self.threads if f.abandoned and not f.work.cancelled()]


CALL: contextvars.ContextVar[CallThreads | None] = contextvars.ContextVar("stopdesk_tool_call", default=None)
# The run's flag outside a tool call (a tool body reached through the framework's own task).
RUN_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("stopdesk_run_stop", default=None)


def stop_requested() -> bool:
    """Whether the stopdesk run this code runs under has heard Stop. Usable in a tool body, also a
    plain `def` one running in the framework's thread (the frameworks copy the caller's context
    into it). False outside a run."""
    call = CALL.get()
    if call is not None:
        return call.stop.is_set()
    flag = RUN_STOP.get()
    return flag is not None and flag.is_set()


class ToolThreads(ThreadPoolExecutor):
    """An executor that tells each tool call which threads it started. It runs the work on the
    executor it replaced, when there was one, so a program's own default executor keeps its size
    and its threads."""

    def __init__(self, inner: Executor | None = None) -> None:
        super().__init__(thread_name_prefix="stopdesk-tool")
        self._inner = inner

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        work = (
            self._inner.submit(fn, *args, **kwargs) if self._inner is not None else super().submit(fn, *args, **kwargs)
        )
        # Called on the event loop's thread, in the context of the task awaiting the work: the
        # tool call's, when a tool body asked for it.
        call = CALL.get()
        if call is None:
            return work
        awaited = Awaited(work)
        call.adopt(awaited)
        return awaited

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._inner is not None:
            self._inner.shutdown(wait, cancel_futures=cancel_futures)
        super().shutdown(wait, cancel_futures=cancel_futures)


def loop_tool_threads() -> ToolThreads:
    """The running loop's default executor, made a ToolThreads (once per loop)."""
    loop = asyncio.get_running_loop()
    # asyncio offers no getter for the default executor; without this read, a program's own one
    # would be replaced rather than kept inside ours.
    current = getattr(loop, "_default_executor", None)
    if isinstance(current, ToolThreads):
        return current
    threads = ToolThreads(current if isinstance(current, Executor) else None)
    loop.set_default_executor(threads)
    return threads
