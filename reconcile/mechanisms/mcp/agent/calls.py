"""Plain MCP tool calls: pass the boundary, call while watching the ledger, cancel on Stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types as types

from reconcile.mechanisms.mcp import servers as mcp_servers
from reconcile.mechanisms.mcp.agent.common import (
    ServerRef,
    describe,
    look_later,
    pass_boundary,
    record_and_pass,
    record_failure,
    unwrap,
)
from reconcile.mechanisms.mcp.servers import Connection
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.agent.aio import in_thread
from stopdesk.push.hub import stop_hub
from stopdesk.services.errors import IllegalTransition, TaskStopped
from stopdesk.services.items import item_finish, item_heartbeat, item_note_evidence, item_task_id
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState

log = logging.getLogger(__name__)


@dataclass
class ProgressSeen:
    """`notifications/progress` for our token, split at the cancel."""

    token: str
    cancelled_at: float | None = None
    before: int = 0
    after: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, message: Any) -> None:
        root = getattr(message, "root", message)
        if isinstance(root, types.ProgressNotification):
            params = root.params
            self.heard(params.progress_token, params.progress, params.total, params.message)

    def heard(self, token: Any, progress: Any, total: Any = None, message: Any = None) -> None:
        """One progress notification, as its parameters."""
        if str(token) != self.token:
            return
        if self.cancelled_at is None:
            self.before += 1
            return
        self.after.append(
            {
                "progress": progress,
                "total": total,
                "message": message,
                "after_cancel_s": round(time.monotonic() - self.cancelled_at, 3),
            }
        )


async def mcp_call_tool(
    *,
    item_id: int,
    tool: str,
    actor: str,
    server: ServerRef | None = None,
    url: str | None = None,
    arguments: dict[str, Any] | None = None,
    poll_s: float = 0.5,
    timeout_s: float = 300.0,
    after_cancel_s: float | None = None,
    stop_push: bool = False,
    connect: Callable[[], AbstractAsyncContextManager[Connection]] | None = None,
) -> types.CallToolResult | None:
    """Record server, tool, protocol version and annotations; pass the boundary; call the tool
    while watching the ledger; cancel the call on Stop. Returns the result, or None when the call
    was cancelled (the item is then recorded cancelled or uncertain). `server` is a configured
    server's name, a URL, or `StdioServerParameters`; `url` is the older spelling of a URL.
    With `stop_push` the process's StopHub wakes the watch the moment the task's Stop commits
    (a long-lived process holding many calls, the gateway); `poll_s` then only paces the lease.
    `connect` lends a connection kept across calls (the gateway's, one call at a time on it);
    by default the call opens its own and closes it after."""

    ref = server if server is not None else url
    if ref is None:
        raise TypeError("mcp_call_tool needs a server (a configured name, a URL or StdioServerParameters)")
    arguments = arguments or {}
    facts: dict[str, Any] | None = None
    refused: TaskStopped | None = None
    result: types.CallToolResult | None = None
    try:
        spec = mcp_servers.resolve(ref, mechanism_settings("mcp").options)
        progress = ProgressSeen(token=f"stopdesk-item-{item_id}")
        linger = _after_cancel_s() if after_cancel_s is None else after_cancel_s
        opened = connect() if connect is not None else mcp_servers.open_client(spec, timeout_s=timeout_s)
        async with opened as conn, listening(conn, progress.handle):
            facts = await describe(conn, tool, arguments)
            stop_seen: StopPushed | None = None
            try:
                if stop_push:
                    stop_seen = await _pass_boundary_watching(item_id, actor, facts)
                else:
                    await pass_boundary(item_id, actor, facts)
            except TaskStopped as exc:  # raised after the session closes, not wrapped in its task group
                refused = exc
            if refused is None:
                try:
                    result = await call_passed(
                        conn, item_id=item_id, actor=actor, tool=tool, arguments=arguments, facts=facts,
                        poll_s=poll_s, linger_s=linger, progress=progress, stop_seen=stop_seen,
                    )  # fmt: skip
                finally:
                    if stop_seen is not None:
                        stop_seen.unwatch()
    except Exception as exc:
        await record_failure(item_id, actor, exc, facts)
        raise unwrap(exc) from exc
    if refused is not None:
        raise refused
    if result is not None:
        await _record_result(item_id, actor, result)
    return result


async def call_passed(
    conn: Connection,
    *,
    item_id: int,
    actor: str,
    tool: str,
    arguments: dict[str, Any],
    facts: dict[str, Any],
    poll_s: float,
    linger_s: float,
    progress: ProgressSeen,
    stop_seen: StopPushed | None = None,
) -> types.CallToolResult | None:
    """The call of an item that has passed the boundary, watching the ledger (and the pushed Stop);
    Stop cancels it the way its revision means it. Returns the result (for the caller to record),
    or None when Stop cancelled it: the item is then recorded cancelled or uncertain, and the
    session is kept `linger_s` for progress the server keeps sending (evidence), so a stdio server
    is not killed in the middle of what it may still be doing."""
    result = await _call_watching(conn, item_id, tool, arguments, poll_s, progress, stop_seen)
    if result is None:
        await record_cancelled(item_id, actor, facts, conn.sent_ids.get("tools/call"))
        await anyio.sleep(linger_s)
        await _record_progress(item_id, progress)
    return result


@asynccontextmanager
async def listening(conn: Connection, listener: Callable[..., Any]) -> AsyncIterator[None]:
    conn.listeners.add(listener)
    try:
        yield
    finally:
        conn.listeners.discard(listener)


def _after_cancel_s() -> float:

    return float(mechanism_settings("mcp").options.get("after_cancel_s", 2.0))


@dataclass
class StopPushed:
    """Set from the StopHub's thread when the task's Stop commits."""

    event: asyncio.Event
    unwatch: Callable[[], None]


async def _pass_boundary_watching(item_id: int, actor: str, facts: dict[str, Any]) -> StopPushed:
    """The boundary, then the task's Stop watched, in one trip to the ledger."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    unwatch = await in_thread(
        _pass_and_watch,
        item_id=item_id,
        actor=actor,
        facts=facts,
        callback=lambda: loop.call_soon_threadsafe(event.set),
    )
    return StopPushed(event=event, unwatch=unwatch)


def _pass_and_watch(
    *, item_id: int, actor: str, facts: dict[str, Any], callback: Callable[[], Any]
) -> Callable[[], None]:
    record_and_pass(item_id=item_id, actor=actor, facts=facts)
    # Watched, then read once: a Stop that committed since the boundary was passed is seen too.
    return stop_hub().watch_checked(item_task_id(item_id=item_id), lambda _task, _at: callback())


async def _call_watching(
    conn: Connection,
    item_id: int,
    tool: str,
    arguments: dict[str, Any],
    poll_s: float,
    progress: ProgressSeen,
    stop_seen: StopPushed | None = None,
) -> types.CallToolResult | None:

    result: list[types.CallToolResult] = []

    async def call(scope: anyio.CancelScope) -> None:
        # `_meta.stopdesk_item` ties the call to its item at the server; our own progress token
        # lets us see progress the server keeps sending after the cancel.
        meta = {"stopdesk_item": str(item_id), "progressToken": progress.token}
        result.append(await conn.client.call_tool(tool, arguments, meta=cast(types.RequestParamsMeta, meta)))
        scope.cancel()

    async def watch(scope: anyio.CancelScope) -> None:
        while True:
            if stop_seen is None:
                await anyio.sleep(poll_s)
            else:
                with anyio.move_on_after(poll_s):
                    await stop_seen.event.wait()
            if await in_thread(item_heartbeat, item_id=item_id):
                progress.cancelled_at = time.monotonic()
                scope.cancel()  # the SDK cancels the way the revision means it (see cancel_wire)
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    return result[0] if result else None


async def _record_result(item_id: int, actor: str, result: types.CallToolResult) -> None:

    text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
    await in_thread(item_finish, item_id=item_id, succeeded=not result.is_error, actor=actor, outcome=text or "done")


async def record_cancelled(item_id: int, actor: str, facts: dict[str, Any], request_id: Any) -> None:
    """A call Stop cancelled: cancelled if its tool is read-only, else uncertain with a deadline
    (settled by its status check where one is declared)."""

    read_only = facts["annotations"]["readOnlyHint"]
    wire = str(facts.get("cancel_wire") or mcp_servers.NOTIFICATION)
    evidence: dict[str, Any] = {
        "annotations": facts["annotations"],
        "cancel": {"revision": facts.get("revision"), "transport": facts.get("transport"), "sent": wire},
    }
    if request_id is not None:  # the server's id of the call (Streamable HTTP), which its cancel names
        evidence["cancel"]["request_id"] = request_id
    if read_only:
        to_state, outcome, extra = ItemState.CANCELLED, "cancelled; read-only tool", {}
    else:
        check = facts.get("status_check")
        evidence["uncertain_because"] = (
            _cancelled_how(wire)
            + "; no answer follows a cancelled call, and the tool is not read-only, "
            + (
                f"so the status check ({check['tool']}) will look whether it took effect."
                if check
                else "and no status check is declared for it, so whether it took effect is unknown."
            )
        )
        to_state, outcome, extra = ItemState.UNCERTAIN, "cancelled call; no answer follows", look_later(facts)
    try:
        await in_thread(
            item_transition,
            item_id=item_id,
            to_state=to_state,
            actor=actor,
            outcome=outcome,
            evidence=evidence,
            allowed_from=frozenset({ItemState.RUNNING}),
            **extra,
        )
    except IllegalTransition:
        log.info("item %s was settled before its caller recorded the cancel", item_id)


def _cancelled_how(wire: str) -> str:
    if wire == mcp_servers.STREAM_CLOSED:
        # 2026-07-28 over HTTP: the server cannot tell a Stop from a dropped connection.
        return (
            "The call was cancelled by closing its response stream (to the server that looks like a dropped connection)"
        )
    return f"The call was cancelled ({wire})"


async def _record_progress(item_id: int, progress: ProgressSeen) -> None:

    if not progress.after:
        return
    last = progress.after[-1]
    await in_thread(
        item_note_evidence,
        item_id=item_id,
        evidence={
            "progress_after_cancel": {
                "note": "the server kept reporting progress after the cancel",
                "count": len(progress.after),
                "before_cancel": progress.before,
                "last": last,
            }
        },
        actor="agent:mcp",
        message=f"The server kept reporting progress after the cancel ({len(progress.after)} notifications).",
    )
