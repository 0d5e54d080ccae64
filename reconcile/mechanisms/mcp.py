"""MCP tool calls through the official `mcp` SDK: the adapter that cancels and reads them back.

Plain calls (`stopdesk.agent.mcp.mcp_call_tool`) are cancelled by their caller: the call runs in a
cancel scope watched against the ledger, and Stop cancels the scope (the SDK sends
`notifications/cancelled`). No response follows a cancelled call, so a read-only tool ends
`cancelled` and any other tool ends `uncertain`: the server may well have finished the work
(reference servers do). Annotations are hints from the server and are recorded as evidence of why
the item ended as it did. This adapter reads a plain call's end back from the ledger.

Task-augmented calls (protocol 2025-11-25, `stopdesk.agent.mcp.mcp_start_task`): the task id is the
item's handle; Stop sends `tasks/cancel` and reads the final status back with `tasks/get` (-32602
on cancel means "already terminal or unknown": look it up). The SDK types these messages but does
not dispatch them, so they go over the SDK's own session (`ClientSession.send_request`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from django.utils import timezone
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.base import LEDGER_FINAL, Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen
from stopdesk.states import ItemState

log = logging.getLogger(__name__)
INVALID_PARAMS = -32602
TASK_STATUS = {
    "working": Seen.RUNNING,
    "input_required": Seen.RUNNING,
    "completed": Seen.COMPLETED,
    "failed": Seen.FAILED,
    "cancelled": Seen.CANCELLED,
}


@asynccontextmanager
async def connect(url: str, *, timeout_s: float) -> AsyncIterator[Client]:
    # The 2025-11-25 handshake: tasks are part of that revision (they left the core spec in
    # 2026-07-28), and it is what servers that implement them speak.
    async with Client(url, mode="legacy", read_timeout_seconds=timeout_s) as client:
        yield client


def annotations_of(tool: types.Tool) -> dict[str, Any]:
    hints = tool.annotations
    # The spec's defaults when a hint is absent: not read-only, destructive, not idempotent, open world.
    return {
        "readOnlyHint": bool(hints and hints.read_only_hint),
        "destructiveHint": True if hints is None or hints.destructive_hint is None else hints.destructive_hint,
        "idempotentHint": bool(hints and hints.idempotent_hint),
        "openWorldHint": True if hints is None or hints.open_world_hint is None else hints.open_world_hint,
    }


async def describe(client: Client, url: str, tool: str) -> dict[str, Any]:
    listing = await client.list_tools()
    found = next((t for t in listing.tools if t.name == tool), None)
    if found is None:
        raise LookupError(f"{url} has no tool {tool!r}")
    caps = client.server_capabilities
    return {
        "server": url,
        "server_name": client.server_info.name if client.server_info else "",
        "tool": tool,
        "protocol_version": client.protocol_version,
        "annotations": annotations_of(found),
        "task_support": (found.execution.task_support if found.execution else None) or "forbidden",
        "server_tasks": bool(getattr(caps, "tasks", None)),
    }


class McpToolCall(Mechanism):
    name = "mcp"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})
    defaults = MechanismSettings(
        call_timeout_s=10.0, deadline_s=300.0, backoff_initial_s=1.0, backoff_max_s=30.0, recheck_interval_s=2.0
    )

    def can(self, capability: Capability, item: ItemRef | None = None) -> bool:
        if item is not None and capability == Capability.CANCEL:
            return _is_task(item)  # a plain call is cancelled by its caller's scope, not from here
        return capability in self.capabilities

    def cancel(self, item: ItemRef) -> Observation:
        if not _is_task(item):
            return self.inspect(item)
        return self._run(self._task_cancel, item)

    def inspect(self, item: ItemRef) -> Observation:
        if _is_task(item):
            return self._run(self._task_get, item)
        return _plain_call(item)

    def _run(self, fn: Any, item: ItemRef) -> Observation:
        try:
            return anyio.run(fn, item)
        except (OSError, TimeoutError, MCPError) as exc:
            return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__, message=str(exc)[:200])
        except Exception as exc:  # the transport wraps connection failures in exception groups
            return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__, message=str(exc)[:200])

    async def _task_cancel(self, item: ItemRef) -> Observation:
        url = item.detail["mcp"]["server"]
        async with connect(url, timeout_s=self.settings.call_timeout_s) as client:
            cancel = "accepted"
            try:
                await client.session.send_request(
                    types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=item.handle)),
                    types.CancelTaskResult,
                )
            except MCPError as exc:
                if exc.error.code != INVALID_PARAMS:
                    raise
                cancel = "-32602; looked it up"  # already terminal, or unknown: the read-back says which
            read_back = await self._get(client, item)
        detail = {**read_back.detail, "cancel": cancel}
        return Observation(read_back.seen, read_back.remote_status, read_back.message, detail, cancel_sent=True)

    async def _task_get(self, item: ItemRef) -> Observation:
        async with connect(item.detail["mcp"]["server"], timeout_s=self.settings.call_timeout_s) as client:
            return await self._get(client, item)

    async def _get(self, client: Client, item: ItemRef) -> Observation:
        try:
            task = await client.session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=item.handle)), types.GetTaskResult
            )
        except MCPError as exc:
            if exc.error.code == INVALID_PARAMS:
                return Observation(
                    Seen.UNKNOWABLE,
                    remote_status="-32602",
                    message="The server no longer knows this task (expired or deleted).",
                )
            raise
        detail = {"task_id": task.task_id, "status": task.status, "status_message": task.status_message}
        annotations = (item.detail.get("mcp") or {}).get("annotations") or {}
        if task.status == "cancelled" and not annotations.get("readOnlyHint"):
            # The spec has the receiver set `cancelled` before it even tries to stop the work, and
            # keep it even if the work then finishes: for a tool that may change the world, the
            # status proves nothing about its effect (the drills caught an export landing anyway).
            return Observation(
                Seen.UNKNOWABLE,
                remote_status=task.status,
                message=(
                    "The server marked the task cancelled, which MCP keeps even if the work goes on; "
                    "the tool is not read-only, so whether it took effect is unknown."
                ),
                detail=detail,
            )
        return Observation(TASK_STATUS[task.status], remote_status=task.status, detail=detail)


def _is_task(item: ItemRef) -> bool:
    return bool(item.handle) and bool((item.detail.get("mcp") or {}).get("server_tasks"))


def _plain_call(item: ItemRef) -> Observation:
    """A plain call's caller records its end in the ledger; read it back from there."""
    if item.state in LEDGER_FINAL:
        return Observation(LEDGER_FINAL[item.state], remote_status=f"ledger: {item.state}")
    if item.state == ItemState.RUNNING and item.lease_until is not None and item.lease_until > timezone.now():
        return Observation(Seen.RUNNING, remote_status="caller alive", message="The caller cancels its own call.")
    annotations = (item.detail.get("mcp") or {}).get("annotations") or {}
    if annotations.get("readOnlyHint"):
        return Observation(Seen.NO_EFFECT, remote_status="caller gone", message="read-only tool; nothing to reconcile")
    return Observation(
        Seen.UNKNOWABLE,
        remote_status="caller gone",
        message="The call may have changed the world and MCP has no status lookup for plain calls.",
    )
