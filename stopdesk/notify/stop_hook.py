"""Stop's credential hook: the `stop_requested` notification, written by the stop service in the
stop request's own transaction (so it exists exactly when the Stop committed, and a lost broker
loses nothing: the sweep delivers an outbox row whose job never ran), delivered after commit like
every notification. It carries the task, its runtime and the tools in flight at the Stop, so a
team's receiver can revoke the keys they hold the moment Stop is pressed.

Written only when someone takes the topic (an endpoint that names it, or a person who chose it by
email): a Stop with nobody listening adds no row and one small read to its transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from stopdesk.models import Task, WorkItem
from stopdesk.notify.models import EmailPreference, Notification, WebhookEndpoint
from stopdesk.notify.outbox import notification_body, notifications_write
from stopdesk.notify.topics import Topic
from stopdesk.states import IN_FLIGHT

# The tools listed in one message; `in_flight_total` counts them all.
TOOLS_LISTED = 500


def stop_hook_wanted() -> bool:
    """Whether any active endpoint names `stop_requested`, or (with email on) any person chose it."""
    topic = Topic.STOP_REQUESTED.value
    if any(topic in (t or ()) for t in WebhookEndpoint.objects.filter(active=True).values_list("topics", flat=True)):
        return True
    notify: dict[str, Any] = settings.STOPDESK_NOTIFY
    return bool(notify["EMAIL"]) and any(
        topic in (t or ()) for t in EmailPreference.objects.values_list("topics", flat=True)
    )


def in_flight_tools(task_id: int) -> tuple[list[dict[str, Any]], int]:
    """The task's items in flight (crossed the boundary, not settled) as tools: what each one is,
    the system it acts on when it declared one, the mechanism and handle that can cancel it."""
    rows = WorkItem.objects.filter(task_id=task_id, state__in=sorted(IN_FLIGHT)).order_by("id")
    total = rows.count()
    tools = []
    for item in rows.values("id", "kind", "mechanism", "handle", "noun", "label", "state", "started_at", "detail")[
        :TOOLS_LISTED
    ]:
        detail: dict[str, Any] = item["detail"] if isinstance(item["detail"], dict) else {}
        tool: dict[str, Any] = detail["tool"] if isinstance(detail.get("tool"), dict) else {}
        http: dict[str, Any] = detail["http"] if isinstance(detail.get("http"), dict) else {}
        tools.append(
            {
                "item_id": item["id"],
                "tool": str(tool.get("name") or item["label"] or item["noun"]),
                "system": str(tool.get("system") or http.get("system") or ""),
                "framework": str(tool.get("framework") or ""),
                "kind": item["kind"],
                "mechanism": item["mechanism"],
                "handle": item["handle"],
                "state": item["state"],
                "started_at": item["started_at"].isoformat() if item["started_at"] else None,
            }
        )
    return tools, total


def stop_requested_notify(
    *,
    task: Task,
    stop_request_id: int,
    event_id: int | None,
    requested_at: datetime,
    actor: str,
    reason: str,
    wanted: bool,
) -> list[int]:
    """Inside the stop request's transaction: the hook's outbox row (once per task: its key is the
    task's), queued for delivery after commit. Returns its id, or nothing if nobody takes it.
    `wanted`: `stop_hook_wanted()`, which the Stop reads before its transaction, so the two reads
    are not between its clock and its commit."""
    if not wanted:
        return []
    tools, total = in_flight_tools(task.pk)
    runtime = task.runtime
    where = f" on runtime {runtime.name!r}" if runtime else ""
    count = f"{total} tool{'s' if total != 1 else ''} in flight" if total else "nothing in flight"
    title = f"Stop of task {task.title!r}{where} by {actor}: {count}"
    lines = [f"- {t['tool']}" + (f" on {t['system']}" if t["system"] else "") + f" ({t['mechanism']})" for t in tools]
    if total > len(tools):
        lines.append(f"- and {total - len(tools)} more")
    body = notification_body(title, task.pk)
    if lines:
        head, _, links = body.partition("\n")
        body = "\n".join([head, "In flight at the Stop:", *lines, links])
    data = {
        "task_id": task.pk,
        "task": {"id": task.pk, "title": task.title},
        "runtime": {"id": runtime.pk, "name": runtime.name} if runtime else None,
        "stop_request_id": stop_request_id,
        "requested_at": requested_at.isoformat(),
        "actor": actor,
        "reason": reason,
        "in_flight": tools,
        "in_flight_total": total,
    }
    row = Notification(
        topic=Topic.STOP_REQUESTED,
        dedupe_key=f"{Topic.STOP_REQUESTED}:task:{task.pk}",
        event_id=event_id,
        task_id=task.pk,
        title=title[:300],
        body=body,
        data=data,
    )
    return notifications_write([row])
