"""Stop's notification (its channel and payload; the stop service sends it inside the stop
request's transaction, in the statement that sets the task's stop time), and the read that
answers "which of these tasks are stopped" for the watchers (`stopdesk.push`) and the asyncio
supervisor."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from stopdesk.models import Task

CHANNEL = "stopdesk_stop"
# A notification's payload, "<task id> <stop time, ISO 8601>", as SQL over a task id and its stop
# time (the stop service sends it in the statement that sets the time; `stopdesk.push.hub` reads it).
NOTIFY_PAYLOAD = "{task}::text || ' ' || (to_json({at}) #>> '{{}}')"


def stopped_among(task_ids: Iterable[int]) -> dict[int, datetime | None]:
    ids = list(task_ids)
    if not ids:
        return {}
    rows = Task.objects.filter(pk__in=ids, stop_requested_at__isnull=False).values_list("pk", "stop_requested_at")
    return dict(rows)
