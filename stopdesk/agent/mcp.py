"""The agent's side of MCP: calls and tasks that pass the boundary, watch the ledger for Stop, and
record how they ended.

`mcp_call_tool` makes a plain call over Streamable HTTP or stdio. On Stop it cancels the call's
scope (the SDK sends `notifications/cancelled`); no answer follows, so a read-only tool ends
`cancelled` and any other tool `uncertain` (with a status check declared, the reconciler then
looks). It keeps the session open for `after_cancel_s` after a cancel: a stdio server is not
killed in the middle of the work it may still be doing, and progress the server keeps reporting
is recorded as evidence. Any failure after registration is recorded on the item with its error.

`mcp_run_task` / `mcp_start_task` make a task-augmented call and own the session that created the
task until the task is final or Stop has been reconciled: servers keep tasks per session, so the
cancel (`tasks/cancel`) and the read-back (`tasks/get`) go through that session. The owner is the
agent process; it holds the item's lease while it lives. If it dies, the reconciler resumes the
session by its id where the server still has it, or records the task uncertain because its
session's owner stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types as types
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms import mcp_servers
from reconcile.mechanisms.base import Observation, Seen
from reconcile.mechanisms.mcp import INVALID_PARAMS, NOT_FOUND_AT_ONCE, annotations_of, task_observation
from reconcile.mechanisms.mcp_servers import Connection, ServerSpec
from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.handles import item_add_evidence, item_record_detail, item_record_handle, item_state_of
from reconcile.services.reconcile import item_observe
from stopdesk.agent.aio import in_thread
from stopdesk.services.errors import IllegalTransition, TaskStopped
from stopdesk.services.items import item_finish, item_heartbeat
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState

log = logging.getLogger(__name__)
ServerRef = str | StdioServerParameters | ServerSpec
# A task the server forgets within this long of creating it was "not found right after creation".
NOT_FOUND_AT_ONCE_S = 5.0


def _owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def describe(conn: Connection, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The facts recorded on the item before the call: the server (never its secrets), the tool,
    the protocol version, the tool's annotations, and its status check with arguments filled in."""
    client = conn.client
    listing = await client.list_tools()
    found = next((t for t in listing.tools if t.name == tool), None)
    if found is None:
        raise LookupError(f"MCP server {conn.spec.name} has no tool {tool!r}")
    caps = client.server_capabilities
    facts: dict[str, Any] = {
        **conn.spec.public(),
        "server_name": client.server_info.name if client.server_info else "",
        "tool": tool,
        "protocol_version": client.protocol_version,
        "annotations": annotations_of(found),
        "task_support": (found.execution.task_support if found.execution else None) or "forbidden",
        "server_tasks": bool(getattr(caps, "tasks", None)),
    }
    check = conn.spec.status_checks.get(tool)
    if check is not None:
        facts["status_check"] = check.resolved(arguments)
    return facts


async def _pass_boundary(item_id: int, actor: str, facts: dict[str, Any]) -> None:

    await in_thread(item_record_detail, item_id=item_id, detail={"mcp": facts})
    if facts["annotations"]["readOnlyHint"]:
        await in_thread(item_start, item_id=item_id, actor=actor, worker="mcp")
    else:
        # A call that may change the world is an external action: submitted_at marks it.
        await in_thread(item_submit, item_id=item_id, idempotency_key=f"mcp-item-{item_id}", actor=actor, worker="mcp")


async def _record_failure(item_id: int, actor: str, exc: BaseException, facts: dict[str, Any] | None) -> None:
    """Whatever broke between registration and the answer, the item says so: a queued item that
    never reached the server failed; a call that was sent and got no answer is unknown unless the
    tool is read-only."""

    error = _error_text(exc)
    item = await in_thread(item_state_of, item_id=item_id)
    try:
        if item == ItemState.QUEUED:
            await in_thread(
                item_transition,
                item_id=item_id,
                to_state=ItemState.FAILED,
                actor=actor,
                outcome=f"not sent: {error}"[:200],
                evidence={"error": error, "stage": "before the call"},
            )
            return
        if item != ItemState.RUNNING:
            return
        read_only = bool(facts and facts["annotations"]["readOnlyHint"])
        answered = isinstance(exc, MCPError) and exc.error.code not in _NO_ANSWER_CODES
        if read_only or answered:
            await in_thread(
                item_transition,
                item_id=item_id,
                to_state=ItemState.FAILED,
                actor=actor,
                outcome=f"failed: {error}"[:200],
                evidence={"error": error, "stage": "the call", "answered": answered},
            )
            return
        check = (facts or {}).get("status_check")
        why = f"The call was sent and no answer came ({error}); the tool is not read-only, " + (
            f"so the status check ({check['tool']}) will look whether it took effect."
            if check
            else "so whether it took effect is unknown."
        )
        await in_thread(
            item_transition,
            item_id=item_id,
            to_state=ItemState.UNCERTAIN,
            actor=actor,
            outcome="no answer; outcome unknown",
            evidence={"error": error, "stage": "the call", "uncertain_because": why},
            **_look_later(facts),
        )
    except IllegalTransition:
        log.info("item %s was settled meanwhile; the error was %s", item_id, error)


# Codes the SDK raises itself when no answer came (connection closed, request timeout).
_NO_ANSWER_CODES = frozenset({-32000, -32001})


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_error_text(e) for e in exc.exceptions)[:500]
    if isinstance(exc, MCPError):
        return f"MCP error {exc.error.code}: {exc.error.message}"[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


def _look_later(facts: dict[str, Any] | None) -> dict[str, Any]:
    """With a status check declared, the reconciler looks at once (and again until its deadline)."""
    from django.utils import timezone

    return {"next_check_at": timezone.now()} if facts and facts.get("status_check") else {}


@dataclass
class ProgressSeen:
    """`notifications/progress` for our token, split at the cancel."""

    token: str
    cancelled_at: float | None = None
    before: int = 0
    after: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, message: Any) -> None:
        root = getattr(message, "root", message)
        if not isinstance(root, types.ProgressNotification):
            return
        params = root.params
        if str(params.progress_token) != self.token:
            return
        if self.cancelled_at is None:
            self.before += 1
            return
        self.after.append(
            {
                "progress": params.progress,
                "total": params.total,
                "message": params.message,
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
) -> types.CallToolResult | None:
    """Record server, tool, protocol version and annotations; pass the boundary; call the tool
    while watching the ledger; cancel the call on Stop. Returns the result, or None when the call
    was cancelled (the item is then recorded cancelled or uncertain). `server` is a configured
    server's name, a URL, or `StdioServerParameters`; `url` is the older spelling of a URL."""

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
        async with mcp_servers.open_client(spec, timeout_s=timeout_s, message_handler=progress.handle) as conn:
            facts = await describe(conn, tool, arguments)
            try:
                await _pass_boundary(item_id, actor, facts)
            except TaskStopped as exc:  # raised after the session closes, not wrapped in its task group
                refused = exc
            if refused is None:
                result = await _call_watching(conn, item_id, tool, arguments, poll_s, progress)
                if result is None:
                    await _record_cancelled(item_id, actor, facts)
                    # Keep the session: progress after the cancel is evidence, and a stdio server
                    # is not killed in the middle of what it may still be doing.
                    await anyio.sleep(linger)
                    await _record_progress(item_id, progress)
    except Exception as exc:
        await _record_failure(item_id, actor, exc, facts)
        raise _unwrap(exc) from exc
    if refused is not None:
        raise refused
    if result is not None:
        await _record_result(item_id, actor, result)
    return result


def _unwrap(exc: Exception) -> Exception:
    """The transports' task groups wrap what a call raised; the caller gets the error itself."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _after_cancel_s() -> float:

    return float(mechanism_settings("mcp").options.get("after_cancel_s", 2.0))


async def _call_watching(
    conn: Connection, item_id: int, tool: str, arguments: dict[str, Any], poll_s: float, progress: ProgressSeen
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
            await anyio.sleep(poll_s)
            if await in_thread(item_heartbeat, item_id=item_id):
                progress.cancelled_at = time.monotonic()
                scope.cancel()  # the SDK sends notifications/cancelled for the call
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    return result[0] if result else None


async def _record_result(item_id: int, actor: str, result: types.CallToolResult) -> None:

    text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
    await in_thread(item_finish, item_id=item_id, succeeded=not result.is_error, actor=actor, outcome=text or "done")


async def _record_cancelled(item_id: int, actor: str, facts: dict[str, Any]) -> None:

    read_only = facts["annotations"]["readOnlyHint"]
    evidence: dict[str, Any] = {
        "annotations": facts["annotations"],
        "notification": "notifications/cancelled sent by the SDK",
    }
    if read_only:
        to_state, outcome, extra = ItemState.CANCELLED, "cancelled; read-only tool", {}
    else:
        check = facts.get("status_check")
        evidence["uncertain_because"] = (
            "The call was cancelled and MCP sends no answer to a cancelled call; the tool is not read-only, "
            + (
                f"so the status check ({check['tool']}) will look whether it took effect."
                if check
                else "and no status check is declared for it, so whether it took effect is unknown."
            )
        )
        to_state, outcome, extra = ItemState.UNCERTAIN, "cancelled call; no answer follows", _look_later(facts)
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


async def _record_progress(item_id: int, progress: ProgressSeen) -> None:

    if not progress.after:
        return
    last = progress.after[-1]
    await in_thread(
        item_add_evidence,
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


# --- tasks ---------------------------------------------------------------------------------


async def _raw_request(conn: Connection, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    # The SDK types task messages but validates every tools/call answer as a CallToolResult,
    # which would reject a CreateTaskResult: send through the session's dispatcher.
    session = conn.client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {"timeout": timeout_s}
    session._stamp(data, opts)  # type: ignore[arg-type]  # the negotiated version's headers
    return await session._dispatcher.send_raw_request(method, data.get("params"), opts)  # type: ignore[arg-type]


@dataclass
class TaskOwner:
    """The agent-side owner of one task's session (a thread running `mcp_run_task`)."""

    item_id: int
    thread: threading.Thread | None = None
    started: threading.Event = field(default_factory=threading.Event)
    task_id: str = ""
    error: BaseException | None = None
    final: Observation | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # the item's recorded MCP facts

    def join(self, timeout: float | None = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True


_OWNERS: dict[int, TaskOwner] = {}


def task_owner(item_id: int) -> TaskOwner | None:
    """The owner thread this process started for an item's task, if any."""
    return _OWNERS.get(item_id)


async def mcp_run_task(
    *,
    item_id: int,
    tool: str,
    actor: str,
    server: ServerRef | None = None,
    url: str | None = None,
    arguments: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
    poll_s: float = 0.5,
    owner: TaskOwner | None = None,
) -> Observation:
    """Start a task-augmented call and own its session until the task is final or Stop has been
    reconciled through it. Returns the last observation recorded. Raises TaskStopped if Stop
    came first."""

    owner = owner or TaskOwner(item_id)
    ref = server if server is not None else url
    if ref is None:
        raise TypeError("mcp_run_task needs a server (a configured name, a URL or StdioServerParameters)")
    timeout_s = mechanism_settings("mcp").call_timeout_s
    facts: dict[str, Any] | None = None
    refused: TaskStopped | None = None
    final: Observation | None = None
    try:
        spec = mcp_servers.resolve(ref, mechanism_settings("mcp").options)
        async with mcp_servers.open_client(spec, timeout_s=timeout_s) as conn:
            facts = await describe(conn, tool, arguments or {})
            if not facts["server_tasks"] or facts["task_support"] not in ("optional", "required"):
                raise ValueError(f"{tool!r} on {spec.name} cannot run as a task")
            try:
                await _pass_boundary(item_id, actor, facts)
            except TaskStopped as exc:
                refused = exc
            else:
                final = await _start_and_own(
                    conn, owner, facts, arguments or {}, tool, ttl_ms, poll_s, timeout_s, actor
                )
    except Exception as exc:
        if not owner.started.is_set():
            await _record_failure(item_id, actor, exc, facts)
        else:
            await _record_task_lost(item_id, actor, exc, facts)
        raise _unwrap(exc) from exc
    if refused is not None:
        raise refused
    assert final is not None
    return final


async def _start_and_own(
    conn: Connection,
    owner: TaskOwner,
    facts: dict[str, Any],
    arguments: dict[str, Any],
    tool: str,
    ttl_ms: int | None,
    poll_s: float,
    timeout_s: float,
    actor: str,
) -> Observation:

    item_id = owner.item_id
    params: dict[str, Any] = {
        "name": tool,
        "arguments": arguments,
        "task": {} if ttl_ms is None else {"ttl": ttl_ms},
        "_meta": {"stopdesk_item": str(item_id)},
    }
    answer = await _raw_request(conn, "tools/call", params, timeout_s)
    task = types.CreateTaskResult.model_validate(answer, by_name=False).task
    created = time.monotonic()
    session = {"id": conn.session_id, "owner": _owner_name(), "transport": conn.spec.transport}
    detail = {**facts, "task_status": task.status, "ttl_ms": task.ttl, "session": session}
    await in_thread(item_record_handle, item_id=item_id, handle=task.task_id, actor=actor, detail={"mcp": detail})
    owner.task_id = task.task_id
    owner.detail = detail
    owner.started.set()
    poll = max(poll_s, (task.poll_interval or 0) / 1000 / 4)
    return await _own(conn, owner, facts, created, poll, timeout_s, actor)


async def _own(
    conn: Connection,
    owner: TaskOwner,
    facts: dict[str, Any],
    created: float,
    poll_s: float,
    timeout_s: float,
    actor: str,
) -> Observation:
    """Hold the session: heartbeat, read the task back, cancel it on Stop, record the end."""

    annotations = facts["annotations"]
    task_id = owner.task_id
    deadline_s = mechanism_settings("mcp").deadline_s
    cancelled_at: float | None = None
    while True:
        stop = await in_thread(item_heartbeat, item_id=owner.item_id)  # also: the owner is alive
        if stop and cancelled_at is None:
            cancelled_at = time.monotonic()
            cancel = "accepted"
            try:
                await _raw_request(conn, "tasks/cancel", {"taskId": task_id}, timeout_s)
            except MCPError as exc:
                if exc.error.code != INVALID_PARAMS:
                    raise
                cancel = "-32602; looked it up"  # already terminal, or unknown: the read-back says which
            observation = await _get(conn, task_id, annotations, created, timeout_s, cancel=cancel)
            await in_thread(item_observe, item_id=owner.item_id, observation=observation, action="cancel", actor=actor)
        else:
            observation = await _get(conn, task_id, annotations, created, timeout_s)
            if observation.seen != Seen.RUNNING:
                await in_thread(
                    item_observe, item_id=owner.item_id, observation=observation, action="inspect", actor=actor
                )
        if observation.seen != Seen.RUNNING:
            await _end_session(owner, observation)
            return observation
        if cancelled_at is not None and time.monotonic() - cancelled_at > deadline_s:
            # Still working at the deadline: the reconciler records it uncertain; the session is let go.
            await _end_session(owner, observation)
            return observation
        await anyio.sleep(poll_s)


async def _end_session(owner: TaskOwner, observation: Observation) -> None:
    """Say on the item that its owner reconciled the task and closes the session, so a later look
    by the reconciler repeats what the owner saw instead of finding the session gone."""
    owner.final = observation
    if observation.seen == Seen.RUNNING:
        said = "the task was still working at the deadline after the cancel; the owner let its session go."
    else:
        said = observation.message or f"the task read {observation.remote_status or observation.seen}."
    session = {**owner.detail.get("session", {}), "ended": f"Reconciled by the session's owner: {said}"}
    owner.detail = {**owner.detail, "session": session}
    await in_thread(item_record_detail, item_id=owner.item_id, detail={"mcp": owner.detail})


async def _get(
    conn: Connection, task_id: str, annotations: dict[str, Any], created: float, timeout_s: float, *, cancel: str = ""
) -> Observation:
    try:
        task = await _raw_request(conn, "tasks/get", {"taskId": task_id}, timeout_s)
    except MCPError as exc:
        if exc.error.code != INVALID_PARAMS:
            raise
        after = time.monotonic() - created
        detail = {"task_id": task_id, "tasks/get": f"-32602 {exc.error.message}"[:200], "cancel": cancel}
        if after <= NOT_FOUND_AT_ONCE_S:
            return Observation(
                Seen.UNKNOWABLE,
                remote_status="-32602 right after creation",
                message=NOT_FOUND_AT_ONCE.format(after_ms=round(after * 1000)),
                detail=detail,
                outcome="task not found right after it was created; investigate",
                cancel_sent=bool(cancel),
            )
        return Observation(
            Seen.UNKNOWABLE,
            remote_status="-32602",
            message=(
                "The server no longer knows the task on the session that created it "
                "(its ttl ran out, or the server deleted it); whether it took effect is unknown."
            ),
            detail=detail,
            cancel_sent=bool(cancel),
        )
    return task_observation(task, annotations, cancel=cancel)


async def _record_task_lost(item_id: int, actor: str, exc: BaseException, facts: dict[str, Any] | None) -> None:
    """The owner lost its session (the server crashed, the connection broke) while holding a task."""

    observation = Observation(
        Seen.UNKNOWABLE,
        remote_status="session lost",
        message=(
            f"The session that held the task ended under its owner ({_error_text(exc)}); a server keeps "
            "tasks per session, so whether the task ran, and what it did, is unknown."
        ),
        outcome="task's session lost; investigate",
    )
    try:
        await in_thread(item_observe, item_id=item_id, observation=observation, action="inspect", actor=actor)
    except Exception:
        log.exception("recording the lost session of item %s failed", item_id)


def mcp_start_task(
    *,
    item_id: int,
    tool: str,
    actor: str,
    server: ServerRef | None = None,
    url: str | None = None,
    arguments: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
    poll_s: float = 0.5,
    start_timeout_s: float = 60.0,
) -> str:
    """Start a task-augmented call from synchronous code and return its task id once it is
    recorded as the item's handle. A thread of this process owns the task's session from then
    on (see `task_owner`). Raises TaskStopped if Stop came first, or what the start raised."""
    owner = TaskOwner(item_id)

    def run() -> None:
        from django.db import connection

        try:
            anyio.run(
                lambda: mcp_run_task(
                    item_id=item_id,
                    tool=tool,
                    actor=actor,
                    server=server,
                    url=url,
                    arguments=arguments,
                    ttl_ms=ttl_ms,
                    poll_s=poll_s,
                    owner=owner,
                )
            )
        except BaseException as exc:
            owner.error = exc
        finally:
            owner.started.set()
            connection.close()

    owner.thread = threading.Thread(target=run, name=f"mcp-task-owner-{item_id}", daemon=True)
    _OWNERS[item_id] = owner
    owner.thread.start()
    if not owner.started.wait(start_timeout_s):
        raise TimeoutError(f"the MCP task for item {item_id} did not start within {start_timeout_s}s")
    if not owner.task_id:
        assert owner.error is not None
        raise owner.error
    return owner.task_id
