"""Task-augmented calls through the gateway: the client asks for a task (2025-11-25: `params.task`;
2026-07-28: it declares the `io.modelcontextprotocol/tasks` extension and the gateway decides, as a
server does), the call is registered and passes the boundary like a plain one, and the agent
side's `mcp_run_task` starts the task upstream and owns it: the upstream's task id is the item's
handle before anything else, Stop cancels it with `tasks/cancel` and reads it back, and the item
settles from what was read back (never from the cancel's acknowledgement).

The client gets a task of the gateway's own, with an id of its own (a fresh UUID, recorded on the
item as `gateway.client_task_id` beside the upstream's id as handle), because the upstream's id is
the upstream's: a 2025-11-25 server scopes it to its session with the gateway and need not make it
unguessable, a 2026-07-28 server may answer without a task at all while a 2025-11-25 client still
gets one, and the client's task ends `cancelled` at Stop while the upstream's may go on working.
The client's `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/list` are answered from what
the owner last read of the upstream task and from the item's Stop: once Stop cancelled it, the
client's task is `cancelled` with "stopped by <person>: <reason>", whatever the upstream does
next (terminal states never change); the item keeps the truth (cancelled, uncertain, or completed
when the read-back shows the work landed). Tasks are kept in the process that created them
(2025-11-25 sessions stick to their process) for their ttl. After a restart, a 2026-07-28 client
that asks about its task again is answered from the item and the upstream (`recorded_tasks`); the
item is the reconciler's once its owner's lease runs out. A 2025-11-25 client's task ended with its
session."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from reconcile.mechanisms.base import Seen
from reconcile.mechanisms.mcp.agent import StopPushed, TaskOwner, mcp_run_task
from reconcile.mechanisms.mcp.agent.common import error_text
from reconcile.mechanisms.mcp.servers import TASKS_EXTENSION, ServerSpec, with_task_capabilities
from reconcile.mechanisms.mcp.servers import is_modern as is_modern_revision
from stopdesk.agent.aio import LedgerThreads, in_thread, ledger_threads
from stopdesk.gateway.recorded_tasks import recorded_cancel, recorded_task
from stopdesk.gateway.sessions import ACTOR, stopped_words

CLIENT_CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"
RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
# Not fixed by the spec; -32000 is what task servers answer `tasks/result` of a cancelled task with.
TASK_CANCELLED = -32000
# How often an owner reads its upstream task back (at least; the upstream's pollInterval may ask
# for less often). A Stop does not wait for it: the StopHub wakes the owner at once.
TASK_POLL_S = 0.5
POLL_MS = round(TASK_POLL_S * 1000)
# How long a process keeps a client's task after it ended (the MCP option `task_keep_s`); a
# 2026-07-28 client asking later is answered from the item and the upstream (`recorded_tasks`).
KEEP_MS = 3_600_000


def modern_client(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def wants_task(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether a `tools/call` may be answered with a task: 2025-11-25 asks with `params.task`; in
    2026-07-28 the client declares the extension in the request's capabilities and the server decides."""
    params = ctx.params if isinstance(ctx.params, Mapping) else {}
    if not modern_client(ctx):
        return params.get("task") is not None
    meta = params.get("_meta") or {}
    return declares_tasks(meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None)


def declares_tasks(capabilities: Any) -> bool:
    """Whether a 2026-07-28 request's client capabilities declare the tasks extension."""
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def upstream_runs_tasks(spec: ServerSpec, mcp_facts: dict[str, Any]) -> bool:
    """The upstream offers tasks, and either lists the tool as one that may run as one (2025-11-25)
    or is a 2026-07-28 server, which lists no `taskSupport` and decides per call, for a tool the
    configuration names (`task: true`). Any other call stays a plain call, with everything a plain
    call has (its upstream request id, a Stop during the call cancelling it at once)."""
    if not mcp_facts.get("server_tasks"):
        return False
    if mcp_facts.get("task_support") in ("optional", "required"):
        return True
    return is_modern_revision(mcp_facts.get("revision")) and mcp_facts.get("tool") in spec.task_tools


def session_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """A 2025-11-25 task belongs to the client's session; a 2026-07-28 task to whoever names it."""
    if modern_client(ctx):
        return ""
    headers = getattr(ctx.request, "headers", None) or {}
    return str(headers.get("mcp-session-id") or "")


class TaskServer(Server[Any]):
    """The gateway's server, advertising tasks as each revision spells them: the core `tasks`
    capability in 2025-11-25, the extension in 2026-07-28 (the base class derives neither)."""

    def get_capabilities(
        self, *args: Any, protocol_version: str | None = None, **kwargs: Any
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        return with_task_capabilities(caps, protocol_version)


@dataclass(eq=False)
class ClientTask:
    """The gateway's task as its client knows it, and the owner of the upstream task behind it."""

    task_id: str
    item_id: int
    ledger_task_id: int
    session: str
    owner: TaskOwner
    wake: asyncio.Event  # set by the StopHub at Stop, or by the client's own tasks/cancel
    unwatch: Callable[[], None]
    created: float = field(default_factory=time.time)
    last_updated: float = field(default_factory=time.time)
    status: str = "working"
    status_message: str | None = None
    error: str | None = None  # what the owner raised
    changed: anyio.Event = field(default_factory=anyio.Event)
    done: bool = False
    ended: float | None = None
    keep_ms: int = KEEP_MS  # how long this process keeps the task once it ended

    def note_change(self) -> None:
        """The owner's hook (run in the gateway's loop): wake whoever waits on this task."""
        self.last_updated = time.time()
        self.changed.set()
        self.changed = anyio.Event()

    @property
    def ttl_ms(self) -> int:
        """The upstream's ttl, or this process's keep if shorter or the upstream set none. A ttl
        counts from the task's creation, and the task is kept `keep_ms` after it ended: the
        client is never promised more than it gets, and a long task's result outlives its ttl."""
        ttl = self.owner.detail.get("ttl_ms")
        return min(int(ttl), self.keep_ms) if isinstance(ttl, int) else self.keep_ms

    def expired(self, now: float) -> bool:
        return self.ended is not None and now > self.ended + self.keep_ms / 1000

    def settle(self) -> None:
        """The client's status, from what the owner saw. Once terminal it never changes."""
        if self.status in TERMINAL:
            return
        if self.owner.cancelled_by == "stop":
            self.status = "cancelled"  # its message, the Stop's words, is read when served (`_current`)
            return
        if not self.done:
            return
        final = self.owner.final
        if self.error is not None or final is None:
            self.status, self.status_message = "failed", self.error or "the upstream task ended without a result"
        elif final.seen == Seen.COMPLETED:
            self.status = "completed"
        elif final.seen == Seen.FAILED:
            self.status = "failed"
        elif final.seen == Seen.CANCELLED:
            self.status, self.status_message = "cancelled", "the upstream cancelled the task"
        else:
            self.status, self.status_message = "failed", final.message or f"upstream task {final.remote_status}"

    def to_json(self, *, modern: bool) -> dict[str, Any]:
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.last_updated),
        }
        poll_ms = POLL_MS  # the client's task changes no faster than its owner reads
        if modern:
            task |= {"ttlMs": self.ttl_ms, "pollIntervalMs": poll_ms}
        else:
            task |= {"ttl": self.ttl_ms, "pollInterval": poll_ms}
            if self.status == "completed" and _is_error(self.owner.result):
                task["status"] = "failed"  # 2025-11-25: a result with isError is a failed task
        if self.status_message:
            task["statusMessage"] = self.status_message
        if modern and self.status == "completed" and self.owner.result is not None:
            task["result"] = self.owner.result
        if modern and self.status == "failed" and self.owner.result is None:
            task["error"] = {"code": -32603, "message": self.status_message or "failed"}
        return task


class ClientTasks:
    """The gateway's tasks for one upstream, with the task group their owners run in."""

    def __init__(self, spec: ServerSpec, ledger: LedgerThreads, *, stopped_code: int, keep_ms: int = KEEP_MS) -> None:
        self.spec = spec
        self.keep_ms = keep_ms
        self.ledger = ledger
        self.stopped_code = stopped_code
        self._tasks: dict[str, ClientTask] = {}
        self._owners: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the gateway's lifetime. At shutdown the owners are cancelled: their items keep
        their handle and lease, and the reconciler takes them over once the lease runs out."""
        async with anyio.create_task_group() as owners:
            self._owners = owners
            try:
                yield
            finally:
                self._owners = None
                owners.cancel_scope.cancel()

    def with_task_support(self, listing: types.ListToolsResult) -> types.ListToolsResult:
        """For a 2025-11-25 client: the tools configured `task` say they may run as tasks, as that
        revision's tools do (a 2026-07-28 upstream's listing carries no `taskSupport`)."""
        tools = [
            tool.model_copy(update={"execution": types.ToolExecution(task_support="optional")})
            if tool.name in self.spec.task_tools and tool.execution is None
            else tool
            for tool in listing.tools
        ]
        return listing.model_copy(update={"tools": tools})

    def serve(self, server: Server[Any]) -> None:
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list)

    async def start(
        self,
        ctx: ServerRequestContext[Any, Any],
        *,
        client_task_id: str,
        ledger_task_id: int,
        item_id: int,
        tool: str,
        arguments: dict[str, Any],
        stopped: asyncio.Event,
        unwatch: Callable[[], None],
    ) -> dict[str, Any]:
        """The call has passed the boundary as an item: its owner starts the upstream task (its id
        recorded as the item's handle first), then the client hears of its own task."""
        if self._owners is None:
            unwatch()
            raise MCPError(code=-32603, message="the gateway is not running")
        owner = TaskOwner(item_id, keep_result=True)
        task = ClientTask(
            task_id=client_task_id,
            item_id=item_id,
            ledger_task_id=ledger_task_id,
            session=session_of(ctx),
            owner=owner,
            wake=stopped,
            unwatch=unwatch,
            keep_ms=self.keep_ms,
        )
        owner.on_change = task.note_change
        self._forget_expired()
        self._tasks[task.task_id] = task
        changed = task.changed
        self._owners.start_soon(self._own, task, tool, arguments)
        while not (owner.started.is_set() or task.done):
            await changed.wait()
            changed = task.changed
        modern = modern_client(ctx)
        if owner.task_id:
            return (
                {"resultType": "task", **task.to_json(modern=True)} if modern else {"task": task.to_json(modern=False)}
            )
        self._tasks.pop(task.task_id, None)
        if task.error is not None:  # recorded on the item by the owner; nothing for the client to poll
            raise MCPError(code=-32603, message=task.error)
        assert owner.result is not None  # a 2026-07-28 upstream answered at once, without a task
        if modern:  # the gateway decides as the upstream did: no task
            return {**owner.result, "resultType": "complete"}
        # A 2025-11-25 client asked for a task: it gets one, already completed.
        self._tasks[task.task_id] = task
        task.settle()
        return {"task": task.to_json(modern=False)}

    async def _own(self, task: ClientTask, tool: str, arguments: dict[str, Any]) -> None:
        with ledger_threads(self.ledger):
            try:
                await mcp_run_task(
                    item_id=task.item_id, tool=tool, actor=ACTOR, server=self.spec, arguments=arguments,
                    poll_s=TASK_POLL_S, owner=task.owner, passed=True,
                    stop_seen=StopPushed(task.wake, task.unwatch),
                )  # fmt: skip
            except Exception as exc:  # recorded on the item by mcp_run_task
                task.error = error_text(exc)
            finally:
                task.unwatch()
                task.ended = time.time()
                task.done = True
                task.note_change()

    def _forget_expired(self) -> None:
        # The spec lets a receiver delete a task once its ttl (from creation) has passed; here a
        # task is kept its keep after it ended, which is never sooner. The item keeps the record.
        now = time.time()
        for gone in [t for t in self._tasks.values() if t.expired(now)]:
            self._tasks.pop(gone.task_id, None)

    def _find(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> ClientTask:
        self._forget_expired()
        task = self._tasks.get(task_id)
        if task is None or task.session != session_of(ctx):
            # Another session's task is as unknown as one that never was.
            raise MCPError(code=INVALID_PARAMS, message=f"Task not found: {task_id}")
        return task

    async def _current(self, task: ClientTask) -> ClientTask:
        task.settle()
        if task.status == "cancelled" and task.owner.cancelled_by == "stop" and task.status_message is None:
            task.status_message = await in_thread(stopped_words, task_id=task.ledger_task_id)
        return task

    async def _get(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        with ledger_threads(self.ledger):
            if self._elsewhere(ctx, params.task_id):
                return await recorded_task(self.spec, params.task_id, poll_ms=POLL_MS)
            task = await self._current(self._find(ctx, params.task_id))
        return task.to_json(modern=modern_client(ctx))

    def _elsewhere(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> bool:
        """A 2026-07-28 client names a task this process does not hold: one the gateway gave out
        before it restarted, or from another of its processes (`recorded_tasks`)."""
        self._forget_expired()
        return modern_client(ctx) and task_id not in self._tasks

    async def _result(
        self, ctx: ServerRequestContext[Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        """Blocks until the task is terminal, then answers what the call would have: its result, or
        the error that says who stopped it. 2025-11-25 only: the 2026-07-28 extension has no
        `tasks/result` (its `tasks/get` carries the result)."""
        _core_tasks_only(ctx, "tasks/result")
        task = self._find(ctx, params.task_id)
        with ledger_threads(self.ledger):
            while True:
                changed = task.changed
                await self._current(task)
                if task.status in TERMINAL:
                    break
                await changed.wait()
        meta = {RELATED_TASK_META_KEY: {"taskId": task.task_id}}
        if task.status == "cancelled":
            if task.owner.cancelled_by == "stop":
                raise MCPError(code=self.stopped_code, message=task.status_message or "stopped", data={"_meta": meta})
            raise MCPError(
                code=TASK_CANCELLED, message=task.status_message or "Task was cancelled", data={"_meta": meta}
            )
        if task.owner.result is None:
            raise MCPError(code=-32603, message=task.status_message or "the upstream task has no result")
        return {**task.owner.result, "_meta": meta}

    async def _cancel(self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams) -> dict[str, Any]:
        """The client cancels its own task: `cancelled` before the reply (2025-11-25), the owner
        then cancels the upstream task and reads it back, and the item follows that read-back."""
        if self._elsewhere(ctx, params.task_id):
            with ledger_threads(self.ledger):
                return await recorded_cancel(self.spec, params.task_id)
        task = self._find(ctx, params.task_id)
        with ledger_threads(self.ledger):
            await self._current(task)
        modern = modern_client(ctx)
        if task.status in TERMINAL:
            if modern:
                return {}  # 2026-07-28: an empty acknowledgement, whatever the task's state
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task.task_id} is already {task.status}")
        task.status, task.status_message = "cancelled", "cancelled by the client"
        task.note_change()
        task.owner.cancel_wanted = True
        task.wake.set()
        return {} if modern else task.to_json(modern=False)

    async def _list(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams) -> dict[str, Any]:
        """The session's tasks. 2025-11-25 only: the 2026-07-28 extension has no `tasks/list`."""
        _core_tasks_only(ctx, "tasks/list")
        session = session_of(ctx)
        with ledger_threads(self.ledger):
            mine = [await self._current(t) for t in self._tasks.values() if t.session == session]
        return {"tasks": [t.to_json(modern=modern_client(ctx)) for t in mine]}


def _core_tasks_only(ctx: ServerRequestContext[Any, Any], method: str) -> None:
    if modern_client(ctx):
        raise MCPError(code=METHOD_NOT_FOUND, message=f"{method} is not part of the 2026-07-28 tasks extension")


def refuse_unless_runnable(spec: ServerSpec, mcp_facts: dict[str, Any], tool: str) -> None:
    """A 2025-11-25 client asked for a task the upstream cannot run: the spec's answer, before
    anything is recorded or sent."""
    if not upstream_runs_tasks(spec, mcp_facts):
        raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {tool!r} does not support task execution")


def new_client_task_id() -> str:
    return str(uuid.uuid4())


def _is_error(result: dict[str, Any] | None) -> bool:
    return bool(result and result.get("isError"))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
