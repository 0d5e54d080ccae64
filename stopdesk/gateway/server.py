"""The MCP server for one configured upstream (`UpstreamGateway`), which `app.py` serves at
`/mcp/<name>` over Streamable HTTP.

The SDK's server side speaks both revisions to clients (2026-07-28, and 2025-11-25 with its
`initialize` handshake and `Mcp-Session-Id`); upstream calls go through `open_client`, in the
revision the upstream offers. `tools/list` is forwarded as it is. A `tools/call` costs the
ledger two trips: before anything is sent, one statement takes the retry gate and registers
the call as an item of the caller's task (`sessions.py`) with everything known of it (upstream,
tool, revision, annotations from the last listing) and passes the boundary, with the task's Stop
already watched; after the answer, one statement records the result with the upstream's id of
the call, before the client hears it. In between, `call_passed` makes the call and cancels it
the way its revision means it when Stop comes. A call Stop
refused or ended is answered with an MCP error saying who stopped it and why; a call the client
cancels is cancelled upstream and recorded (`client_cancel.py`); a call identical to one whose
outcome the client never learned is held while that outcome is unknown, and refused once it is
known to have taken effect (`retry_gate.py`); under readiness `enforce`, tools that are not ready
are left out of `tools/list` and refused (`readiness.py`). Each item records the upstream's
JSON-RPC id of the call once it was sent (`upstream_request_id`, on either transport). A call the
client asks to run as a task goes the same way to the boundary, then runs as a task upstream,
owned by the agent side (`tasks.py`). A 2026-07-28 client's plain call to an upstream reached in
2026-07-28 over HTTP takes the same steps without the SDK on either side (`fast_calls.py`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import mcp_types as types
from django.db import transaction
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_INFO_META_KEY, INVALID_PARAMS

from reconcile.mechanisms.mcp.agent import ProgressSeen, StopPushed, call_passed, describe, listening
from reconcile.mechanisms.mcp.agent.common import Described, record_failure, unwrap
from reconcile.mechanisms.mcp.servers import (
    HTTP,
    MODERN,
    Connection,
    ServerConfigError,
    ServerSpec,
)
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.agent.aio import LedgerThreads, in_thread, ledger_threads
from stopdesk.gateway.client_cancel import record_client_cancel
from stopdesk.gateway.ledger_pool import LedgerPool
from stopdesk.gateway.readiness import enforced, not_ready_because, ready_tools
from stopdesk.gateway.retry_gate import refused_words, retry_hold
from stopdesk.gateway.sessions import (
    ACTOR,
    TASK_HEADER,
    TASK_META_KEY,
    Caller,
    SessionTasks,
    UnknownTask,
    stopped_words,
)
from stopdesk.gateway.settling import SettleChecks
from stopdesk.gateway.tasks import (
    KEEP_MS,
    ClientTasks,
    TaskServer,
    modern_client,
    new_client_task_id,
    refuse_unless_runnable,
    upstream_runs_tasks,
    wants_task,
)
from stopdesk.gateway.upstreams import KEEPALIVE_S, UpstreamConnections
from stopdesk.models import WorkItem
from stopdesk.protocol.spec import noun_of
from stopdesk.push.hub import stop_hub
from stopdesk.services.errors import Held, LedgerError, TaskClosed, TaskStopped, ToolNotReady
from stopdesk.services.items import (
    NotInOneStatement,
    item_finish,
    item_record_detail,
    item_register_started,
    item_register_started_async,
)
from stopdesk.services.sql import is_postgres
from stopdesk.services.transitions import item_close_running, item_close_running_async
from stopdesk.states import ItemState, Kind

PATH = "/mcp/{name}"
# JSON-RPC server errors of our own: the call was refused or ended by a Stop; the retry gate held it,
# or refused it because the identical earlier call is known to have taken effect.
STOPPED = -32090
HELD = -32091
NOT_READY = -32092  # readiness `enforce` refused the tool
REFUSED = -32093  # the ledger refused the call otherwise (a closed task); nothing was sent
TOOK_EFFECT = -32094  # the retry gate: the identical earlier call is known to have taken effect
# Threads (each with its database connection) for the ledger calls of all calls in flight.
LEDGER_THREADS = 8
LISTING = 0  # the upstream connection tools/list is answered on, kept like a task's (no task has id 0)


class UpstreamGateway:
    """The gateway in front of one upstream MCP server."""

    def __init__(
        self,
        spec: ServerSpec,
        tasks: SessionTasks,
        ledger: LedgerThreads,
        *,
        poll_s: float,
        timeout_s: float,
        settle_checks: SettleChecks,
    ) -> None:
        self.spec = spec
        self.tasks = tasks
        self.ledger = ledger  # the gateway's ledger calls run on these threads, on kept connections
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.known_tools: dict[str, types.Tool] = {}  # the upstream's tools, as last listed
        # The upstream as last described, for a call made when no open connection keeps a
        # listing: a call a stopped session makes after its connections were closed is refused
        # without starting anything upstream. A client's new listing replaces it.
        self.described: Described | None = None
        self.upstream = UpstreamConnections(spec, timeout_s=timeout_s)
        self.server_name = f"stopdesk-gateway-{spec.name}"
        # Calls by the way they went: "forwarded" (`fast_calls.py`) or "sdk"; /healthz shows them.
        self.calls: Counter[str] = Counter()
        self._fast_session: aiohttp.ClientSession | None = None  # `fast_calls.py`'s, made in the loop
        self.settle_checks = settle_checks  # whether a session's task settled, asked once its calls pause
        options = mechanism_settings("mcp").options
        # How long a client's task is kept in this process once it ended.
        keep_ms = round(float(options.get("task_keep_s", KEEP_MS / 1000)) * 1000)
        self.client_tasks = ClientTasks(spec, ledger, stopped_code=STOPPED, keep_ms=keep_ms)
        # How long a call Stop cancelled keeps its connection for the progress the server goes on
        # sending (evidence).
        self.after_cancel_s = float(options.get("after_cancel_s", 2.0))

    def build_server(self) -> Server[Any]:
        server = TaskServer(
            self.server_name,
            version="1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
        )
        self.client_tasks.serve(server)
        server.middleware.append(self._task_call)
        return server

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the gateway's lifetime: the upstream connections and the owners of upstream tasks."""
        try:
            async with self.upstream.running(), self.client_tasks.running():
                yield
        finally:
            await self.settle_checks.flush()
            if self._fast_session is not None:
                await self._fast_session.close()

    async def _task_call(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        # A call that may become a task is answered here, before the SDK's `tools/call` handler,
        # whose result check would refuse a 2025-11-25 CreateTaskResult.
        if ctx.method != "tools/call" or not wants_task(ctx):
            return await call_next(ctx)
        try:
            params = types.CallToolRequestParams.model_validate(ctx.params or {}, by_name=False)
        except ValueError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"invalid tools/call params: {exc}") from exc
        with ledger_threads(self.ledger):
            return await self._call(ctx, params, task_wanted=True)

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
            listing = await self._listing(params)
        return listing if modern_client(ctx) else self.client_tasks.with_task_support(listing)

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
            if cursor is None:
                conn.tools = listing  # what calls are described from (`_describe`), as fresh as the client's
                self.described = Described.of(conn)
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

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, *, task_wanted: bool = False
    ) -> Any:
        self.calls["sdk"] += 1
        arguments = dict(params.arguments or {})
        facts, mcp_facts = await self.call_facts(params.name, arguments, ctx.request_id, ctx.protocol_version)
        as_task = task_wanted and upstream_runs_tasks(self.spec, mcp_facts)
        if task_wanted and not modern_client(ctx):
            refuse_unless_runnable(
                self.spec, mcp_facts, params.name
            )  # asked for with params.task: no plain call instead
        if as_task:
            facts["client_task_id"] = new_client_task_id()
        stopped = asyncio.Event()
        entered = await self.enter(caller_of(ctx, self.spec.name), facts, mcp_facts, stopped)
        if as_task:  # its owner watches the Stop from here on, and unwatches when it ends
            return await self.client_tasks.start(
                ctx, client_task_id=facts["client_task_id"], ledger_task_id=entered.task_id, item_id=entered.item_id,
                tool=params.name, arguments=arguments, stopped=stopped, unwatch=entered.unwatch,
            )  # fmt: skip
        try:
            result = await self._forward(entered, facts, mcp_facts, arguments, StopPushed(stopped, entered.unwatch))
        finally:
            entered.unwatch()
        if task_wanted:  # a 2026-07-28 client that could take a task, for a tool that runs as none
            return {**result.model_dump(by_alias=True, mode="json", exclude_none=True), "resultType": "complete"}
        return result

    async def call_facts(
        self, tool: str, arguments: dict[str, Any], client_request_id: Any, client_revision: str | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What is known of a call before the ledger is asked: the gateway's facts and the MCP facts
        (`_describe`), after readiness `enforce` had its say. Raises MCPError: nothing was recorded."""
        facts = {
            "upstream": self.spec.name,
            "tool": tool,
            "client_request_id": client_request_id,
            "client_revision": client_revision,
            "arguments_sha256": arguments_hash(arguments),
            # The operator's configuration vouches for the upstream's annotations, or nobody does.
            "annotations_trusted": self.spec.trusted,
        }
        await self._refuse_if_not_ready(tool)
        return facts, await self._describe(tool, arguments)

    async def enter(
        self, caller: Caller, facts: dict[str, Any], mcp_facts: dict[str, Any], stopped: asyncio.Event
    ) -> Entered:
        """One trip to the ledger before anything is sent: the session's task, the retry gate, the
        item with everything known of the call, and the boundary; `stopped` is set when the task's
        Stop commits from then on. A refusal raises MCPError (nothing was sent)."""
        loop = asyncio.get_running_loop()
        try:
            return await in_thread(
                self._enter,
                caller=caller,
                facts=facts,
                mcp_facts=mcp_facts,
                on_stop=lambda: loop.call_soon_threadsafe(stopped.set),
            )
        except UnknownTask as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc
        except ToolNotReady as exc:  # the registration's own readiness check
            raise MCPError(code=NOT_READY, message=str(exc)) from exc
        except TaskStopped as exc:  # registered after Stop, and cancelled: the upstream is never contacted
            assert exc.task_id is not None
            raise await stopped_error(exc.task_id) from None
        except LedgerError as exc:  # a closed task: nothing was sent
            raise MCPError(code=REFUSED, message=str(exc)) from exc

    async def forwards(self, tool: str) -> bool:
        """Whether a 2026-07-28 client's call of `tool` may go without the SDK (`fast_calls.py`):
        the upstream, as last described, is reached in 2026-07-28 over HTTP, and lists the tool. An
        upstream never listed yet is listed now, as the SDK path's call would list it."""
        if self.spec.transport != HTTP:
            return False
        if self.described is None or tool not in self.known_tools:
            try:
                await self._upstream_tools()
            except Exception:  # the SDK path makes the same call, and says what went wrong
                return False
        described = self.described
        return (
            described is not None
            and described.revision.get("revision") == MODERN
            and tool in self.known_tools
            and described.knows(tool)
        )

    def fast_session(self) -> aiohttp.ClientSession:
        """The HTTP session the fast path's calls go upstream on (made on first use, in the loop)."""
        if self._fast_session is None:
            # No cap on connections (aiohttp's default is 100): each call in flight holds one for
            # as long as the upstream works on it, and a cap would queue the 101st call unsent. An
            # idle one is let go before the upstream's keep-alive could close it under a call
            # (aiohttp keeps one 15 s; `upstreams.KEEPALIVE_S`).
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._fast_session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        return self._fast_session

    async def _describe(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's MCP facts (revision, transport, annotations, status check), known before the
        ledger is asked: from the tool list an open connection keeps, or as last described
        (nothing sent), else listed on the connection kept for listings, which the call then uses if its session has none
        (`lend(or_from=)`). A call the boundary refuses sends no `tools/call` upstream."""
        try:
            for kept in self.upstream.listed():
                if Described.of(kept).knows(tool):
                    facts = await describe(kept, tool, arguments)  # from its kept listing: nothing is sent
                    self.described = Described.of(kept)
                    return facts
            if self.described is not None and self.described.knows(tool):
                return self.described.facts(tool, arguments)  # as last seen on a connection closed since
            async with self.upstream.lend(LISTING) as conn:
                facts = await describe(conn, tool, arguments)
                self.described = Described.of(conn)
                return facts
        except (LookupError, ServerConfigError) as exc:  # no such tool, or arguments its status check
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc  # needs: nothing is recorded or sent

    def _enter(
        self, *, caller: Caller, facts: dict[str, Any], mcp_facts: dict[str, Any], on_stop: Callable[[], Any]
    ) -> Entered:
        """The task's Stop watched first, then the gate and the registration with its boundary, as
        one statement: a Stop that commits after the boundary is pushed to the watch, and one
        before it refuses the call. A session's task, kept in memory, may have been closed since
        it was read: then its next task is read and the call registered there."""
        for attempt in (1, 2):
            task_id = self.tasks.task_for(caller)
            unwatch = stop_hub().watch(task_id, lambda _task, _at: on_stop())
            try:
                item_id = self._register_passed(task_id, facts, mcp_facts)
                if item_id is None:  # a task the caller named that is not there
                    raise self.tasks.unknown(caller)
                return Entered(task_id, item_id, unwatch)
            except TaskClosed:
                unwatch()
                if attempt == 2 or not self.tasks.forget(caller):
                    raise
            except BaseException:
                unwatch()
                raise
        raise AssertionError("unreachable")

    def _register_passed(self, task_id: int, facts: dict[str, Any], mcp_facts: dict[str, Any]) -> int | None:
        """The retry gate and the registration with its boundary: one statement on PostgreSQL (the
        gate is the registration's hold), one transaction elsewhere. A held call raises MCPError."""
        try:
            return item_register_started(**self._registration(task_id, facts, mcp_facts))
        except Held as held:
            raise held_error(held) from None

    async def enter_on(
        self, pool: LedgerPool, caller: Caller, facts: dict[str, Any], mcp_facts: dict[str, Any], stopped: asyncio.Event
    ) -> Entered:
        """`enter`, with the registration's one statement on the loop's own connection (`pool`), so
        the call waits for no thread on its way upstream: for a session whose task is known here.
        Anything else (a task to read or create, a task found closed, a stopped task's refusal to
        record, a registration that is more than its statement) goes through `enter`."""
        task_id = self.tasks.known(caller)
        if task_id is None or not pool.usable:
            return await self.enter(caller, facts, mcp_facts, stopped)
        loop = asyncio.get_running_loop()

        def on_stop(_task: int, _at: Any) -> None:
            loop.call_soon_threadsafe(stopped.set)

        unwatch = stop_hub().watch(task_id, on_stop)
        try:
            async with pool.connection() as conn:
                item_id = await item_register_started_async(conn, **self._registration(task_id, facts, mcp_facts))
        except (NotInOneStatement, TaskClosed):
            unwatch()  # nothing was written: the threads' path records or reads what this one cannot
            return await self.enter(caller, facts, mcp_facts, stopped)
        except Held as held:
            unwatch()
            raise await in_thread(held_error, held=held) from None
        except LedgerError as exc:
            unwatch()
            raise MCPError(code=REFUSED, message=str(exc)) from exc
        except BaseException:
            unwatch()
            raise
        if item_id is None:  # a task the caller named that is not there
            unwatch()
            raise MCPError(code=INVALID_PARAMS, message=str(self.tasks.unknown(caller)))
        return Entered(task_id, item_id, unwatch)

    def _registration(self, task_id: int, facts: dict[str, Any], mcp_facts: dict[str, Any]) -> dict[str, Any]:
        """The registration's arguments: the item with everything known of the call, and the retry
        gate as its hold (unless the tool is declared idempotent)."""
        read_only = bool(mcp_facts["annotations"]["readOnlyHint"])
        hold = None
        if facts["tool"] not in self.spec.idempotent_tools:
            hold = retry_hold(
                task_id=task_id, upstream=self.spec.name, tool=facts["tool"], arguments_sha256=facts["arguments_sha256"]
            )
        return {
            "task_id": task_id,
            "actor": ACTOR,
            "worker": "mcp",
            # A call that may change the world is an external action: submitted, with a key.
            "submit_key": "" if read_only else f"mcp-gateway-{uuid.uuid4().hex}",
            "kind": Kind.REMOTE_TOOL,
            "noun": noun_of(f"{self.spec.name}: {facts['tool']}"),
            "mechanism": "mcp",
            "detail": {"gateway": facts, "mcp": mcp_facts},
            "hold": hold,
        }

    async def _forward(
        self,
        entered: Entered,
        facts: dict[str, Any],
        mcp_facts: dict[str, Any],
        arguments: dict[str, Any],
        stop_seen: StopPushed,
    ) -> Any:
        """The call upstream on one of the session's connections, watching for Stop; the client's
        own cancel ends it too. However it ends, the upstream's id of the call (once it was sent)
        goes on the item with the gateway's facts."""
        task_id, item_id = entered.task_id, entered.item_id
        tool = facts["tool"]
        progress = ProgressSeen(token=f"stopdesk-item-{item_id}")
        lent: list[Connection] = []

        def sent() -> UpstreamId:
            return UpstreamId(item_id, facts, lent[0].sent_ids.get("tools/call") if lent else None)

        try:
            async with self.upstream.lend(task_id, or_from=LISTING) as conn, listening(conn, progress.handle):
                lent.append(conn)
                result = await call_passed(
                    conn, item_id=item_id, actor=ACTOR, tool=tool, arguments=arguments, facts=mcp_facts,
                    poll_s=self.poll_s, linger_s=self.after_cancel_s, progress=progress, stop_seen=stop_seen,
                )  # fmt: skip
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # the record is written even as the handler ends
                await in_thread(client_cancelled, upstream_id=sent())
            raise
        except Exception as exc:
            await record_failure(item_id, ACTOR, exc, mcp_facts)
            await in_thread(sent().record)
            error = unwrap(exc)
            if isinstance(error, LookupError | ServerConfigError):  # arguments its status check needs
                raise MCPError(code=INVALID_PARAMS, message=str(error)) from exc
            raise error from exc
        if result is None:  # Stop cancelled it upstream; the item says cancelled or uncertain
            self.upstream.close_task(task_id)
            raise await stopped_error(task_id, sent())
        # The ledger has the answer before the client does; whether the task settled is asked
        # once the session's calls are quiet (`settling.py`).
        outcome = outcome_text([c.model_dump(by_alias=True) for c in result.content])
        await in_thread(Answer(sent(), succeeded=not result.is_error, outcome=outcome, settle=False).record)
        self.settle_checks.after_answer(task_id)
        return result


@dataclass(frozen=True)
class Entered:
    """A call registered and through the boundary, with its task's Stop watched."""

    task_id: int
    item_id: int
    unwatch: Callable[[], None]


@dataclass(frozen=True)
class Answer:
    """The upstream's answer to record: the item's result, in one transaction with the call's
    upstream id."""

    upstream_id: UpstreamId
    succeeded: bool
    outcome: str
    settle: bool = True  # False: the caller checks whether the task settled (`task_settle_check`)

    def record(self) -> None:
        item_id, facts = self.upstream_id.item_id, self.upstream_id.with_id()
        # A running item's result and the call's upstream id in one statement; otherwise (SQLite,
        # or an item a Stop settled meanwhile: a late result, or the same one) the general path.
        if is_postgres() and item_close_running(
            item_id=item_id,
            succeeded=self.succeeded,
            actor=ACTOR,
            outcome=self.outcome,
            detail=facts,
            settle=self.settle,
        ):
            return
        self._record_not_running()

    def _record_not_running(self) -> None:
        """The general path: for an item no longer running, it knows late results."""
        with transaction.atomic():
            self.upstream_id.record()
            item_finish(item_id=self.upstream_id.item_id, succeeded=self.succeeded, actor=ACTOR, outcome=self.outcome)

    async def record_on(self, pool: LedgerPool) -> None:
        """`record` with `settle=False`, its one statement on the loop's own connection (`pool`);
        the general path through a ledger thread where that statement wrote nothing (see `record`)."""
        assert not self.settle
        if not pool.usable:
            await in_thread(self.record)
            return
        async with pool.connection() as conn:
            if await item_close_running_async(
                conn,
                item_id=self.upstream_id.item_id,
                succeeded=self.succeeded,
                actor=ACTOR,
                outcome=self.outcome,
                detail=self.upstream_id.with_id(),
            ):
                return
        await in_thread(self._record_not_running)


def held_error(held: Held) -> MCPError:
    """What a client is told of a call the retry gate held: the earlier call, as read now."""
    earlier = WorkItem.objects.get(pk=held.item_id)
    code = TOOK_EFFECT if earlier.state == ItemState.COMPLETED else HELD
    return MCPError(code=code, message=refused_words(earlier))


def outcome_text(content: Any) -> str:
    """What a result's content says, as the item's outcome."""
    parts = content if isinstance(content, list) else []
    text = " ".join(str(c.get("text") or "") for c in parts if isinstance(c, dict))[:200]
    return text or "done"


@dataclass(frozen=True)
class UpstreamId:
    """The upstream's JSON-RPC id of an item's call (None when it was not sent), to be recorded
    with the gateway's facts of the call."""

    item_id: int
    facts: dict[str, Any]
    request_id: Any

    def with_id(self) -> dict[str, Any] | None:
        """The item's `gateway` detail with the upstream id; None when nothing was sent."""
        if self.request_id is None:
            return None
        return {"gateway": {**self.facts, "upstream_request_id": self.request_id}}

    def record(self) -> None:
        if (detail := self.with_id()) is not None:
            item_record_detail(item_id=self.item_id, detail=detail, actor=ACTOR)


async def stopped_error(task_id: int, upstream_id: UpstreamId | None = None) -> MCPError:
    return MCPError(code=STOPPED, message=await in_thread(_record_and_word, task_id=task_id, upstream_id=upstream_id))


def client_cancelled(*, upstream_id: UpstreamId) -> None:
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
    headers = getattr(ctx.request, "headers", None) or {}
    return caller_from(info, headers, ctx.meta if isinstance(ctx.meta, Mapping) else {}, upstream)


def caller_from(info: Any, headers: Mapping[str, str], meta: Mapping[str, Any], upstream: str) -> Caller:
    """The caller of a request: the client's `clientInfo` (a model or its JSON), the HTTP
    request's headers and the call's `_meta`."""
    name, version = _name_and_version(info)
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
