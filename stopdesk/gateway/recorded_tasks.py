"""A client's task that this gateway process never held: created by a process of the gateway that
has since restarted, or by another one behind the same address. A 2026-07-28 client keeps its task
id and asks again, from any connection (the revision is stateless); telling it "Task not found"
would drop the only handle it has on work that may still be running.

The item is found by the task id the client was given (`gateway.client_task_id`). What the client
is told, in this order:
- Stop reached the item: `cancelled`, with who stopped it and why, as the process that held the
  task would have said;
- the upstream speaks 2026-07-28: its own answer for the task (status, message, result), asked by
  the upstream's task id (the item's handle), under the client's task id. Nothing is recorded from
  it here: the item's owner ended with the process that held it, and the reconciler reads the task
  back and records it once that owner's lease runs out;
- otherwise (a 2025-11-25 upstream's task lived in the session of the process that ended, or the
  upstream no longer knows the task): what the item says. An item still in flight or of unknown
  outcome is `working`, with a message that says so; a completed one is `failed` for the client,
  since no process kept its result, and the message says the call completed.

A 2025-11-25 client's task belongs to its session, which ended with that process: still unknown.
The client's own `tasks/cancel` is sent on to a 2026-07-28 upstream (its acknowledgement proves
nothing; the reconciler reads the task back); a 2025-11-25 upstream's task cannot be reached from
here, and the client is told so."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
import httpx
from django.db.models.fields.json import KT
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from reconcile.mechanisms.mcp.adapter import modern_task_rpc
from reconcile.mechanisms.mcp.servers import ServerSpec
from reconcile.mechanisms.mcp.servers import is_modern as is_modern_revision
from stopdesk.agent.aio import in_thread
from stopdesk.gateway.sessions import stopped_words
from stopdesk.models import WorkItem
from stopdesk.services.sql import is_postgres
from stopdesk.states import ItemState

S = ItemState
RELAYED = ("status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs", "result", "error")


def recorded_item(upstream: str, client_task_id: str) -> WorkItem | None:
    """The item behind the client's task id on this upstream, if the gateway ever gave it out."""
    if not is_postgres():  # SQLite: Django compares a key's text there as JSON, so by its JSON value
        items = WorkItem.objects.filter(mechanism="mcp", detail__gateway__client_task_id=client_task_id)
    else:  # by the index on the key's text (`item_gateway_client_task`)
        items = WorkItem.objects.alias(client_task=KT("detail__gateway__client_task_id")).filter(
            mechanism="mcp", client_task=client_task_id
        )
    return items.filter(detail__gateway__upstream=upstream).first()


def _stop_words(item: WorkItem) -> str | None:
    """Who stopped the item's task and why, if Stop reached the item."""
    return stopped_words(task_id=item.task_id) if item.cancel_requested_at is not None else None


async def recorded_task(spec: ServerSpec, client_task_id: str, *, poll_ms: int) -> dict[str, Any]:
    """The client's task as JSON (2026-07-28), for `tasks/get`."""
    item, stopped = await _lookup(spec, client_task_id)
    if stopped is not None:
        return _task(client_task_id, item, "cancelled", stopped, poll_ms=poll_ms)
    if _upstream_holds_it(item):
        status, answer = await _upstream(spec, "tasks/get", item.handle)
        error = answer.get("error") or {}
        if not _unknown_upstream(status, error):
            if error:
                raise MCPError(code=INTERNAL_ERROR, message=f"the upstream did not answer for the task: {error}")
            relayed = {k: v for k, v in (answer.get("result") or {}).items() if k in RELAYED}
            return {**relayed, "taskId": client_task_id}
        # The upstream no longer knows the task (deleted, or its ttl ran out): the item says what is known.
    return _from_item(client_task_id, item, poll_ms=poll_ms)


def _unknown_upstream(status: int, error: dict[str, Any]) -> bool:
    """-32602, or the HTTP 400/404 a 2026-07-28 server answers for a task id (`Mcp-Name`) it does
    not hold."""
    return status in (400, 404) or error.get("code") == INVALID_PARAMS


async def recorded_cancel(spec: ServerSpec, client_task_id: str) -> dict[str, Any]:
    """The client's `tasks/cancel`: an empty acknowledgement, as 2026-07-28 answers."""
    item, stopped = await _lookup(spec, client_task_id)
    if stopped is not None or item.state in (S.COMPLETED, S.FAILED, S.CANCELLED):
        return {}
    if not _upstream_holds_it(item):
        raise MCPError(
            code=INVALID_PARAMS,
            message=(
                f"Task {client_task_id} ran in a session of the upstream that ended when the gateway restarted; "
                "it cannot be cancelled from here (stopdesk reconciles it)."
            ),
        )
    status, answer = await _upstream(spec, "tasks/cancel", item.handle)
    error = answer.get("error") or {}
    if error and not _unknown_upstream(status, error):
        raise MCPError(code=INTERNAL_ERROR, message=f"the upstream did not take the cancel: {error}")
    return {}  # taken, or the upstream no longer knows the task


async def _lookup(spec: ServerSpec, client_task_id: str) -> tuple[WorkItem, str | None]:
    item = await in_thread(recorded_item, upstream=spec.name, client_task_id=client_task_id)
    if item is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Task not found: {client_task_id}")
    return item, await in_thread(_stop_words, item=item)


def _upstream_holds_it(item: WorkItem) -> bool:
    """A 2026-07-28 upstream answers for its task by id, from any connection."""
    return bool(item.handle) and is_modern_revision((item.detail.get("mcp") or {}).get("revision"))


async def _upstream(spec: ServerSpec, method: str, upstream_task_id: str) -> tuple[int, dict[str, Any]]:
    def ask() -> tuple[int, dict[str, Any]]:
        with httpx.Client(timeout=10.0, headers=spec.http_headers()) as http:
            return modern_task_rpc(http, spec.url, method, upstream_task_id)

    try:
        return await anyio.to_thread.run_sync(ask)
    except (httpx.HTTPError, OSError) as exc:
        raise MCPError(code=INTERNAL_ERROR, message=f"the upstream could not be reached: {exc}") from exc


def _from_item(client_task_id: str, item: WorkItem, *, poll_ms: int) -> dict[str, Any]:
    outcome = item.outcome or item.state
    if item.state == S.COMPLETED:
        message = (
            f"The gateway restarted and kept no result for this task; stopdesk recorded the call completed "
            f"(item {item.pk}: {outcome})."
        )
        return _task(client_task_id, item, "failed", message, poll_ms=poll_ms) | {
            "error": {"code": INTERNAL_ERROR, "message": message}
        }
    if item.state == S.FAILED:
        return _task(client_task_id, item, "failed", outcome, poll_ms=poll_ms) | {
            "error": {"code": INTERNAL_ERROR, "message": outcome}
        }
    if item.state == S.CANCELLED:
        return _task(client_task_id, item, "cancelled", outcome, poll_ms=poll_ms)
    if item.state == S.UNCERTAIN:
        message = f"Outcome unknown ({outcome}); stopdesk is finding out (item {item.pk})."
    else:
        message = (
            f"The gateway restarted while this task ran; stopdesk reads it back from the upstream (item {item.pk})."
        )
    return _task(client_task_id, item, "working", message, poll_ms=poll_ms)


def _task(client_task_id: str, item: WorkItem, status: str, message: str, *, poll_ms: int) -> dict[str, Any]:
    return {
        "taskId": client_task_id,
        "status": status,
        "statusMessage": message,
        "createdAt": _iso(item.created_at),
        "lastUpdatedAt": _iso(item.updated_at),
        "ttlMs": None,
        "pollIntervalMs": poll_ms,
    }


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
