"""Small steps the reconcile tests share: stopping a task, sweeping until nothing is due, and the
MCP task a dead agent leaves behind."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
from django.utils import timezone

from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.mechanisms.mcp.sandbox_raw import RawMcpSession
from reconcile.services.reconcile import sweep_once
from stopdesk.models import Event, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from tests.factories import set_state_by_hand


def stop(task: Any, django_capture_on_commit_callbacks: Any) -> list[int]:
    dispatched: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        task_request_stop(task_id=task.pk, actor="user:operator", dispatch=dispatched.extend)
    return dispatched


def sweep_until_settled(clock: Any, item: WorkItem, *, max_passes: int = 200) -> int:
    """Run sweeps on the controllable clock, jumping to each next check, until the item has no
    next check. Returns the number of passes."""
    for passes in range(1, max_passes + 1):
        item.refresh_from_db()
        if item.next_check_at is None:
            return passes - 1
        if item.next_check_at > clock.now:
            clock.now = item.next_check_at
        sweep_once(now=clock.now, concurrency=1)
    raise AssertionError(f"item {item.pk} still scheduled after {max_passes} sweeps: {item.state}")


def events(item: WorkItem, kind: str) -> list[Event]:
    return list(Event.objects.filter(item=item, kind=kind))


def abandoned_extension_task(url: str, item: WorkItem) -> str:
    """The same in 2026-07-28: an export task started through the tasks extension (no session),
    recorded on an item whose owner's lease has run out."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "dead-agent", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tools.EXPORT_REPORT, "arguments": {"seconds": 5}, "_meta": meta},
    }
    headers = {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tools.EXPORT_REPORT,
        "Accept": "application/json, text/event-stream",
    }
    answer = httpx.post(url, json=body, headers=headers, timeout=10)
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        result = next(json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:"))["result"]
    else:
        result = answer.json()["result"]
    assert result["resultType"] == "task", result
    task_id: str = result["taskId"]
    facts = {
        "server": url,
        "url": url,
        "transport": "streamable_http",
        "revision": "2026-07-28",
        "tool": tools.EXPORT_REPORT,
        "server_tasks": True,
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
        "session": {"id": None, "owner": "gone-host:1", "transport": "streamable_http"},
    }
    set_state_by_hand(
        WorkItem.objects.filter(pk=item.pk),
        ItemState.RUNNING,
        handle=task_id,
        detail={"mcp": facts},
        lease_until=timezone.now() - timedelta(seconds=1),
    )
    return task_id


def abandoned_task(url: str, item: WorkItem, *, server: str | None = None, delete_session: bool = False) -> str:
    """What a dead agent leaves behind: an export task started in a session nobody holds, recorded
    on the item with an owner whose lease has run out. `server` is the name the item records (the
    URL when the server is not named)."""
    raw = RawMcpSession(url).__enter__()
    called = raw.request("tools/call", {"name": tools.EXPORT_REPORT, "arguments": {"seconds": 5}, "task": {}})
    task_id: str = called["task"]["taskId"]
    facts = {
        "server": server or url,
        "url": url,
        "transport": "streamable_http",
        "tool": tools.EXPORT_REPORT,
        "server_tasks": True,
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
        "session": {"id": raw.session_id, "owner": "gone-host:1", "transport": "streamable_http"},
    }
    set_state_by_hand(
        WorkItem.objects.filter(pk=item.pk),
        ItemState.RUNNING,
        handle=task_id,
        detail={"mcp": facts},
        lease_until=timezone.now() - timedelta(seconds=1),
    )
    if delete_session:
        raw.close()
    return task_id
