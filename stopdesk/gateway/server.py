"""One MCP server per configured upstream, served at `/mcp/<name>` over Streamable HTTP.

The SDK's server side speaks both revisions to clients (2026-07-28, and 2025-11-25 with its
`initialize` handshake and `Mcp-Session-Id`); upstream calls go through `open_client`, in the
revision the upstream offers. `tools/list` is forwarded as it is. Every `tools/call` is first
registered as an item of the caller's task (`sessions.py`), then made by `mcp_call_tool`, which
records the upstream, tool, revision and annotations, passes the boundary before anything is
sent, and cancels the upstream call the way its revision means it when Stop comes. A call Stop
refused or ended is answered with an MCP error saying who stopped it and why; a call the client
cancels is cancelled upstream and recorded (`client_cancel.py`); a call identical to one whose
outcome the client never learned is held while that outcome is unknown, and refused once it is
known to have taken effect (`retry_gate.py`); under readiness `enforce`, tools that are not ready
are left out of `tools/list` and refused (`readiness.py`). Each item records the upstream's
JSON-RPC id of the call once it was sent (`upstream_request_id`, on either transport)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from django.db import transaction
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from reconcile.mechanisms.mcp.agent import mcp_call_tool
from reconcile.mechanisms.mcp.servers import (
    Connection,
    ServerConfigError,
    ServerSpec,
    configured_servers,
)
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.agent.aio import LedgerThreads, in_thread, ledger_threads
from stopdesk.gateway.client_cancel import record_client_cancel
from stopdesk.gateway.readiness import enforced, not_ready_because, ready_tools
from stopdesk.gateway.retry_gate import earlier_blocking, gate_lock, refused_words
from stopdesk.gateway.sessions import (
    ACTOR,
    TASK_HEADER,
    TASK_META_KEY,
    Caller,
    SessionTasks,
    UnknownTask,
    stopped_words,
)
from stopdesk.gateway.upstreams import UpstreamConnections
from stopdesk.models import WorkItem
from stopdesk.protocol.spec import noun_of
from stopdesk.services.errors import LedgerError, TaskStopped, ToolNotReady
from stopdesk.services.items import item_record_detail, item_register
from stopdesk.states import ItemState, Kind

PATH = "/mcp/{name}"
# JSON-RPC server errors of our own: the call was refused or ended by a Stop; the retry gate held it,
# or refused it because the identical earlier call is known to have taken effect.
STOPPED = -32090
HELD = -32091
NOT_READY = -32092  # readiness `enforce` refused the tool
REFUSED = -32093  # the ledger refused the call otherwise (a closed task); nothing was sent
TOOK_EFFECT = -32094  # the retry gate: the identical earlier call is known to have taken effect
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
# Threads (each with its database connection) for the ledger calls of all calls in flight.
LEDGER_THREADS = 8
LISTING = 0  # the upstream connection tools/list is answered on, kept like a task's (no task has id 0)


class UpstreamGateway:
    """The gateway in front of one upstream MCP server."""

    def __init__(
        self, spec: ServerSpec, tasks: SessionTasks, ledger: LedgerThreads, *, poll_s: float, timeout_s: float
    ) -> None:
        self.spec = spec
        self.tasks = tasks
        self.ledger = ledger  # the gateway's ledger calls run on these threads, on kept connections
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.known_tools: dict[str, types.Tool] = {}  # the upstream's tools, as last listed
        self.upstream = UpstreamConnections(spec, timeout_s=timeout_s)

    def build_server(self) -> Server[Any]:
        return Server(
            f"stopdesk-gateway-{self.spec.name}",
            version="1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
        )

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        """For the SDK's `Mcp-Param-*` header check on 2026-07-28 calls: the tool's schema as the
        upstream last listed it. Without this the SDK lists the tools before every call (an upstream
        round trip); a tool not listed yet is left to the upstream, which checks its own headers."""
        tool = self.known_tools.get(name)
        return tool.input_schema if tool is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        with ledger_threads(self.ledger):
            return await self._listing(params)

    async def _listing(self, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        listing = await self._upstream_tools(params.cursor if params else None)
        if not enforced():
            return listing
        ready = await in_thread(ready_tools, upstream=self.spec.name, tools=listing.tools)
        return listing.model_copy(update={"tools": ready})

    async def _upstream_tools(self, cursor: str | None = None) -> types.ListToolsResult:
        # On a connection kept for listings (a stdio server is then one process for every
        # listing, not one started per tools/list), apart from any session's calls.
        async with self.upstream.lend(LISTING) as conn:
            listing = await conn.client.list_tools(cursor=cursor)
        self.known_tools.update({tool.name: tool for tool in listing.tools})
        return listing

    async def _refuse_if_not_ready(self, name: str) -> None:
        """Under readiness `enforce`, before anything is recorded or sent. The tool's annotations
        come from the client's last `tools/list` (asked of the upstream only if it never listed)."""
        if not enforced():
            return
        if name not in self.known_tools:
            await self._upstream_tools()
        tool = self.known_tools.get(name)
        if tool is not None and (reason := await in_thread(not_ready_because, upstream=self.spec.name, tool=tool)):
            raise MCPError(code=NOT_READY, message=reason)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        with ledger_threads(self.ledger):
            return await self._call(ctx, params)

    async def _call(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        arguments = dict(params.arguments or {})
        facts = self._call_facts(ctx, params.name, arguments)
        await self._refuse_if_not_ready(params.name)
        try:
            # One trip to the ledger (one thread, one connection) for the task, the gate and the item.
            task_id, item = await in_thread(self._register, caller=caller_of(ctx, self.spec.name), facts=facts)
        except UnknownTask as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc
        except ToolNotReady as exc:  # the registration's own readiness check
            raise MCPError(code=NOT_READY, message=str(exc)) from exc
        except LedgerError as exc:  # a closed task: nothing was sent
            raise MCPError(code=REFUSED, message=str(exc)) from exc
        if item.state == ItemState.CANCELLED:  # registered after Stop: the upstream is never contacted
            raise await _stopped(task_id)
        return await self._forward(task_id, item.pk, facts, arguments)

    def _register(self, *, caller: Caller, facts: dict[str, Any]) -> tuple[int, WorkItem]:
        task_id = self.tasks.task_for(caller)
        identical = {
            "task_id": task_id,
            "upstream": self.spec.name,
            "tool": facts["tool"],
            "arguments_sha256": facts["arguments_sha256"],
        }
        with transaction.atomic():  # the gate's check and the registration, as one
            if facts["tool"] not in self.spec.idempotent_tools:
                gate_lock(**identical)
                earlier = earlier_blocking(**identical)
                if earlier is not None:
                    code = TOOK_EFFECT if earlier.state == ItemState.COMPLETED else HELD
                    raise MCPError(code=code, message=refused_words(earlier))
            item = item_register(
                task=task_id,
                kind=Kind.REMOTE_TOOL,
                noun=noun_of(f"{self.spec.name}: {facts['tool']}"),
                actor=ACTOR,
                mechanism="mcp",
                detail={"gateway": facts},
            )
        return task_id, item

    async def _forward(self, task_id: int, item_id: int, facts: dict[str, Any], arguments: dict[str, Any]) -> Any:
        """The call upstream, watching for Stop; the client's own cancel ends it too. However it
        ends, the upstream's id of the call (once it was sent) goes on the item with the gateway's
        facts: the connection lent to the call noted it."""
        lent: list[Connection] = []

        @asynccontextmanager
        async def connect() -> AsyncIterator[Connection]:
            async with self.upstream.lend(task_id) as conn:
                lent.append(conn)
                yield conn

        def sent() -> UpstreamId:
            return UpstreamId(item_id, facts, lent[0].sent_ids.get("tools/call") if lent else None)

        try:
            result = await mcp_call_tool(
                item_id=item_id,
                tool=facts["tool"],
                actor=ACTOR,
                server=self.spec,
                arguments=arguments,
                poll_s=self.poll_s,
                timeout_s=self.timeout_s,
                stop_push=True,
                connect=connect,
            )
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # the record is written even as the handler ends
                await in_thread(_client_cancelled, upstream_id=sent())
            raise
        except TaskStopped:
            self.upstream.close_task(task_id)
            raise await _stopped(task_id, sent()) from None
        except Exception as exc:
            await in_thread(sent().record)
            if isinstance(exc, LookupError | ServerConfigError):  # no such tool; arguments its status check needs
                raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc
            raise
        if result is None:  # Stop cancelled it upstream; the item says cancelled or uncertain
            self.upstream.close_task(task_id)
            raise await _stopped(task_id, sent())
        await in_thread(sent().record)
        return result

    def _call_facts(self, ctx: ServerRequestContext[Any], tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """What the gateway knows of the call before it goes anywhere. The upstream's annotations
        (recorded by `mcp_call_tool`) are hints the upstream gives about itself, not promises."""
        return {
            "upstream": self.spec.name,
            "tool": tool,
            "client_request_id": ctx.request_id,
            "client_revision": ctx.protocol_version,
            "arguments_sha256": arguments_hash(arguments),
            # The operator's configuration vouches for the upstream's annotations, or nobody does.
            "annotations_trusted": self.spec.trusted,
        }


@dataclass(frozen=True)
class UpstreamId:
    """The upstream's JSON-RPC id of an item's call (None when it was not sent), to be recorded
    with the gateway's facts of the call."""

    item_id: int
    facts: dict[str, Any]
    request_id: Any

    def record(self) -> None:
        if self.request_id is not None:
            facts = {**self.facts, "upstream_request_id": self.request_id}
            item_record_detail(item_id=self.item_id, detail={"gateway": facts}, actor=ACTOR)


async def _stopped(task_id: int, upstream_id: UpstreamId | None = None) -> MCPError:
    return MCPError(code=STOPPED, message=await in_thread(_record_and_word, task_id=task_id, upstream_id=upstream_id))


def _client_cancelled(*, upstream_id: UpstreamId) -> None:
    # The call's upstream id first, then its end: whoever sees the item settled sees which
    # upstream request it was (the other order left a moment where it had ended without it).
    upstream_id.record()
    record_client_cancel(item_id=upstream_id.item_id)


def _record_and_word(*, task_id: int, upstream_id: UpstreamId | None) -> str:
    if upstream_id is not None:
        upstream_id.record()
    return stopped_words(task_id)


def arguments_hash(arguments: Mapping[str, Any]) -> str:
    """The same arguments hash the same whatever their order: a repeated call is recognisable."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def caller_of(ctx: ServerRequestContext[Any], upstream: str) -> Caller:
    """The client as it named itself: in `initialize` (2025-11-25) or in each request's `_meta`
    (2026-07-28); its session id and the task header from the HTTP request, the task the call
    names in its `_meta`."""
    info: Any = None
    params = ctx.session.client_params
    if params is not None:
        info = params.client_info
    elif isinstance(ctx.meta, Mapping):
        info = ctx.meta.get(CLIENT_INFO_META_KEY)
    name, version = _name_and_version(info)
    headers = getattr(ctx.request, "headers", None) or {}
    meta = ctx.meta if isinstance(ctx.meta, Mapping) else {}
    return Caller(
        client_name=name,
        client_version=version,
        upstream=upstream,
        session_id=headers.get("mcp-session-id"),
        task_header=headers.get(TASK_HEADER),
        task_meta=meta.get(TASK_META_KEY),
    )


def _name_and_version(info: Any) -> tuple[str, str]:
    if isinstance(info, Mapping):
        return str(info.get("name") or ""), str(info.get("version") or "")
    return str(getattr(info, "name", "") or ""), str(getattr(info, "version", "") or "")


def gateway_app(*, host: str = "127.0.0.1", poll_s: float = 5.0, timeout_s: float = 300.0) -> Starlette:
    """One Starlette app: `/mcp/<name>` for every configured MCP server, one session manager each.
    Stop reaches a call through the process's StopHub at once; `poll_s` paces each call's lease
    (and is the longest a Stop waits should the hub's notification be lost)."""
    tasks = SessionTasks()
    ledger = LedgerThreads(LEDGER_THREADS)
    specs = configured_servers(mechanism_settings("mcp").options)
    routes: list[BaseRoute] = []
    managers = []
    upstreams = []
    for name, spec in sorted(specs.items()):
        gateway = UpstreamGateway(spec, tasks, ledger, poll_s=poll_s, timeout_s=timeout_s)
        server = gateway.build_server()
        app = server.streamable_http_app(streamable_http_path=PATH.format(name=name), host=host)
        routes.extend(app.routes)
        managers.append(server.session_manager)
        upstreams.append(gateway.upstream)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            stack.callback(ledger.close)  # last: the calls below may still write as they end
            for upstream in upstreams:
                await stack.enter_async_context(upstream.running())
            for manager in managers:
                await stack.enter_async_context(manager.run())
            yield

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "servers": sorted(specs)})

    return Starlette(routes=[Route("/healthz", healthz, methods=["GET"]), *routes], lifespan=lifespan)
