"""Small steps the reconcile tests share: stopping a task and sweeping until nothing is due."""

from __future__ import annotations

from typing import Any

from reconcile.services.reconcile import sweep_once
from stopdesk.models import Event, WorkItem
from stopdesk.services.stop import task_request_stop


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
