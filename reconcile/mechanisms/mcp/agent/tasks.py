"""Task-augmented MCP calls whose session lives as long as the task: the agent process that
created the task owns the session, cancels and reads back through it, and records the end."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.base import Observation, Seen
from reconcile.mechanisms.mcp import servers as mcp_servers
from reconcile.mechanisms.mcp.adapter import INVALID_PARAMS, NOT_FOUND_AT_ONCE, task_observation
from reconcile.mechanisms.mcp.agent.calls import StopPushed
from reconcile.mechanisms.mcp.agent.common import (
    ServerRef,
    describe,
    error_text,
    offers_tasks,
    pass_boundary,
    record_failure,
    unwrap,
)
from reconcile.mechanisms.mcp.servers import Connection
from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.reconcile import item_observe
from stopdesk.agent.aio import in_thread
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_finish, item_heartbeat, item_record_detail, item_set_handle

log = logging.getLogger(__name__)
# A task the server forgets within this long of creating it was "not found right after creation".
NOT_FOUND_AT_ONCE_S = 5.0


@asynccontextmanager
async def _task_connection(spec: mcp_servers.ServerSpec, timeout_s: float) -> AsyncIterator[Connection]:
    """A connection that can run a task: the newest revision the server offers, declaring the
    2026-07-28 tasks extension. A server that speaks 2026-07-28 without the extension may still
    have core tasks in 2025-11-25: then that revision is used (unless configuration pins one)."""
    async with mcp_servers.open_client(spec, timeout_s=timeout_s, extensions=[mcp_servers.TasksExtension()]) as conn:
        usable = not mcp_servers.is_modern(conn.revision) or offers_tasks(conn.client.server_capabilities)
        if usable or spec.revision != mcp_servers.AUTO:
            yield conn
            return
    async with mcp_servers.open_client(spec, timeout_s=timeout_s, revision=mcp_servers.LEGACY) as conn:
        conn.chosen_because = (
            f"{mcp_servers.LEGACY} chosen for a task: the server speaks {mcp_servers.MODERN} "
            f"without the {mcp_servers.TASKS_EXTENSION} extension"
        )
        yield conn


def _can_run_as_task(conn: Connection, facts: dict[str, Any]) -> bool:
    if not facts["server_tasks"]:
        return False
    # 2025-11-25 declares it per tool (`execution.taskSupport`); in 2026-07-28 the server decides per call.
    return mcp_servers.is_modern(conn.revision) or facts["task_support"] in ("optional", "required")


def _task_facts(conn: Connection) -> dict[str, Any]:
    if mcp_servers.is_modern(conn.revision):
        tasks = f"the {mcp_servers.TASKS_EXTENSION} extension (no session: the task id is the handle)"
    else:
        tasks = "core tasks (2025-11-25), kept in the session that created them"
    return {"tasks": tasks, "cancel_wire": mcp_servers.TASKS_CANCEL}


def _owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def _raw_request(conn: Connection, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    # The SDK types task messages but validates every tools/call answer as a CallToolResult,
    # which would reject a CreateTaskResult: send through the session's dispatcher.
    session = conn.client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {"timeout": timeout_s}
    session._stamp(data, opts)  # type: ignore[arg-type]  # the negotiated version's headers
    if method.startswith("tasks/") and mcp_servers.is_modern(conn.revision):
        # 2026-07-28 over HTTP: Mcp-Name carries the task id, so a load balancer routes to its holder.
        opts.setdefault("headers", {})["mcp-name"] = str(params["taskId"])
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
    # Who asked the owner to cancel the task, once it sent `tasks/cancel`: "stop" (the task's Stop)
    # or "client" (a gateway's client cancelled its own task, `cancel_wanted`).
    cancelled_by: str = ""
    cancel_wanted: bool = False
    # Kept for a gateway that answers its client: the upstream's answer to the call (what
    # `tasks/result` gives, or the answer a server gave at once without a task), and a hook run in
    # the owner's own loop once the task id is recorded (`started`) and again once the owner ends.
    keep_result: bool = False
    result: dict[str, Any] | None = None
    on_change: Callable[[], None] | None = None

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

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
    passed: bool = False,
    stop_seen: StopPushed | None = None,
) -> Observation:
    """Start a task-augmented call and own its session until the task is final or Stop has been
    reconciled through it. Returns the last observation recorded. Raises TaskStopped if Stop
    came first. `passed`: the item was registered through the boundary already (the gateway
    does both in one statement), so only the task's facts are recorded, with its handle.
    `stop_seen`: the task's Stop pushed by the process's StopHub, so `poll_s` only paces the
    lease and the read-backs."""

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
        async with _task_connection(spec, timeout_s) as conn:
            facts = {**await describe(conn, tool, arguments or {}), **_task_facts(conn)}
            if not _can_run_as_task(conn, facts):
                raise ValueError(f"{tool!r} on {spec.name} cannot run as a task")
            try:
                if not passed:
                    await pass_boundary(item_id, actor, facts)
            except TaskStopped as exc:
                refused = exc
            else:
                final = await _start_and_own(
                    conn, owner, facts, arguments or {}, tool, ttl_ms, poll_s, timeout_s, actor, stop_seen
                )
    except Exception as exc:
        if not owner.started.is_set():
            await record_failure(item_id, actor, exc, facts)
        else:
            await _record_task_lost(item_id, actor, exc, facts)
        raise unwrap(exc) from exc
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
    stop_seen: StopPushed | None = None,
) -> Observation:

    item_id = owner.item_id
    params: dict[str, Any] = {"name": tool, "arguments": arguments, "_meta": {"stopdesk_item": str(item_id)}}
    if not mcp_servers.is_modern(conn.revision):
        params["task"] = {} if ttl_ms is None else {"ttl": ttl_ms}  # 2026-07-28: the server decides
    answer = await _raw_request(conn, "tools/call", params, timeout_s)
    task = _created_task(answer, tool)
    if task is None:
        return await _answered_without_a_task(owner, answer, actor)
    created = time.monotonic()
    session = {"id": conn.session_id, "owner": _owner_name(), "transport": conn.spec.transport}
    detail = {**facts, "task_status": task["status"], "ttl_ms": task["ttl_ms"], "session": session}
    # The task id is the only handle on the work: recorded before anything else is done with it.
    await in_thread(item_set_handle, item_id=item_id, handle=task["task_id"], actor=actor, detail={"mcp": detail})
    # Then the owner's lease, before anyone is told the task exists: a reconciler that sees the
    # handle without a lease would take the owner for gone and resume the session beside it.
    await in_thread(item_heartbeat, item_id=item_id)
    owner.task_id = task["task_id"]
    owner.detail = detail
    owner.started.set()
    owner.changed()
    poll = max(poll_s, (task["poll_ms"] or 0) / 1000 / 4)
    return await _own(conn, owner, facts, created, poll, timeout_s, actor, stop_seen)


def _created_task(answer: dict[str, Any], tool: str) -> dict[str, Any] | None:
    """The task a `tools/call` answered with: nested under `task` (2025-11-25) or the answer itself
    (`resultType: "task"`, 2026-07-28). None for a plain result: in 2026-07-28 the server decides
    per call whether to make a task."""
    if "task" in answer:
        task = types.CreateTaskResult.model_validate(answer, by_name=False).task
        return {"task_id": task.task_id, "status": task.status, "ttl_ms": task.ttl, "poll_ms": task.poll_interval}
    if answer.get("resultType") == "task" and answer.get("taskId"):
        return {
            "task_id": str(answer["taskId"]),
            "status": str(answer.get("status")),
            "ttl_ms": answer.get("ttlMs"),
            "poll_ms": answer.get("pollIntervalMs"),
        }
    if answer.get("resultType") in (None, "complete") and "content" in answer:
        return None
    raise ValueError(f"{tool!r} answered neither a task nor a result (resultType {answer.get('resultType')!r})")


async def _answered_without_a_task(owner: TaskOwner, answer: dict[str, Any], actor: str) -> Observation:
    """The server ran the call at once and answered its result: the item ends with it."""
    result = types.CallToolResult.model_validate(answer, by_name=False)
    if owner.keep_result:
        owner.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
    await in_thread(
        item_finish, item_id=owner.item_id, succeeded=not result.is_error, actor=actor, outcome=text or "done"
    )
    owner.final = Observation(
        Seen.FAILED if result.is_error else Seen.COMPLETED, remote_status="answered without a task"
    )
    return owner.final


async def _own(
    conn: Connection,
    owner: TaskOwner,
    facts: dict[str, Any],
    created: float,
    poll_s: float,
    timeout_s: float,
    actor: str,
    stop_seen: StopPushed | None = None,
) -> Observation:
    """Hold the session: heartbeat, read the task back, cancel it on Stop (or when its gateway
    client cancelled it), record the end."""

    annotations = facts["annotations"]
    task_id = owner.task_id
    deadline_s = mechanism_settings("mcp").deadline_s
    cancelled_at: float | None = None
    while True:
        stop = await in_thread(item_heartbeat, item_id=owner.item_id)  # also: the owner is alive
        if (stop or owner.cancel_wanted) and cancelled_at is None:
            cancelled_at = time.monotonic()
            try:
                cancel = _cancel_answer(await _raw_request(conn, "tasks/cancel", {"taskId": task_id}, timeout_s))
            except MCPError as exc:
                if exc.error.code != INVALID_PARAMS:
                    raise
                cancel = "-32602; looked it up"  # already terminal, or unknown: the read-back says which
            observation = await _get(conn, task_id, annotations, created, timeout_s, cancel=cancel)
            await _observe(owner, observation, "cancel", actor)
            # Said once the cancel was sent and its read-back recorded, not before.
            owner.cancelled_by = "stop" if stop else "client"
            owner.changed()
        else:
            observation = await _get(conn, task_id, annotations, created, timeout_s)
            if owner.keep_result and observation.seen in (Seen.COMPLETED, Seen.FAILED):
                owner.result = await _task_result(conn, task_id, timeout_s)
            if observation.seen != Seen.RUNNING:
                await _observe(owner, observation, "inspect", actor)
        if observation.seen != Seen.RUNNING:
            _let_go(owner, observation)
            return observation
        if cancelled_at is not None and time.monotonic() - cancelled_at > deadline_s:
            # Still working at the deadline: the reconciler records it uncertain; the session is let go.
            owner.detail = _session_ended(owner, observation)
            await in_thread(item_record_detail, item_id=owner.item_id, detail={"mcp": owner.detail}, actor=actor)
            _let_go(owner, observation)
            return observation
        if stop_seen is None:
            await anyio.sleep(poll_s)
        else:
            with anyio.move_on_after(poll_s):
                await stop_seen.event.wait()
            if cancelled_at is not None:
                # Seen once; after the cancel only the read-backs pace the loop.
                stop_seen.event.clear()


async def _task_result(conn: Connection, task_id: str, timeout_s: float) -> dict[str, Any] | None:
    """What the call answered, for a gateway's client: `tasks/result` (2025-11-25; the task is
    terminal, so it answers at once), or the result a 2026-07-28 `tasks/get` carries. None when
    the server no longer has it."""
    try:
        if not mcp_servers.is_modern(conn.revision):
            answer = await _raw_request(conn, "tasks/result", {"taskId": task_id}, timeout_s)
            return {k: v for k, v in answer.items() if k != "_meta"}
        task = await _raw_request(conn, "tasks/get", {"taskId": task_id}, timeout_s)
    except MCPError as exc:
        log.info("the result of task %s could not be read: %s", task_id, error_text(exc))
        return None
    if isinstance(task.get("result"), dict):
        return dict(task["result"])
    if isinstance(task.get("error"), dict):
        text = f"MCP error {task['error'].get('code')}: {task['error'].get('message')}"
        return {"content": [{"type": "text", "text": text}], "isError": True}
    return None


def _cancel_answer(answer: dict[str, Any]) -> str:
    """What `tasks/cancel` said, for the record. Only the read-back that follows counts: an empty
    acknowledgement, or even `cancelled`, says nothing about the task's effect."""
    status = answer.get("status")
    if status:
        return f"answered {status}; read back with tasks/get"
    return "empty acknowledgement (proves nothing); read back with tasks/get"


async def _observe(owner: TaskOwner, observation: Observation, action: str, actor: str) -> None:
    """Record what the owner saw. A final read-back ends the session, and the item says so in the
    same write as the read-back: a reconciler that found the item settled by its owner but the
    session not marked ended would take the owner for gone and resume the session it is closing
    (HTTP 404), recording that the owner stopped."""
    ended = _session_ended(owner, observation) if observation.seen != Seen.RUNNING else None
    await in_thread(
        item_observe,
        item_id=owner.item_id,
        observation=observation,
        action=action,
        actor=actor,
        detail=None if ended is None else {"mcp": ended},
    )
    if ended is not None:
        owner.detail = ended


def _session_ended(owner: TaskOwner, observation: Observation) -> dict[str, Any]:
    """The owner's facts saying that it reconciled the task and closes the session, so a later
    look by the reconciler repeats what the owner saw instead of finding the session gone."""
    if observation.seen == Seen.RUNNING:
        said = "the task was still working at the deadline after the cancel; the owner let its session go."
    else:
        said = observation.message or f"the task read {observation.remote_status or observation.seen}."
    session = {**owner.detail.get("session", {}), "ended": f"Reconciled by the session's owner: {said}"}
    return {**owner.detail, "session": session}


def _let_go(owner: TaskOwner, observation: Observation) -> None:
    owner.final = observation
    owner.changed()


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
        if cancel:  # the cancel was answered, so the task existed until then
            return Observation(
                Seen.UNKNOWABLE,
                remote_status="-32602 after its cancel",
                message=(
                    "The server answered tasks/cancel, then no longer knew the task (it deleted it, "
                    "which the spec allows at any time); a deletion proves nothing, and a cancel is "
                    "only a request: whether the task's work ran on and took effect is unknown."
                ),
                detail=detail,
                outcome="task deleted after its cancel; investigate",
                cancel_sent=True,
            )
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
                "The server no longer knows the task (its ttl ran out, or the server deleted it, which "
                "the spec allows); whether it took effect is unknown."
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
            f"The session that held the task ended under its owner ({error_text(exc)}); a server keeps "
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
    on (see `task_owner`). Returns "" when the server answered the call at once, without a task
    (2026-07-28 lets it decide): the item is then finished with that answer. Raises TaskStopped
    if Stop came first, or what the start raised."""
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
    if owner.error is not None:
        raise owner.error
    return owner.task_id
