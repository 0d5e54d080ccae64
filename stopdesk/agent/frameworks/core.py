"""What every framework integration shares: one run's bookkeeping in the ledger and its Stop.

A `StopdeskRun` is entered around one agent run. The framework module calls `tool_call(...)` for
each tool call (with the framework's call id) and `model_request()` around each model request; the
run watches Stop and, when it comes, triggers the framework's own cancel (registered with
`on_stop`) and records what was in flight.

The run itself is an item ("agent run", registered through the boundary when the run is entered,
so a run entered after Stop is refused with RunStopped), settled when the run ends: completed,
failed, or cancelled when Stop ended it (the integration reports that itself, within its bounded
cleanup, as for the tool calls in flight). Tool calls and model requests are items of the task
beside it; while the run's item is open the task is not settled, so it does not settle and reopen
between turns.

A tool body Stop cannot interrupt (a plain `def` the framework runs in a thread): the cancel ends
the await, not the thread. The run knows that thread (`threads.py`), so such a call is recorded as
still running ("cannot be interrupted; waiting for it to finish", `note_evidence`) and then as the
thread ended: completed with its result, failed, cancelled if it raised `ToolStopped` after
`stop_requested()`, or uncertain if it still runs `uninterruptible_s` after Stop. The run's end
(and its `RunStopped`) waits for that, so the run's item settles after its calls.

Per tool call, on the caller's path: register the child item and pass the boundary (`start`, or
`submit` with the idempotency key for a declared external action; one round trip where the runtime
offers `register_started`), then the body. The result is written afterwards off the caller's path
(the writes are awaited before the run ends), so the model's next request does not wait for it.
Over a runtime whose every call is a request (the HTTP client), results wait for the next tool body
to start and go together in one request (`results.py`), so none competes with the requests the
caller waits for: until then the item is running; Stop sends them at once, and the run's normal end
sends them with its own end, in one call.
Model requests are drafts with no effect outside, so their items are written entirely off the path
(see `model_request` for what the ledger says when Stop and an answer cross); a request made after
Stop is refused in memory.

What waits for the disk: every commit, by default. The boundary (a tool call's registration, the
run's item, a request that can act on the provider's side), what the Stop path records (cancelled,
uncertain) and the run's end always commit only once PostgreSQL has flushed them. A result (a tool
call's, a draft's) and a draft's record go on the "results" lane, whose commits wait too unless
the operator opted out of durable results (STOPDESK_DURABLE_RESULTS=0; the runtime decides, in
`thread_prepare`): then they do not wait, so the next tool call's boundary does not queue behind
their flushes, and a crash of the database server may lose such a commit: a tool call then stays
running, which the reaper makes uncertain, never settled wrongly, but the record of what it
returned is gone; a draft had no effect outside. Any commit that waits flushes every commit made
before it, and the run's end waits, so a run that returned is on disk whole either way.

`runtime` is anything with the runtime methods: `stopdesk.client.AsyncClient` (awaited), or the
in-process `LocalRuntime` / the sync `Client` (run on the process's stopdesk threads: "lanes",
shared by the runs, whose database connections last from run to run as Django's do;
`lanes.close_connections` closes them through the runtime's `thread_close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from stopdesk.agent.frameworks import lanes
from stopdesk.agent.frameworks.declare import UNDECLARED, ToolDeclaration
from stopdesk.agent.frameworks.results import Pending, ResultOutbox
from stopdesk.agent.frameworks.threads import (
    CALL,
    RUN_STOP,
    UNINTERRUPTIBLE,
    CallThreads,
    ToolStopped,
    loop_tool_threads,
)
from stopdesk.protocol.errors import Conflict, InvalidRequest, StopRequested
from stopdesk.protocol.spec import noun_of

log = logging.getLogger(__name__)

STOPPED_RESULT = "The task was stopped, so this tool was not run. Stop now and answer with what you have."
CURRENT: contextvars.ContextVar[StopdeskRun | None] = contextvars.ContextVar("stopdesk_run", default=None)
StopWatch = Callable[[], Awaitable[Any]]


class RunStopped(Exception):
    """The run ended because Stop was requested (raised by `StopdeskRun.run`)."""


@dataclass
class _InFlight:
    item_id: int
    name: str
    declaration: ToolDeclaration
    submitted: bool
    calls: CallThreads


class StopdeskRun:
    def __init__(
        self,
        runtime: Any,
        task_id: int,
        *,
        framework: str,
        agent: str = "",
        worker: str = "",
        cleanup_s: float = 5.0,
        watch: StopWatch | None = None,
        poll_s: float = 0.2,
        uninterruptible_s: float = 300.0,
    ) -> None:
        self.runtime = runtime
        self.task_id = task_id
        self.framework = framework
        self.agent = agent
        self.item_id: int | None = None  # the run's own item, while it is open
        self.worker = worker or f"{framework}-agent"
        self.cleanup_s = cleanup_s
        self.stopped = asyncio.Event()
        self.stop_flag = threading.Event()  # the same, for tool bodies in threads (stop_requested)
        self.uninterruptible_s = uninterruptible_s
        self._outliving: set[asyncio.Future[Any]] = set()
        self._watch = watch or self._watch_stop
        self._poll_s = poll_s
        self._on_stop: list[Callable[[], Any]] = []
        self._in_flight: dict[str, _InFlight] = {}
        self._failed: dict[str, str] = {}
        # Calls registered as the model asked for them (`tool_call_ahead`), by call id: name, registration.
        self._ahead: dict[str, tuple[str, asyncio.Future[int]]] = {}
        self._writes: set[asyncio.Future[Any]] = set()
        # Results wait for the next tool body and go together (`results.py`): over HTTP one
        # request, in-process one transaction, while the caller waits on the body.
        self._outbox = (
            ResultOutbox(self._send_result, self._send_results, self._later) if _writes_results(runtime) else None
        )
        self._watcher: asyncio.Task[None] | None = None
        self._token: contextvars.Token[StopdeskRun | None] | None = None
        self._stop_token: contextvars.Token[threading.Event | None] | None = None
        self.model_requests = 0

    # --- the run's life ---------------------------------------------------------------------

    async def __aenter__(self) -> StopdeskRun:
        # The run is an item of its own, open while the run is: a run entered after Stop is
        # refused (and recorded so), and the task cannot settle between turns.
        try:
            self.item_id = await self._register_started(
                submit_key="",
                kind="local_worker",
                noun="agent run",
                mechanism="manual",
                label=f"{self.framework} {self.agent}".strip(),
                detail={"agent_run": {"framework": self.framework, "agent": self.agent}},
            )
        except StopRequested as exc:
            raise RunStopped(f"Task {self.task_id} was stopped before the run began.") from exc
        self._token = CURRENT.set(self)
        self._stop_token = RUN_STOP.set(self.stop_flag)
        loop_tool_threads()  # so the threads a tool body runs in are known (threads.py)
        self._watcher = asyncio.create_task(self._watch_then_stop(), name="stopdesk-stop-watch")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        try:
            await self._wait_outliving()
            self._settle_ahead()
            if exc is None:
                await self._end_with_results()
            await self.flush()
            await self._settle_run(exc)
        finally:
            if self._token is not None:
                CURRENT.reset(self._token)
            if self._stop_token is not None:
                RUN_STOP.reset(self._stop_token)

    def _settle_ahead(self) -> None:
        ahead, self._ahead = self._ahead, {}
        for name, registration in ahead.values():
            self._later(self._settle_never_run(registration, name), name)

    async def _end_with_results(self) -> None:
        """A normal end: the run's item completed in the same call as the results still waiting
        (`write_results`: one request, one transaction, its commit waiting for the disk as the
        run's end always does), its own last, so it still settles after its calls' records. Only
        when every write still under way is one of those results: anything else (a draft's record
        not yet answered, a call asked for and never run) ends as before, before the run's item."""
        outbox, item_id = self._outbox, self.item_id
        if outbox is None or item_id is None:
            return
        await asyncio.sleep(0)  # a result just handed over (a draft's end, sent from its thread) joins them
        if not len(outbox) or len(self._writes) != len(outbox):
            return
        taken = outbox.take()
        end = Pending(item_id, "completed", "", asyncio.get_running_loop().create_future())
        try:
            await self._call("write_results", _result_rows([*taken, end], item_id), lane="writes")
        except Exception as exc:
            # Nothing of it was written (one transaction), or its answer was lost: each goes as
            # before, and so does the run's end (`_settle_run`).
            log.warning("could not end the %s run with its results in one call: %r", self.framework, exc)
            outbox.settle(taken, exc)
            return
        outbox.settle(taken)
        self.item_id = None

    async def _settle_run(self, exc: BaseException | None) -> None:
        """The run's item, after its calls' records: completed on a normal end, cancelled when
        Stop (or the program running it) ended it, failed on an error."""
        if self.item_id is None:
            return
        item_id, self.item_id = self.item_id, None
        try:
            if exc is None:
                await self._finish(item_id, status="completed", detail="")
            elif isinstance(exc, RunStopped) or (
                self.stopped.is_set() and isinstance(exc, (StopRequested, asyncio.CancelledError))
            ):
                await self._stopped(item_id, RUN_STOPPED)
            elif isinstance(exc, asyncio.CancelledError):
                await self._stopped(item_id, "cancelled by the program running it")
            else:
                await self._finish(item_id, status="failed", detail=f"{type(exc).__name__}: {exc}"[:200])
        except Exception:
            log.exception("could not record the end of the %s run (item %s)", self.framework, item_id)

    async def _stopped(self, item_id: int, detail: str) -> None:
        # Stop's job for the run's ("manual") item may already have moved it to awaiting this
        # report; `report_stopped` settles it from there too (`cancel` only from running). As a
        # "stopped" result where the runtime writes several at once: over HTTP, the ends of the
        # runs a Stop of many tasks ends together then share requests (`stopdesk.client.together`).
        if self._outbox is not None:
            try:
                await self._call("write_results", [{"item": item_id, "status": "stopped", "detail": detail}])
                return
            except InvalidRequest:
                pass  # a server older than "stopped" results: reported on its own
        method = "report_stopped" if hasattr(self.runtime, "report_stopped") else "cancel"
        await self._call(method, item_id, detail=detail)

    async def _stopped_unrun(self, item_id: int, name: str) -> None:
        # A call that passed the boundary and whose body never began.
        await self._stopped(item_id, _clip_text(f"{name}: stopped before its body ran"))

    def on_stop(self, callback: Callable[[], Any]) -> None:
        """Register the framework's cancel; called once, when Stop arrives."""
        self._on_stop.append(callback)
        if self.stopped.is_set():
            self._fire(callback)

    async def run[T](
        self,
        work: Awaitable[T],
        *,
        cancel: Callable[[], Any] | None = None,
        stopped_errors: tuple[type[BaseException], ...] = (),
    ) -> T:
        """Run `work` (e.g. `Runner.run(...)`) as a task; on Stop call `cancel` (the framework's own
        cancel; default: cancel the task) and raise RunStopped once the run has ended. The run gets
        `cleanup_s` for its own `finally` blocks. `stopped_errors` are how the framework reports
        its own cancel (pydantic-ai's RunCancelled)."""
        task = asyncio.ensure_future(work)
        self.on_stop(cancel or task.cancel)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not self.stopped.is_set():
                task.cancel()
                raise
        # A tool that stopped itself (ToolStopped) may end the framework's run before its cancel does.
        except (StopRequested, ToolStopped, *stopped_errors):  # type: ignore[misc]  # a tuple of exception classes
            if not self.stopped.is_set():
                raise
        await self._bounded(task)
        raise RunStopped(f"Task {self.task_id} was stopped.")

    async def flush(self) -> None:
        """Wait (bounded) for the ledger writes made off the caller's path, including any that
        those writes queue in turn. Results waiting for the next tool body go now."""
        self._hurry_results()
        deadline = asyncio.get_running_loop().time() + self.cleanup_s
        while self._writes:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("%d stopdesk writes still pending after %.1fs", len(self._writes), self.cleanup_s)
                return
            await asyncio.wait(set(self._writes), timeout=left)

    async def _watch_then_stop(self) -> None:
        try:
            await self._watch()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stop watch failed; the boundary still refuses work after Stop")
            return
        self.stop_seen()

    def stop_seen(self) -> None:
        """Stop is known here: refuse new work in memory and trigger the framework's cancel."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.stop_flag.set()
        for callback in list(self._on_stop):
            self._fire(callback)
        self._hurry_results()

    def _hurry_results(self) -> None:
        # Stop is known, or the run is ending: no result waits for the next tool body.
        if self._outbox is not None:
            self._outbox.hurry = True
            self._outbox.send_all()

    def _fire(self, callback: Callable[[], Any]) -> None:
        try:
            outcome = callback()
            if inspect.isawaitable(outcome):
                self._later(outcome, "framework-cancel")
        except Exception:
            log.exception("framework cancel raised")

    async def _watch_stop(self) -> None:
        """Stop by push: the runtime's `watch_stop` (the HTTP client long-polls the watch endpoint,
        answered by LISTEN/NOTIFY; in-process, the process's listener sets a handle). A runtime
        without it, or a watch that fails, falls back to polling; the boundary holds either way."""
        watch = getattr(self.runtime, "watch_stop", None)
        if watch is None:
            return await self._poll_stop()
        try:
            if inspect.iscoroutinefunction(watch):
                if "on_stop" in inspect.signature(watch).parameters:
                    # The HTTP client calls it as the Stop is read: the cancel starts then, not a
                    # turn of the loop later when this coroutine resumes.
                    await watch(self.task_id, on_stop=lambda _: self.stop_seen())
                else:
                    await watch(self.task_id)
                return
            handle = await self._call("watch_stop", self.task_id, lane="watch")
        except Exception:
            log.exception("watch_stop failed; polling for Stop instead")
            return await self._poll_stop()
        try:
            on_set = getattr(handle, "on_set", None)
            if on_set is None:
                # A handle that can only be looked at (a runtime of your own): look every 20 ms.
                while not handle.is_set():
                    await asyncio.sleep(0.02)
                return
            # Ours are set from another thread (the process's listener, or the client's long
            # poll), which wakes this loop at once.
            loop = asyncio.get_running_loop()
            woken = asyncio.Event()

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the run's loop already closed
                    loop.call_soon_threadsafe(woken.set)

            on_set(wake)
            await woken.wait()
        finally:
            handle.cancel()

    async def _poll_stop(self) -> None:
        # Until the pushed watch is wired in, ask the ledger; the boundary is the guarantee either way.
        cheap = hasattr(self.runtime, "task_stopped")
        while True:
            if cheap:
                stopped = await self._call("task_stopped", self.task_id, lane="watch")
            else:
                stopped = (await self._call("get_task", self.task_id, lane="watch")).stopped
            if stopped:
                return
            await asyncio.sleep(self._poll_s)

    async def _bounded(self, task: asyncio.Future[Any]) -> None:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), timeout=self.cleanup_s)
        if not task.done():
            log.warning("the %s run did not end within %.1fs of Stop", self.framework, self.cleanup_s)
        await self._settle_leftovers()

    async def _settle_leftovers(self) -> None:
        """Tool calls whose wrapper never got to record an outcome (the framework swallowed the
        cancellation, or cleanup ran out): uncertain unless read-only, never silently running."""
        for call_id, flight in list(self._in_flight.items()):
            self._in_flight.pop(call_id, None)
            if flight.calls.abandoned():
                self._outlive(flight)
            else:
                await self._settle_interrupted(flight, "still in flight when the run ended after Stop")

    # --- for integrations whose tools run in another process (claude_agent_sdk) ---------------

    def item_of(self, call_id: str) -> int | None:
        """The item of a tool call in flight."""
        flight = self._in_flight.get(call_id)
        return flight.item_id if flight is not None else None

    async def register_started(self, **register: Any) -> int:
        """A child item of the run's own (a subagent's run), through the boundary."""
        return await self._register_started(submit_key="", mechanism="manual", **register)

    async def report(self, item_id: int, *, status: str, detail: str) -> None:
        await self._finish(item_id, status=status, detail=_clip_text(detail), flushed=False)

    async def report_stopped(self, item_id: int, detail: str) -> None:
        await self._stopped(item_id, _clip_text(detail))

    async def uncertain(self, item_id: int, detail: str) -> None:
        await self._call("mark_uncertain", item_id, detail=_clip_text(detail))

    async def note_item(self, item_id: int, message: str, evidence: dict[str, Any]) -> None:
        """An observation on an item, its state unchanged (still running after Stop)."""
        if hasattr(self.runtime, "note_evidence"):
            await self._call("note_evidence", item_id, message=message, evidence=evidence)

    async def note(self, message: str, evidence: dict[str, Any]) -> None:
        """The same, on the run's own item."""
        if self.item_id is not None:
            await self.note_item(self.item_id, message, evidence)

    async def give_up_run(self, detail: str) -> None:
        """The run's item is uncertain (work of it outlived `uninterruptible_s`): settled here, so
        the run's end does not call it stopped."""
        if self.item_id is not None:
            item_id, self.item_id = self.item_id, None
            await self.flush()
            await self.uncertain(item_id, detail)

    def later(self, work: Awaitable[Any], name: str) -> asyncio.Future[Any]:
        """A ledger write off the caller's path, awaited before the run ends."""
        return self._later(work, name)

    # --- tool bodies Stop cannot interrupt ------------------------------------------------------

    def _outlive(self, flight: _InFlight) -> None:
        """A tool body that runs on in its thread after the await of it ended: recorded as still
        running, then settled with what the thread did; the run's end waits for it (bounded)."""
        work = asyncio.ensure_future(self._settle_when_done(flight, flight.calls.abandoned()))
        work.set_name(f"stopdesk:{flight.name}:outlive")
        self._outliving.add(work)
        work.add_done_callback(self._outliving.discard)
        work.add_done_callback(self._written)

    async def _settle_when_done(self, flight: _InFlight, threads: list[Future[Any]]) -> None:
        running = not all(thread.done() for thread in threads)
        if running and hasattr(self.runtime, "note_evidence"):
            await self._call(
                "note_evidence",
                flight.item_id,
                message=f"{flight.name}: {UNINTERRUPTIBLE}",
                evidence={"uninterruptible": UNINTERRUPTIBLE},
            )
        waits = [asyncio.wrap_future(thread) for thread in threads]
        _, pending = await asyncio.wait(waits, timeout=self.uninterruptible_s)
        for wait in waits:
            # The outcome is read from the threads themselves: these are only waited on, and an
            # unread exception (or one set after the deadline) would be logged as lost.
            if wait.done():
                wait.exception()
            else:
                wait.cancel()
        looked_up = flight.submitted and bool(flight.declaration.http)  # the http mechanism decides
        if pending and not looked_up:
            detail = f"{flight.name}: could not be interrupted; still running {self.uninterruptible_s:g} s after Stop"
            await self._call("mark_uncertain", flight.item_id, detail=_clip_text(detail))
        if pending:
            return
        errors = [error for error in (thread.exception() for thread in threads) if error is not None]
        stopped = next((error for error in errors if isinstance(error, ToolStopped)), None)
        if stopped is not None:
            await self._stopped(flight.item_id, _clip_text(f"{flight.name}: {stopped}"))
        elif errors and looked_up:
            return
        elif errors and flight.submitted:
            # A call that raised may still have landed on the other side.
            detail = _clip_text(f"outcome unknown after {_reason(errors[0])}")
            await self._call("mark_uncertain", flight.item_id, detail=detail)
        elif errors:
            await self._finish(flight.item_id, status="failed", detail=_reason(errors[0]))
        else:
            await self._finish(flight.item_id, status="completed", detail=_clip_text(threads[-1].result()))

    async def _wait_outliving(self) -> None:
        # Each is bounded by `uninterruptible_s`; a result written late would lose the run's item.
        while self._outliving:
            await asyncio.wait(set(self._outliving))

    # --- tool calls ---------------------------------------------------------------------------

    async def tool_call(
        self,
        *,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        body: Callable[[], Awaitable[Any]],
        declaration: ToolDeclaration = UNDECLARED,
        kind: str = "",
        mechanism: str = "",
        extra: dict[str, Any] | None = None,
        stopped_result: Any = STOPPED_RESULT,
        parent: int | None = None,
    ) -> Any:
        """Register, pass the boundary, run `body`, record the outcome. After Stop the body never
        runs and `stopped_result` is returned instead (the model reads it as the tool's answer).
        `parent`: the item the call belongs under (a subagent's run), else none."""
        ahead = self._ahead.pop(call_id, None) if call_id else None
        external = declaration.external
        if ahead is not None and external:  # declared otherwise than when it was asked for
            self._later(self._settle_never_run(ahead[1], name), name)
            ahead = None
        if ahead is not None:
            registration = ahead[1]
        else:
            registration = asyncio.ensure_future(
                self._register_started(
                    **self._tool_registration(call_id, name, arguments, declaration, kind, mechanism, extra, parent)
                )
            )
        try:
            item_id = await asyncio.shield(registration)
        except StopRequested:
            self.stop_seen()
            return stopped_result
        except asyncio.CancelledError:
            # Cancelled (Stop's cancel, most often) while the registration was on its way: the
            # ledger may already hold the call as started, with nobody left to say how it ended.
            # Its body never ran; the answer is awaited apart and the call recorded stopped.
            self._later(self._settle_unstarted(registration, name), name)
            raise
        if ahead is not None and self.stopped.is_set():
            # Registered ahead, and Stop known before its body began: the body never runs.
            self._later(self._stopped_unrun(item_id, name), name)
            return stopped_result
        flight = _InFlight(item_id, name, declaration, external, CallThreads(self.stop_flag))
        self._in_flight[call_id] = flight
        scope = CALL.set(flight.calls)
        if self._outbox is not None:
            # The caller now waits on the body, not on the ledger: the results waiting go now.
            self._outbox.send_all()
        try:
            result = await body()
        except asyncio.CancelledError:
            if self._in_flight.pop(call_id, None) is not None:
                if flight.calls.abandoned():
                    # The await ended, the thread did not: recorded as it is, settled as it ends.
                    self._outlive(flight)
                    raise
                # Tracked, not awaited: the record is written apart from the cancellation (which must
                # not lose it), and the run waits for it (flush) before it ends. Awaiting it here
                # would hold the cancellation back by a round trip, behind every other run's report
                # when hundreds are stopped at once.
                self._later(self._settle_interrupted(flight, "interrupted by Stop"), name)
            raise
        except ToolStopped as exc:
            self._in_flight.pop(call_id, None)
            self._later(self._stopped(item_id, _clip_text(f"{name}: {exc}")), name)
            raise
        except Exception as exc:
            self._in_flight.pop(call_id, None)
            reason = f"{type(exc).__name__}: {exc}"[:200]
            if external:
                # A call that raised may still have landed on the other side.
                self._later(
                    self._call("mark_uncertain", item_id, detail=_clip_text(f"outcome unknown after {reason}")), name
                )
            else:
                self._later(self._finish(item_id, status="failed", detail=reason, flushed=False), name)
            raise
        finally:
            CALL.reset(scope)
        self._in_flight.pop(call_id, None)
        failure = self._failed.pop(call_id, None)
        if failure is not None:
            # The framework turned the tool's exception into text for the model; the ledger keeps it failed.
            status = "uncertain" if external else "failed"
            if status == "uncertain":
                self._later(
                    self._call("mark_uncertain", item_id, detail=_clip_text(f"outcome unknown after {failure}")), name
                )
            else:
                self._later(self._finish(item_id, status="failed", detail=failure, flushed=False), name)
            return result
        self._later(self._finish(item_id, status="completed", detail=_clip_text(result), flushed=False), name)
        return result

    def _tool_registration(
        self,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        declaration: ToolDeclaration,
        kind: str,
        mechanism: str,
        extra: dict[str, Any] | None,
        parent: int | None,
    ) -> dict[str, Any]:
        """What a tool call is registered with (`_register_started`'s keywords)."""
        external = declaration.external
        key = declaration.idempotency_key(arguments) if declaration.idempotency_key and external else ""
        detail = {
            "tool": {
                "framework": self.framework,
                "name": name,
                "call_id": call_id,
                "arguments": _clip(arguments),
                **declaration.as_detail(),
                **(extra or {}),
            }
        }
        if declaration.http:
            detail["http"] = {"system": declaration.system, **declaration.http}
        placed: dict[str, Any] = {"parent": parent} if parent is not None else {}
        return {
            "submit_key": key if external else "",
            "kind": kind or ("external_operation" if external else "local_worker"),
            "noun": noun_of(declaration.noun or f"{name} call"),
            "mechanism": mechanism or ("http" if declaration.http else "manual"),
            "handle": call_id,
            "label": name,
            "idempotency_key": key,
            "detail": detail,
            **placed,
        }

    def tool_call_ahead(
        self,
        *,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        declaration: ToolDeclaration = UNDECLARED,
        kind: str = "",
        mechanism: str = "",
        extra: dict[str, Any] | None = None,
        parent: int | None = None,
    ) -> None:
        """The model's answer asks for this call: its registration (and boundary) starts now,
        while the framework reads the answer and gets to running the call, and `tool_call` with
        the same call id takes it over instead of registering then. The same record, a few
        milliseconds sooner; off the caller's path.

        Never for a call that acts outside (`external`): its key is submitted when it is about to
        run, not before. Nothing starts once Stop is known. If Stop is known by the time the body
        would begin, it never begins (`tool_call`). A call registered ahead that the framework
        never runs is recorded when the run ends: stopped, if Stop ended the run, else cancelled,
        "never ran"."""
        if not call_id or call_id in self._ahead or declaration.external or self.stopped.is_set():
            return
        registration = asyncio.ensure_future(
            self._register_started(
                **self._tool_registration(call_id, name, arguments, declaration, kind, mechanism, extra, parent)
            )
        )
        self._ahead[call_id] = (name, registration)

    async def _settle_never_run(self, registration: asyncio.Future[int], name: str) -> None:
        """A call registered ahead (`tool_call_ahead`) that the framework never ran."""
        try:
            item_id = await registration
        except StopRequested:
            return  # the boundary refused it, and recorded it so
        except Exception:
            log.exception("could not learn whether the %s call asked for was recorded", name)
            return
        try:
            if self.stopped.is_set():
                await self._stopped_unrun(item_id, name)
                return
            # Nothing stopped it: the summary tells it "never ran" (`evidence.never_ran`), not "stopped".
            words = _clip_text(f"{name}: asked for, never ran")
            await self._call("note_evidence", item_id, message=words, evidence={NEVER_RAN: True})
            try:
                await self._call("cancel", item_id, detail=words)
            except Conflict:
                # A Stop committed meanwhile, whose job left the item awaiting this report.
                await self._stopped_unrun(item_id, name)
        except Exception:
            log.exception("could not record the %s call that never ran (item %s)", name, item_id)

    def note_failure(self, call_id: str, error: BaseException, *, answer: Any = None) -> None:
        """The framework caught the tool's exception and answered the model with `answer`."""
        self._failed[call_id] = f"{type(error).__name__}: {error}"[:200]

    async def _register_started(self, *, submit_key: str, lane: str = "writes", **register: Any) -> int:
        """Register and pass the boundary: one round trip where the runtime offers it."""
        if hasattr(self.runtime, "register_started"):
            item_id: int = await self._call(
                "register_started", self.task_id, submit_key=submit_key, worker=self.worker, lane=lane, **register
            )
            return item_id
        item = await self._call("register", self.task_id, **register)
        if submit_key:
            await self._call("submit", item.id, idempotency_key=submit_key, worker=self.worker)
        else:
            await self._call("start", item.id, worker=self.worker)
        return int(item.id)

    async def _send_results(self, taken: list[Any]) -> None:
        """Several results in one request (`write_results`), each as `_send_result` sends it."""
        held = self.item_id
        await self._call("write_results", _result_rows(taken, held), lane="results")
        await self._settle_check_after(held)

    async def _settle_check_after(self, held: int | None) -> None:
        if held is not None and self.item_id is None:
            # The run's item was settled while these results were being written (the run ended
            # before its writes did): its check may not have seen them, so check again.
            await self._call("task_settle_check", self.task_id)

    async def _finish(self, item_id: int, *, status: str, detail: str, flushed: bool = True) -> None:
        """A result, off the caller's path; nobody reads the answer, so a runtime that can skip
        reading the item back (`finish_fast`) does, in one round trip while the run's own item
        keeps the task unsettled. `flushed=False`: on the results lane, whose commits wait for the
        disk unless the operator opted out (see the module's docstring), or, over a runtime whose
        every call is a request, sent with the others waiting when the next tool body starts
        (`results.py`); the run's own end always waits and goes at once."""
        if not flushed and self._outbox is not None:
            await self._outbox.write(item_id, status, detail)
            return
        await self._send_result(item_id, status, detail, lane="writes" if flushed else "results")

    async def _send_result(self, item_id: int, status: str, detail: str, lane: str = "results") -> None:
        if not hasattr(self.runtime, "finish_fast"):
            await self._call("finish", item_id, status=status, detail=detail, lane=lane)
            return
        held = self.item_id if item_id != self.item_id else None
        await self._call("finish_fast", item_id, status=status, detail=detail, open_item=held, lane=lane)
        await self._settle_check_after(held)

    async def _settle_unstarted(self, registration: asyncio.Future[int], name: str) -> None:
        """A call cancelled before its registration answered: once it does, the item (started at
        the boundary, its body never run) is recorded stopped. A boundary that refused it recorded
        it already."""
        try:
            item_id = await registration
        except StopRequested:
            return
        except Exception:
            log.exception("could not learn whether the cancelled %s call was recorded", name)
            return
        try:
            await self._stopped_unrun(item_id, name)
        except Exception:
            log.exception("could not record the cancelled %s call (item %s)", name, item_id)

    async def _settle_interrupted(self, flight: _InFlight, why: str) -> None:
        try:
            if flight.submitted and flight.declaration.http:
                # The stop service asked the http mechanism to look the key up; it decides.
                return
            if flight.declaration.read_only:
                # Stop's job may have got there first and left the call awaiting this report.
                await self._stopped(flight.item_id, _clip_text(f"{flight.name}: {why}"))
            else:
                undeclared = "" if flight.declaration.effect != "unknown" else " (undeclared: possibly destructive)"
                detail = _clip_text(f"{flight.name}: {why}{undeclared}")
                await self._call("mark_uncertain", flight.item_id, detail=detail)
        except Exception:
            log.exception("could not record the interrupted %s call (item %s)", flight.name, flight.item_id)

    # --- model requests ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def model_request(self, label: str = "", *, acts: bool = False) -> AsyncIterator[asyncio.Future[_Draft]]:
        """Around one model request: a draft item. Refused (StopRequested) after Stop. Yields the
        draft's item id to come (`draft_id`), under which what the response launched is recorded.
        `acts`: the request can act on the provider's side (hosted tools), so its record waits for
        the disk like a tool call's (the caller awaits it before sending).

        The item is recorded (registered and passed through the boundary) while the request is out,
        off the caller's path. When the answer is back:
        - the record is done and the boundary refused it: Stop came first, so the answer is
          discarded (StopRequested), and the ledger's "discarded" is what the agent did;
        - the record is not done yet: the answer is handed over at once (a commit is slower than
          the model here), and the record is finished when it is done. If the boundary refused it
          after all, the answer was nevertheless used, so the draft's completion is reported on the
          refused item, which the ledger keeps as a late result: "completed; review required",
          never "discarded". Whatever the agent does next passes the boundary, which refuses it;
        - Stop is already known here: the answer waits for the record, as a refused one discards it.
        """
        self.model_requests += 1
        label = label or f"model request {self.model_requests}"
        if self.stopped.is_set():
            # Never sent; still recorded (cancelled by the boundary), so every request the framework
            # made is in the ledger.
            with contextlib.suppress(StopRequested):
                await self._register_started(
                    submit_key="", kind="model_request", noun="draft", label=label, mechanism="manual"
                )
            raise StopRequested(f"Task {self.task_id} was stopped.", task=self.task_id)
        started = self._draft_begin(label, "writes" if acts else "results")
        outcome: tuple[str, str] = ("completed", "")
        used_early = False
        try:
            yield started
            if started.done() or self.stopped.is_set():
                if (await asyncio.shield(started)).refused:
                    self.stop_seen()
                    raise _discarded(self.task_id)
            else:
                used_early = True
        except asyncio.CancelledError:
            outcome = ("cancelled", "discarded by Stop")
            raise
        except StopRequested:
            outcome = ("cancelled", "discarded by Stop")
            raise
        except Exception as exc:
            outcome = ("failed", f"{type(exc).__name__}: {exc}"[:200])
            raise
        finally:
            self._later(self._model_end(started, *outcome, used_early=used_early), label)

    def model_request_from_thread(self, loop: asyncio.AbstractEventLoop) -> ThreadDraft:
        """`model_request` for a framework that makes its model requests on threads of its own
        (CrewAI): the same draft and the same record, opened and closed from that thread without
        waiting on the run's loop (`loop`), so the request goes out at once and its answer comes
        back to the thread that asked without two turns through the loop. Call it only while Stop
        is not known here (`stop_flag`); a request after Stop goes through `model_request`, which
        refuses it."""
        return ThreadDraft(self, loop)

    def _thread_draft_begin(self, draft: ThreadDraft) -> None:
        # On the run's loop: the draft's record starts, as `model_request` starts it.
        self.model_requests += 1
        draft.label = f"model request {self.model_requests}"
        draft.started = self._draft_begin(draft.label, "results")
        draft.started.add_done_callback(lambda started: draft.record.set_result(started.result()))

    def _thread_draft_end(self, draft: ThreadDraft, status: str, detail: str, used_early: bool) -> None:
        # On the run's loop, after `_thread_draft_begin` (the loop runs them in the order sent).
        if draft.started is not None:
            self._later(self._model_end(draft.started, status, detail, used_early=used_early), draft.label)

    def _draft_begin(self, label: str, lane: str) -> asyncio.Future[_Draft]:
        """A draft's record, started off the caller's path: the future of what it became."""
        started: asyncio.Future[_Draft] = asyncio.get_running_loop().create_future()
        self._later(self._model_begin(label, started, lane), label)
        return started

    async def _model_begin(self, label: str, started: asyncio.Future[_Draft], lane: str) -> None:
        try:
            item_id = await self._register_started(
                submit_key="", kind="model_request", noun="draft", label=label, mechanism="manual", lane=lane
            )
            started.set_result(_Draft(item_id))
        except StopRequested as exc:
            # The boundary cancelled it: a draft never started; recorded, cancelled, still a parent.
            started.set_result(_Draft(getattr(exc, "item_id", None), refused=True))
        except BaseException as exc:
            started.set_result(_Draft(None))
            if not isinstance(exc, Exception):
                raise
            log.exception("could not record %s", label)

    async def draft_id(self, started: asyncio.Future[_Draft]) -> int | None:
        """The draft's item id (also for a draft the boundary refused), or None if unrecorded."""
        return (await asyncio.shield(started)).item_id

    async def _model_end(
        self, started: asyncio.Future[_Draft], status: str, detail: str, *, used_early: bool = False
    ) -> None:
        draft = await started
        if draft.item_id is None:
            return
        if draft.refused:
            if used_early and status == "completed":
                # Stop committed before the record, but the answer was already in the agent's
                # hands: say so on the refused item (a late result, for review), and stop here too.
                self.stop_seen()
                await self._finish(draft.item_id, status="completed", detail=USED_AFTER_REFUSAL)
            return
        if status == "cancelled":
            # Like a tool call: Stop's job may have left the draft awaiting this report.
            await self._stopped(draft.item_id, detail)
        else:
            await self._finish(draft.item_id, status=status, detail=detail, flushed=False)

    # --- plumbing -----------------------------------------------------------------------------

    async def _call(self, method: str, *args: Any, lane: str = "writes", **kwargs: Any) -> Any:
        """One runtime call: awaited for an async runtime, else on a thread of `lane`: "writes"
        (commits wait for the disk), "results" (they wait unless the operator opted out), "watch"
        (Stop's, apart so a poll never queues behind writes)."""
        fn = getattr(self.runtime, method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        pool = lanes.lane(lane, self.runtime)
        prepare = getattr(self.runtime, "thread_prepare", None)
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    pool, lambda: lanes.in_lane(fn, prepare, lane != "results", args, kwargs)
                )
            except Exception as exc:
                # PostgreSQL chose this write as a deadlock victim and rolled it back whole; the
                # ledger's writes are safe to repeat (a repeated result changes nothing).
                if attempt == DEADLOCK_RETRIES or "deadlock detected" not in str(exc):
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _later(self, work: Awaitable[Any], name: str) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        if isinstance(task, asyncio.Task):
            task.set_name(f"stopdesk:{name}")
        self._writes.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._written)
        return task

    def _written(self, task: asyncio.Future[Any]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stopdesk write failed: %r", task.exception())


class ThreadDraft:
    """A model request's draft, held by the framework's thread that makes the request
    (`StopdeskRun.model_request_from_thread`). Its record is written on the run's loop, off that
    thread's path; the thread says how the request ended (`answered`, `ended`)."""

    def __init__(self, run: StopdeskRun, loop: asyncio.AbstractEventLoop) -> None:
        self.run = run
        self.loop = loop
        self.label = ""
        self.started: asyncio.Future[_Draft] | None = None  # the loop's, once begun there
        self.record: Future[_Draft] = Future()  # the same, for this thread
        self._ended = False
        loop.call_soon_threadsafe(run._thread_draft_begin, self)

    def answered(self) -> None:
        """The answer is back: it may be used, unless the boundary refused the draft, Stop having
        come first; then it is discarded (StopRequested) and the ledger's "discarded" is what the
        agent did. As in `model_request`: a record not done yet (and no Stop known) does not hold
        the answer back; if the boundary refused it after all, the ledger says the answer was used
        ("completed; review required")."""
        if self.record.done() or self.run.stop_flag.is_set():
            if self.record.result().refused:
                with contextlib.suppress(RuntimeError):  # the run's loop already closed
                    self.loop.call_soon_threadsafe(self.run.stop_seen)
                self.ended("cancelled", "discarded by Stop")
                raise _discarded(self.run.task_id)
            self._end("completed", "", used_early=False)
            return
        self._end("completed", "", used_early=True)

    def ended(self, status: str, detail: str) -> None:
        """The request ended without an answer to use: "cancelled" (Stop ended the wait for it),
        or "failed"."""
        self._end(status, detail, used_early=False)

    def _end(self, status: str, detail: str, *, used_early: bool) -> None:
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(RuntimeError):  # the run's loop already closed
            self.loop.call_soon_threadsafe(self.run._thread_draft_end, self, status, detail, used_early)


def _discarded(task_id: int) -> StopRequested:
    """A draft's answer discarded: the boundary refused its record, Stop having come first."""
    return StopRequested(f"Task {task_id} was stopped; the answer is discarded.", task=task_id)


@dataclass(frozen=True)
class _Draft:
    """A model request's record: its item (None if it could not be recorded), and whether the
    boundary refused it (Stop came first)."""

    item_id: int | None
    refused: bool = False


RUN_STOPPED = "stopped before it finished"
NEVER_RAN = "never_ran"  # evidence of a call registered as asked for that the agent never ran
USED_AFTER_REFUSAL = "the answer came back before Stop was known here, and the agent used it"
DEADLOCK_RETRIES = 3


def _result_rows(taken: list[Pending], held: int | None) -> list[dict[str, Any]]:
    """`write_results`' rows: each result names the run's own item (`held`) as the one keeping the
    task unsettled, except the run's own."""
    return [
        {"item": p.item_id, "status": p.status, "detail": p.detail, "open_item": held if p.item_id != held else None}
        for p in taken
    ]


def _writes_results(runtime: Any) -> bool:
    """Whether the runtime can write several results in one call (and one transaction)."""
    return callable(getattr(runtime, "write_results", None)) and hasattr(runtime, "finish_fast")


def current_run() -> StopdeskRun:
    run = CURRENT.get()
    if run is None:
        raise RuntimeError("no stopdesk run is active here: wrap the agent run in `async with StopdeskRun(...)`")
    return run


def _reason(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}"[:200]


def _clip(value: Any, limit: int = 2000) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= limit else {"truncated": text[:limit]}


def _clip_text(value: Any, limit: int = 200) -> str:
    """A tool's answer as a person reads it: a message object's text (a LangChain ToolMessage),
    not its repr."""
    content = getattr(value, "content", None)
    return str(content if isinstance(content, str) else value)[:limit]
