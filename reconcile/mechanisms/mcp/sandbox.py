"""An MCP tool server built with the official `mcp` SDK (low-level `Server`, streamable HTTP).

Tools:
- `slow_lookup` (read-only, `execution.taskSupport: "optional"`): sleeps, answers. Cancelling it
  costs nothing; as a task it is the read-only task Stop may call cancelled.
- `slow_write` (destructive): sleeps, then records an effect in the ledger. Cancelling the
  caller's scope makes the SDK deliver CancelledError into the tool, whose `finally`
  journals the interruption. With the `ignore_cancel` fault it runs to the end and the
  effect lands anyway, like `@modelcontextprotocol/server-everything` does.
- `read_value` (read-only): what `slow_write` last wrote at a key; the status check that shows
  whether a cancelled write took effect.
- `export_report` (additive, `execution.taskSupport: "optional"`): a plain call, a 2025-11-25
  task, or (to a 2026-07-28 client that declares the tasks extension) always a task; see
  `sandbox_tasks.py` for the task half the SDK does not dispatch.

The task methods are registered as custom request handlers (the SDK's runner dispatches a
method it does not know as a spec method straight to `Server.add_request_handler`), and a
`Server.middleware` answers a task-augmented `tools/call` with `CreateTaskResult` before the
SDK's `tools/call` result validation would reject that shape.

Revisions: it speaks 2026-07-28 and 2025-11-25 (`revisions="both"`, the default), or only one
of them (`configure(revisions="2025-11-25")`, `POST /_control/config`, or the environment variable
`STOPDESK_SANDBOX_MCP_REVISIONS` at start; 2025-11-25 alone behaves like server-everything, which refuses a
2026-07-28 request with HTTP 400); see `sandbox_wire.py`, which also records every message that
arrived (`wire()`), so a test sees how a cancel looked: a notification or a closed stream.

Side channel (not MCP): `GET /_control/effects` (what took effect, and the journal of starts
and interruptions), `GET /_control/tasks`, `GET /_control/wire`, plus the common `/_control/*`
routes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import anyio.abc
import anyio.lowlevel
import mcp_types as types
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from reconcile.mechanisms.mcp.sandbox_tasks import TASKS_EXTENSION, TaskRegistry
from reconcile.mechanisms.mcp.sandbox_wire import BOTH, SPEAKS, WireGate, WireLog
from reconcile.mechanisms.mcp.servers import with_task_capabilities
from stopdrill.sandbox.common import FaultError, SandboxParty

MCP_PATH = "/mcp"
REVISIONS_ENV = "STOPDESK_SANDBOX_MCP_REVISIONS"

IGNORE_CANCEL = "ignore_cancel"  # slow_write keeps running after its call is cancelled
# tasks/cancel does not stop the export: 2025-11-25 marks the task cancelled anyway; 2026-07-28
# leaves it working (eventually consistent) until the export lands and it ends completed.
TASKS_IGNORE_CANCEL = "tasks_ignore_cancel"
EXPORT_FAIL = "export_fail"  # export_report ends with an isError result (task `failed`)
TOOL_CALL_ERROR = "tool_call_error"  # tools/call answers a JSON-RPC error without running anything
TASKS_DECLINE = "tasks_decline"  # 2026-07-28: the server answers an export at once, without a task
TASKS_FORGET = "tasks_forget"  # a task is deleted right after it was created (the spec allows deletion at any time)
# tasks/cancel is acknowledged, then the task is deleted while its export runs on and lands: the
# read-back finds nothing, which proves nothing.
TASKS_FORGET_ON_CANCEL = "tasks_forget_on_cancel"

SLOW_LOOKUP = "slow_lookup"
SLOW_WRITE = "slow_write"
READ_VALUE = "read_value"
EXPORT_REPORT = "export_report"
TASK_TOOLS = frozenset({EXPORT_REPORT, SLOW_LOOKUP})  # the tools that may run as tasks


def _tools() -> list[types.Tool]:
    seconds = {"type": "number", "minimum": 0, "description": "How long the tool works."}
    return [
        types.Tool(
            name=SLOW_LOOKUP,
            description="Look something up slowly. Changes nothing.",
            input_schema={"type": "object", "properties": {"query": {"type": "string"}, "seconds": seconds}},
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
            execution=types.ToolExecution(task_support="optional"),
        ),
        types.Tool(
            name=SLOW_WRITE,
            description="Write a value slowly. The write is destructive and cannot be undone by a cancel.",
            input_schema={
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "string"}, "seconds": seconds},
                "required": ["key"],
            },
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
            ),
        ),
        types.Tool(
            name=READ_VALUE,
            description="Read what slow_write last wrote at a key. Changes nothing.",
            input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        ),
        types.Tool(
            name=EXPORT_REPORT,
            description="Export a report. Long-running; may be run as a task.",
            input_schema={"type": "object", "properties": {"name": {"type": "string"}, "seconds": seconds}},
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
            execution=types.ToolExecution(task_support="optional"),
        ),
    ]


class _TaskServer(Server[Any]):
    """Advertises the 2025-11-25 `tasks` capability, or the 2026-07-28 tasks extension, which the
    base class cannot derive."""

    offers_extension: Callable[[], bool] = staticmethod(lambda: True)

    def get_capabilities(
        self, *args: Any, protocol_version: str | None = None, **kwargs: Any
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        # Tasks left the core spec in 2026-07-28 for an extension.
        return with_task_capabilities(caps, protocol_version, extension=self.offers_extension())


class MCPToolServer(SandboxParty):
    """State (ledger, journal, tasks) and behaviour; `app()` builds a fresh ASGI app.

    Python control: `configure(latency_s=, default_seconds=, poll_interval_ms=,
    default_ttl_ms=, max_ttl_ms=, revisions=, tasks_extension=)`, `set_fault(...)`, `effects()`, `journal()`,
    `tasks()`, `wire()`, `stats()`, `reset()`. Effects and journal survive a restart (they are the outside
    world); tasks do not (they lived in the server process).
    """

    FAULTS: ClassVar[frozenset[str]] = frozenset(
        {
            IGNORE_CANCEL,
            TASKS_IGNORE_CANCEL,
            EXPORT_FAIL,
            TOOL_CALL_ERROR,
            TASKS_FORGET,
            TASKS_FORGET_ON_CANCEL,
            TASKS_DECLINE,
        }
    )
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = (
        "latency_s",
        "default_seconds",
        "poll_interval_ms",
        "default_ttl_ms",
        "max_ttl_ms",
        "revisions",
        "tasks_extension",
    )

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        default_seconds: float = 2.0,
        poll_interval_ms: int = 100,
        default_ttl_ms: int = 300_000,
        max_ttl_ms: int = 3_600_000,
        revisions: str | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s)
        self.default_seconds = default_seconds
        self.poll_interval_ms = poll_interval_ms
        self.default_ttl_ms = default_ttl_ms
        self.max_ttl_ms = max_ttl_ms
        # Unset: STOPDESK_SANDBOX_MCP_REVISIONS, else both (so `make run` can play a 2025-11-25-only server).
        self.revisions = _speaks(revisions or os.environ.get(REVISIONS_ENV) or BOTH)
        # Off: a 2026-07-28 server with no tasks extension (its tasks only in 2025-11-25).
        self.tasks_extension = True
        self.wire_log = WireLog()
        self._effects: list[dict[str, Any]] = []
        self._journal: list[dict[str, Any]] = []
        self.task_registry = TaskRegistry(self.lock)
        self._task_group: anyio.abc.TaskGroup | None = None

    # --- Python control API -----------------------------------------------------------

    def effects(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Changes that took effect in the world, in order."""
        with self.lock:
            return [dict(e) for e in self._effects if tool in (None, e["tool"])]

    def journal(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Every start, finish and interruption of a tool run, in order."""
        with self.lock:
            return [dict(e) for e in self._journal if tool in (None, e["tool"])]

    def tasks(self) -> list[dict[str, Any]]:
        return self.task_registry.snapshot()

    def wire(self, method: str | None = None) -> list[dict[str, Any]]:
        """The JSON-RPC messages that arrived over HTTP, in order (see `sandbox_wire.WireLog`)."""
        return self.wire_log.entries(method)

    def configure(self, **changes: Any) -> dict[str, Any]:
        if "revisions" in changes:
            changes["revisions"] = _speaks(changes["revisions"])
        return super().configure(**changes)

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self._effects.clear()
            self._journal.clear()
        self.task_registry.clear()
        self.wire_log.clear()

    # --- ledger ------------------------------------------------------------------------

    def _note(self, tool: str, call: str, event: str) -> None:
        with self.lock:
            self._journal.append(
                {"seq": len(self._journal) + 1, "tool": tool, "call": call, "event": event, "at": time.time()}
            )

    def _effect(self, tool: str, call: str, effect: str, **detail: Any) -> None:
        with self.lock:
            self._effects.append({"tool": tool, "call": call, "effect": effect, "at": time.time(), **detail})
        self._note(tool, call, "applied")

    def _seconds(self, arguments: Mapping[str, Any]) -> float:
        with self.lock:
            return float(arguments.get("seconds", self.default_seconds))

    # --- tools -------------------------------------------------------------------------

    async def _slow_lookup(self, arguments: Mapping[str, Any]) -> types.CallToolResult:
        query = str(arguments.get("query", ""))
        self._note(SLOW_LOOKUP, query, "started")
        finished = False
        try:
            await anyio.sleep(self._seconds(arguments))
            finished = True
        finally:
            self._note(SLOW_LOOKUP, query, "finished" if finished else "interrupted")
        return _text(f"lookup result for {query!r}")

    async def _slow_write(self, arguments: Mapping[str, Any]) -> types.CallToolResult:
        key = str(arguments["key"])
        value = str(arguments.get("value", ""))
        self._note(SLOW_WRITE, key, "started")
        applied = False
        try:
            # With ignore_cancel the work is shielded: the caller's cancel lands only after
            # the write, as with servers that never look at notifications/cancelled.
            with anyio.CancelScope(shield=self.has_fault(IGNORE_CANCEL, key)):
                await anyio.sleep(self._seconds(arguments))
                self._effect(SLOW_WRITE, key, "written", value=value)
                applied = True
            await anyio.lowlevel.checkpoint()  # a cancel that arrived meanwhile is raised here
        except anyio.get_cancelled_exc_class():
            if applied:
                self._note(SLOW_WRITE, key, "cancelled_after_applying")
            raise  # never swallowed: the SDK's scope must see it
        finally:
            if not applied:
                self._note(SLOW_WRITE, key, "interrupted")
        return _text(f"wrote {key}={value!r}")

    def _read_value(self, arguments: Mapping[str, Any]) -> types.CallToolResult:
        key = str(arguments.get("key", ""))
        written = [e for e in self.effects(SLOW_WRITE) if e["call"] == key]
        return _text(f"{key}={written[-1]['value']}" if written else f"{key}: no value")

    async def _export_report(self, arguments: Mapping[str, Any], call: str) -> dict[str, Any]:
        name = str(arguments.get("name", "report"))
        self._note(EXPORT_REPORT, call, "started")
        finished = False
        try:
            await anyio.sleep(self._seconds(arguments))
            finished = True
        finally:
            if not finished:
                self._note(EXPORT_REPORT, call, "interrupted")
        if self.has_fault(EXPORT_FAIL, call):
            self._note(EXPORT_REPORT, call, "failed")
            return _dump(_text(f"export of {name!r} failed", is_error=True))
        self._effect(EXPORT_REPORT, call, "exported", name=name)
        return _dump(_text(f"report {name!r} exported"))

    # --- MCP handlers ------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tools())

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        arguments = params.arguments or {}
        if params.name == SLOW_LOOKUP:
            return await self._slow_lookup(arguments)
        if params.name == SLOW_WRITE:
            if "key" not in arguments:
                raise MCPError(code=INVALID_PARAMS, message="slow_write needs a 'key'")
            return await self._slow_write(arguments)
        if params.name == READ_VALUE:
            return self._read_value(arguments)
        if params.name == EXPORT_REPORT:
            return await self._export_report(arguments, f"call-{ctx.request_id}")
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")

    async def _middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        await self.arrive(ctx.method, _count_key(ctx.method, params))
        if ctx.method == "tools/call":
            if self.has_fault(TOOL_CALL_ERROR, params.get("name")):
                raise MCPError(code=-32603, message="the sandbox was told to fail this call")
            if params.get("task") is not None:
                return self._start_task(params, _session_of(ctx))
            tasks_wanted = (
                self.tasks_extension
                and _declares_tasks(params)
                and not self.has_fault(TASKS_DECLINE, params.get("name"))
            )
            if _modern(ctx) and tasks_wanted and params.get("name") in TASK_TOOLS:
                # 2026-07-28: the server decides; it makes a task of every call that may be one, for a
                # client that can take one.
                return self._start_task(params, "", extension=True)
        return await call_next(ctx)

    def _start_task(self, params: Mapping[str, Any], session: str, *, extension: bool = False) -> dict[str, Any]:
        """Answer a task-augmented tools/call with CreateTaskResult; the work runs on."""
        name = params.get("name")
        if name not in TASK_TOOLS:
            # The spec's answer for a tool whose taskSupport is (implicitly) forbidden.
            raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {name!r} does not support task execution")
        if self._task_group is None:
            raise MCPError(code=-32603, message="server is not running")
        requested = (params.get("task") or {}).get("ttl") if not extension else None
        with self.lock:
            ttl = min(int(requested), self.max_ttl_ms) if isinstance(requested, int) else self.default_ttl_ms
            poll = self.poll_interval_ms
        record = self.task_registry.create(str(name), session=session, ttl_ms=ttl, poll_interval_ms=poll)
        arguments = dict(params.get("arguments") or {})

        async def work() -> dict[str, Any]:
            if name == SLOW_LOOKUP:
                return _dump(await self._slow_lookup(arguments))
            return await self._export_report(arguments, record.task_id)

        self._task_group.start_soon(self.task_registry.run, record, work)
        answer = {"resultType": "task", **record.to_extension_json()} if extension else {"task": record.to_json()}
        if self.has_fault(TASKS_FORGET, name):
            self.task_registry.close_session(session, only=record.task_id)
        return answer

    async def _tasks_get(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        record = self.task_registry.get(params.task_id, _session_of(ctx))
        return record.to_extension_json() if _modern(ctx) else record.to_json()

    async def _tasks_cancel(
        self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        forget = self.has_fault(TASKS_FORGET_ON_CANCEL, EXPORT_REPORT)
        stop = not (forget or self.has_fault(TASKS_IGNORE_CANCEL, params.task_id))
        session = "" if _modern(ctx) else _session_of(ctx)
        if _modern(ctx):
            answer = self.task_registry.cancel_eventually(params.task_id, stop_work=stop)
        else:
            answer = self.task_registry.cancel(params.task_id, session, stop_work=stop)
        if forget:
            self.task_registry.close_session(session, only=params.task_id, keep_working=lambda _: True)
        return answer

    async def _tasks_result(
        self, ctx: ServerRequestContext[Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        return await self.task_registry.result(params.task_id, _session_of(ctx))

    async def _tasks_list(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams) -> dict[str, Any]:
        return self.task_registry.page(params.cursor, _session_of(ctx))

    # --- app ---------------------------------------------------------------------------

    def build_server(self) -> Server[Any]:
        server = _TaskServer(
            "stopdesk-sandbox-tools",
            version="1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        server.offers_extension = lambda: self.tasks_extension
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._tasks_get)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._tasks_cancel)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._tasks_result)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._tasks_list)
        server.middleware.append(self._middleware)
        return server

    def app(self) -> Starlette:
        """A fresh app per server start: the SDK's session manager can run only once."""
        server = self.build_server()
        mcp_app = server.streamable_http_app(streamable_http_path=MCP_PATH, host="127.0.0.1")
        # Tasks lived in the old process; the ledger is the outside world and stays.
        self.task_registry.clear()

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            # Task work must outlive the tools/call that started it, so it runs in a group
            # owned by the app, cancelled (with the work's `finally` running) on shutdown.
            async with server.session_manager.run(), anyio.create_task_group() as tg:
                self._task_group = tg
                try:
                    yield
                finally:
                    self._task_group = None
                    tg.cancel_scope.cancel()

        return Starlette(
            routes=[
                *self.control_routes(),
                Route("/_control/effects", self._control_effects, methods=["GET"]),
                Route("/_control/tasks", self._control_tasks, methods=["GET"]),
                Route("/_control/wire", self._control_wire, methods=["GET"]),
                Mount("/", app=WireGate(self._ending_sessions(mcp_app), self.wire_log, lambda: self.revisions)),
            ],
            lifespan=lifespan,
        )

    def _ending_sessions(self, mcp_app: Any) -> Any:
        """Clean a session's tasks up when the client deletes the session, as real servers do."""

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await mcp_app(scope, receive, send)
            if scope["type"] == "http" and scope["method"] == "DELETE":
                session = dict(scope["headers"]).get(b"mcp-session-id", b"").decode()
                if session:
                    ignores = lambda task_id: self.has_fault(TASKS_IGNORE_CANCEL, task_id)  # noqa: E731
                    self.task_registry.close_session(session, keep_working=ignores)

        return app

    async def _control_effects(self, request: Request) -> JSONResponse:
        tool = request.query_params.get("tool")
        return JSONResponse({"effects": self.effects(tool), "journal": self.journal(tool)})

    async def _control_tasks(self, request: Request) -> JSONResponse:
        return JSONResponse({"tasks": self.tasks()})

    async def _control_wire(self, request: Request) -> JSONResponse:
        return JSONResponse({"wire": self.wire(request.query_params.get("method"))})


def _speaks(revisions: str) -> str:
    if revisions not in SPEAKS:
        raise FaultError(f"revisions must be one of {list(SPEAKS)}, not {revisions!r}")
    return revisions


def _session_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The Streamable HTTP session a request came in (tasks belong to it)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    return str(headers.get("mcp-session-id", "")) if headers is not None else ""


def _modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declares_tasks(params: Mapping[str, Any]) -> bool:
    """Whether the request's per-request capabilities (2026-07-28 `_meta`) name the tasks extension."""
    meta = params.get("_meta") or {}
    capabilities = meta.get("io.modelcontextprotocol/clientCapabilities") or {}
    return TASKS_EXTENSION in (capabilities.get("extensions") or {})


def _count_key(method: str, params: Mapping[str, Any]) -> str | None:
    if method == "tools/call":
        return str(params.get("name"))
    if method.startswith("tasks/") and "taskId" in params:
        return str(params["taskId"])
    return None


def _text(text: str, *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def _dump(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


# What the sandbox's start-all and the drills' sandbox find through the mechanism folders.
PARTY = MCPToolServer
PARTY_NAME = "mcp"  # its key in `Sandbox.urls` and the name of its server
URL_SUFFIX = MCP_PATH  # what a client's base URL adds to the server's
# (method, path) patterns that are actions, work that must pass the boundary first (the drills
# time them against Stop); reads, lookups and cancels are what Stop itself sends afterwards.
ACTIONS = [("POST", re.compile("^" + re.escape(MCP_PATH) + "/?$"))]
DRILL_OPTIONS: dict[str, float] = {"default_seconds": 2.0, "poll_interval_ms": 50}  # how the drills' sandbox builds it
