from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone

from stopdesk.models import Event, Task, WorkItem
from stopdesk.notify.outbox import notify_for_events


def actor_for(user: AbstractBaseUser | AnonymousUser | None) -> str:
    if user is None or not user.is_authenticated:
        return "anonymous"
    return f"user:{user.get_username()}"


def event_record(
    *,
    kind: str,
    actor: str,
    task: Task | int | None = None,
    item: WorkItem | None = None,
    from_state: str = "",
    to_state: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> Event:
    task_id = task if isinstance(task, int) else (task.pk if task is not None else None)
    if task_id is None and item is not None:
        task_id = item.task_id
    event = Event.objects.create(
        at=at or timezone.now(),
        kind=kind,
        actor=actor,
        task_id=task_id,
        item=item,
        from_state=from_state,
        to_state=to_state,
        message=message,
        data=data or {},
    )
    notify_for_events([event])
    return event
