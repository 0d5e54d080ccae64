"""CrewAI (crewai 1.15): the crew's kickoff is the run's item, every tool call and model request a
child item of the task, and Stop.

    from crewai import LLM, Agent, Crew, Task
    from stopdesk.agent.frameworks.crewai import run_crew

    crew = Crew(agents=[Agent(..., tools=[look_up], llm=LLM(model="openai/gpt-5"))], tasks=[...])
    output = await run_crew(client, task.id, crew, inputs={...})   # RunStopped on Stop

`client` is a `stopdesk.client.AsyncClient`: crewai cannot be installed beside the stopdesk server
(it pins older `mcp` and `openai` majors), so a CrewAI agent runs in a process of its own with
`pip install "stopdesk[crewai]"` (the client side only) and talks to the server over HTTP.

Open-source CrewAI has no way to stop a crew from outside. Hook points (read in the installed
package): CrewAI runs an agent's steps on threads of its own (its flow runs each step with
`asyncio.to_thread`), so the run's bookkeeping lives on the caller's event loop and CrewAI's threads
hand it their calls:
- tools: each agent's and task's tools are replaced by a `BaseTool` whose `_run` puts the call
  through the run (`StopdeskRun.tool_call`) on that loop, which passes the boundary, then runs the
  tool's own body: an `async def` body on the loop itself (so Stop cancels it at its next await),
  a plain `def` body in a thread the run knows (`threads.py`). After Stop the body never runs and
  the model reads that the task was stopped.
- model requests: each agent's LLM is a copy whose class wraps `call`/`acall` in a draft
  (`StopdeskRun.model_request`; from CrewAI's thread, `model_request_from_thread`: the request
  goes out at once on a thread of ours, the draft's record is written on the run's loop beside it,
  and Stop ends CrewAI's wait for the answer); a request made after Stop is refused, and an answer
  the boundary refused is discarded. The tool calls the model asked for are remembered with the
  model's call id, which the tool wrapper (to which CrewAI passes only the arguments) takes back
  by name and arguments.
- step and task callbacks (`step_callback`, `task_callback`, chained before the crew's own): after
  Stop they raise, so the crew stops between steps and between tasks.
Stop ends the crew that way, between steps: nothing cancels CrewAI's own threads. The run waits for
the crew's thread to return (`cleanup_s` at most) before `RunStopped`.

What Stop interrupts: an `async def` tool body (a `@tool` on an `async def`, or a `BaseTool` with its
own `_arun`) at its next await. A plain `def` body runs on in its thread, which no cancel reaches: it
is recorded as still running ("cannot be interrupted; waiting for it to finish") and then as it
ended (`core`), never "stopped", unless it checks `stopdesk.stop_requested()` and raises
`ToolStopped`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import copy
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, NamedTuple

from crewai import Crew
from crewai.hooks.dispatch import HookAborted
from crewai.tools import BaseTool
from crewai.utilities.string_utils import sanitize_tool_name
from pydantic import ConfigDict, PrivateAttr

from stopdesk.agent.frameworks.core import STOPPED_RESULT, StopdeskRun, ThreadDraft
from stopdesk.agent.frameworks.declare import ToolDeclaration, first_declaration
from stopdesk.protocol.errors import StopRequested

FRAMEWORK = "crewai"


class CrewStopped(HookAborted):
    """Raised inside CrewAI's threads after Stop (from a model request or a step/task callback), so
    the crew ends between steps. A `HookAborted`: CrewAI's deliberate stop, which it passes through
    rather than retrying the task (`Agent.max_retry_limit`)."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"Task {task_id} was stopped.", source="stopdesk")
        self.task_id = task_id


class _Asked(NamedTuple):
    """A tool call a model answer asked for: the tool's name as the model saw it, its arguments
    (canonical text, and the object), the model's call id."""

    name: str
    canonical: str
    parsed: dict[str, Any] | None
    call_id: str


class _Bridge:
    """A run on its event loop, reached from CrewAI's threads."""

    def __init__(self, run: StopdeskRun, loop: asyncio.AbstractEventLoop) -> None:
        self.run = run
        self.loop = loop
        self.in_flight: set[concurrent.futures.Future[Any]] = set()
        self.lock = threading.Lock()
        # The tool calls the model asked for, not yet run: the model's call ids.
        self.asked: list[_Asked] = []
        self.calls = 0
        self.tools: dict[str, StopdeskTool] = {}  # the crew's guarded tools, by the name the model sees

    def submit[T](self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the run's loop and wait for it here (a CrewAI thread)."""
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        with self.lock:
            self.in_flight.add(future)
        try:
            return future.result()
        finally:
            with self.lock:
                self.in_flight.discard(future)

    def model_call(self, request: Callable[[], Any]) -> Any:
        """One model request from a CrewAI thread (`LLM.call`), as a draft of the run. The request
        goes out at once on a thread of `_MODEL_THREADS` while the draft's record starts on the
        run's loop, and this thread waits for the answer; Stop ends that wait (`cancel_in_flight`),
        and the answer is then discarded. The thread that has the answer decides whether it may be
        used (`ThreadDraft.answered`) and sends the registrations of the tool calls it asks for to
        the loop (`ask_ahead`) before it hands the answer over, so they are on their way while
        CrewAI reads it."""
        draft = self.run.model_request_from_thread(self.loop)
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        context = contextvars.copy_context()  # the caller's, as CrewAI's own call would have it
        _MODEL_THREADS.submit(context.run, self._answer, draft, answer, request)
        with self.lock:
            self.in_flight.add(answer)
        try:
            return answer.result()
        except concurrent.futures.CancelledError:
            # Stop ended the wait while the request was out: its answer is discarded.
            draft.ended("cancelled", "discarded by Stop")
            raise CrewStopped(self.run.task_id) from None
        finally:
            with self.lock:
                self.in_flight.discard(answer)

    def _answer(self, draft: ThreadDraft, answer: concurrent.futures.Future[Any], request: Callable[[], Any]) -> None:
        """On a thread of `_MODEL_THREADS`: the request, then its answer to the waiting thread, unless
        Stop ended that wait first."""
        try:
            result = request()
        except BaseException as exc:
            if answer.set_running_or_notify_cancel():
                draft.ended("failed", f"{type(exc).__name__}: {exc}"[:200])
                answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not answer.set_running_or_notify_cancel():
            return  # Stop ended the wait: the waiting thread recorded the answer discarded
        try:
            draft.answered()
        except StopRequested as exc:
            error = CrewStopped(self.run.task_id)
            error.__cause__ = exc
            answer.set_exception(error)
            return
        except BaseException as exc:
            answer.set_exception(exc)
            return
        asked = self.remember_asked(result)
        if asked:
            with contextlib.suppress(RuntimeError):  # the run's loop already closed
                self.loop.call_soon_threadsafe(self.ask_ahead, asked)
        answer.set_result(result)

    def cancel_in_flight(self) -> None:
        """Stop: cancel the tool calls under way (their awaits; a thread body runs on)."""
        with self.lock:
            futures = list(self.in_flight)
        for future in futures:
            future.cancel()

    def stopped(self) -> bool:
        return self.run.stop_flag.is_set()

    def remember_asked(self, answer: Any) -> list[_Asked]:
        """The tool calls a model answer asks for, remembered."""
        asked = []
        for call in answer if isinstance(answer, list) else []:
            function = getattr(call, "function", None) or (call.get("function") if isinstance(call, dict) else None)
            call_id = getattr(call, "id", None) or (call.get("id") if isinstance(call, dict) else None)
            if function is None or not call_id:
                continue
            name = getattr(function, "name", None) or (function.get("name") if isinstance(function, dict) else "")
            raw = getattr(function, "arguments", None)
            if raw is None and isinstance(function, dict):
                raw = function.get("arguments")
            canonical, parsed = _arguments(raw)
            asked.append(_Asked(str(name), canonical, parsed, str(call_id)))
        with self.lock:
            self.asked.extend(asked)
        return asked

    def ask_ahead(self, asked: list[_Asked]) -> None:
        """The calls of the crew's own tools that an answer asks for are registered now
        (`tool_call_ahead`), while CrewAI reads the answer and gets to running them (on the run's
        loop). A call CrewAI then never runs (its cache answered, a usage limit refused it) is
        recorded as never ran when the run ends."""
        for call in asked:
            tool = self.tools.get(call.name)
            if tool is not None and call.parsed is not None:
                self.run.tool_call_ahead(
                    call_id=call.call_id, name=tool.name, arguments=call.parsed, declaration=tool.declaration
                )

    def call_id(self, name: str, arguments: dict[str, Any]) -> str:
        """The model's id for this call: the first call of this tool asked for with these
        arguments; else, as CrewAI validates them against the tool's schema first (coerced, with
        the defaults filled in), the first whose arguments that would give; else an id of its own
        (the call asked for and this one are then two records: one never ran, one ran)."""
        wanted = _arguments(arguments)[0]
        seen_as = sanitize_tool_name(name)  # the name CrewAI gives the model
        with self.lock:
            same_name = [index for index, asked in enumerate(self.asked) if asked.name == seen_as]
            exact = [index for index in same_name if self.asked[index].canonical == wanted]
            for index in exact or [i for i in same_name if _validated_from(self.asked[i].parsed, arguments)]:
                return self.asked.pop(index).call_id
            self.calls += 1
            return f"{name}-{self.calls}"


# The threads model requests go out on: CrewAI's thread waits there for the answer, which Stop can
# end (a request itself cannot be interrupted; its answer is discarded).
_MODEL_THREADS = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="stopdesk-model")


class StopdeskTool(BaseTool):
    """A CrewAI tool whose calls go through the run: the boundary, the ledger, then the body of the
    tool it wraps (`inner`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    inner: BaseTool
    declaration: ToolDeclaration
    _bridge: _Bridge | None = PrivateAttr(default=None)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        bridge = self._bridge
        if bridge is None:
            return self.inner.run(*args, **kwargs)
        run = bridge.run
        arguments = dict(kwargs)
        call_id = bridge.call_id(self.name, arguments)
        body = _body(self.inner, args, kwargs)
        try:
            return bridge.submit(
                run.tool_call(
                    call_id=call_id,
                    name=self.name,
                    arguments=arguments,
                    body=body,
                    declaration=self.declaration,
                )
            )
        except concurrent.futures.CancelledError:
            # Stop cancelled the call (a thread body runs on, and the run records it as it ends).
            return STOPPED_RESULT


def _body(inner: BaseTool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    """The tool's own body as the run's loop runs it: a coroutine there, a plain function in a thread
    (`asyncio.to_thread` carries the call's context, so `stop_requested()` answers in it)."""
    func = getattr(inner, "func", None)
    if func is not None and inspect.iscoroutinefunction(func):
        return lambda: func(*args, **kwargs)
    if func is None and type(inner)._arun is not BaseTool._arun:
        return lambda: inner._arun(*args, **kwargs)
    sync = func if func is not None else inner._run

    async def in_thread() -> Any:
        result = await asyncio.to_thread(sync, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return in_thread


def guard_tool(tool: BaseTool, declaration: ToolDeclaration | None = None) -> StopdeskTool:
    """The same tool, with the ledger and the boundary around its body (`tool` is unchanged). Its
    declaration: `declaration`, else `@declare` on the tool or on the function it was made from."""
    if isinstance(tool, StopdeskTool):
        return tool
    declared = declaration or first_declaration(getattr(tool, "func", None), tool)
    return StopdeskTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        result_as_answer=tool.result_as_answer,
        max_usage_count=tool.max_usage_count,
        inner=tool,
        declaration=declared,
    )


# The guarded class of each LLM class, made once: an LLM is a pydantic model, and pydantic builds
# a new model class in about 12 ms of CPU, which every kickoff would otherwise spend.
_GUARDED: dict[Any, type] = {}
# Where a guarded copy keeps the run its requests belong to: in the instance itself, outside
# pydantic's fields (never dumped), so a copy CrewAI makes of it belongs to the same run.
BRIDGE = "_stopdesk_bridge"


def _bridge_of(llm: Any) -> _Bridge | None:
    return getattr(llm, "__dict__", {}).get(BRIDGE)


def _guarded_llm(llm: Any) -> Any:
    """A copy of `llm` whose every request is a draft of the run (its class wraps `call`/`acall`)."""
    if getattr(type(llm), "__stopdesk_llm__", False):
        return llm
    clone = copy.copy(llm)
    object.__setattr__(clone, "__class__", _guarded_class(type(llm)))
    object.__setattr__(clone, BRIDGE, None)
    return clone


def _guarded_class(base: Any) -> type:
    known = _GUARDED.get(base)
    if known is not None:
        return known

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        bridge = _bridge_of(self)
        if bridge is None:
            return base.call(self, *args, **kwargs)
        if not bridge.stopped():
            return bridge.model_call(lambda: base.call(self, *args, **kwargs))
        try:
            # After Stop: refused, and recorded so (never sent).
            return bridge.submit(_draft(bridge, lambda: asyncio.to_thread(base.call, self, *args, **kwargs)))
        except concurrent.futures.CancelledError:
            raise CrewStopped(bridge.run.task_id) from None

    async def acall(self: Any, *args: Any, **kwargs: Any) -> Any:
        bridge = _bridge_of(self)
        if bridge is None:
            return await base.acall(self, *args, **kwargs)
        work = asyncio.run_coroutine_threadsafe(
            _draft(bridge, lambda: _on_loop_of(base.acall(self, *args, **kwargs))), bridge.loop
        )
        return await asyncio.wrap_future(work)

    members = {
        "call": call,
        "acall": acall,
        "__stopdesk_llm__": True,
        "__annotations__": {"__stopdesk_llm__": ClassVar[bool]},
    }
    return _GUARDED.setdefault(base, type(f"Stopdesk{base.__name__}", (base,), members))


async def _on_loop_of(work: Awaitable[Any]) -> Any:
    return await work


async def _draft(bridge: _Bridge, request: Callable[[], Awaitable[Any]]) -> Any:
    """One model request as a draft: refused after Stop; its answer discarded if the boundary
    refused the draft."""
    run = bridge.run
    try:
        async with run.model_request():
            answer = await request()
            asked = bridge.remember_asked(answer)
    except StopRequested as exc:
        raise CrewStopped(run.task_id) from exc
    bridge.ask_ahead(asked)  # only for an answer the crew is given
    return answer


def _checkpoint(bridge: _Bridge, then: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A step or task callback: `then` (the crew's own), and then, after Stop, raises, so the crew
    ends between steps and between tasks."""

    def callback(output: Any) -> Any:
        answer = then(output) if then is not None else None
        if bridge.stopped():
            raise CrewStopped(bridge.run.task_id)
        return answer

    return callback


def instrument(crew: Crew, declarations: dict[str, ToolDeclaration] | None = None) -> Crew:
    """A copy of `crew` whose agents' and tasks' tools are guarded and whose agents' model requests
    are drafts. A tool's declaration is `declarations[name]`, else read from the tool (`@declare`
    on the tool or on its function)."""
    declarations = declarations or {}
    crew = crew.copy()
    for agent in crew.agents:
        agent.tools = [guard_tool(t, declarations.get(t.name)) for t in agent.tools or []]
        if agent.llm is not None and not isinstance(agent.llm, str):
            agent.llm = _guarded_llm(agent.llm)
    for task in crew.tasks:
        if task.tools:
            task.tools = [guard_tool(t, declarations.get(t.name)) for t in task.tools]
    return crew


async def run_crew(
    runtime: Any,
    task_id: int,
    crew: Crew,
    inputs: dict[str, Any] | None = None,
    *,
    declarations: dict[str, ToolDeclaration] | None = None,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    uninterruptible_s: float = 300.0,
) -> Any:
    """`crew.kickoff(inputs)` under `task_id`: the ledger sees every tool call and model request,
    and Stop ends the crew between steps (RunStopped). `declarations`: what tools do, by name."""
    crew = instrument(crew, declarations)
    async with StopdeskRun(
        runtime,
        task_id,
        framework=FRAMEWORK,
        agent=str(crew.name or "") if crew.name != "crew" else "",
        cleanup_s=cleanup_s,
        watch=watch,
        poll_s=poll_s,
        uninterruptible_s=uninterruptible_s,
    ) as run:
        bridge = _Bridge(run, asyncio.get_running_loop())
        for tool in _tools_of(crew):
            tool._bridge = bridge
            bridge.tools.setdefault(sanitize_tool_name(tool.name), tool)
        for agent in crew.agents:
            if getattr(type(agent.llm), "__stopdesk_llm__", False):
                object.__setattr__(agent.llm, BRIDGE, bridge)
        crew.step_callback = _checkpoint(bridge, crew.step_callback)
        crew.task_callback = _checkpoint(bridge, crew.task_callback)
        for agent in crew.agents:
            agent.step_callback = crew.step_callback
        for task in crew.tasks:
            task.callback = crew.task_callback if task.callback is None else _checkpoint(bridge, task.callback)
        # The crew runs on a thread of its own (CrewAI's steps are threads in any case), so this
        # loop stays free for the run's bookkeeping and the calls CrewAI's threads hand it.
        kickoff = asyncio.ensure_future(asyncio.to_thread(crew.kickoff, inputs=inputs))
        return await run.run(_unshielded(kickoff), cancel=bridge.cancel_in_flight, stopped_errors=(CrewStopped,))


async def _unshielded(kickoff: asyncio.Future[Any]) -> Any:
    # Cancelling this await never reaches CrewAI's thread: the crew ends between steps instead.
    return await asyncio.shield(kickoff)


def _tools_of(crew: Crew) -> list[StopdeskTool]:
    tools = [t for a in crew.agents for t in a.tools or []] + [t for task in crew.tasks for t in task.tools or []]
    return [t for t in tools if isinstance(t, StopdeskTool)]


def _validated_from(asked: dict[str, Any] | None, arguments: dict[str, Any]) -> bool:
    """Whether `arguments` could be what CrewAI's validation made of the arguments `asked` for:
    every argument asked for is there, equal or equal as text (coerced)."""
    return asked is not None and all(
        key in arguments and (arguments[key] == value or str(arguments[key]).lower() == str(value).lower())
        for key, value in asked.items()
    )


def _arguments(arguments: Any) -> tuple[str, dict[str, Any] | None]:
    """A call's arguments (as the model sent them, JSON text, or as the tool gets them): their
    canonical text, to match one with the other, and the object, when they are one."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            return arguments, None
    return json.dumps(arguments, sort_keys=True, default=str), arguments if isinstance(arguments, dict) else None
