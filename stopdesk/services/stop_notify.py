"""Stop's notification, sent by the stop service inside the stop request's transaction, and the
read that answers "which of these tasks are stopped" for the watchers (`stopdesk.push`) and the
asyncio supervisor."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection

from stopdesk.models import Task
from stopdesk.services.sql import is_postgres

CHANNEL = "stopdesk_stop"
# A notification's payload, "<task id> <stop time, ISO 8601>", as SQL over a task id and its stop
# time (the stop service sends it in the statement that sets the time; `stopdesk.push.hub` reads it).
NOTIFY_PAYLOAD = "{task}::text || ' ' || (to_json({at}) #>> '{{}}')"


def stop_notify(*, task_id: int, requested_at: datetime) -> None:
    """Inside the stop request's transaction: tell every listener once it commits. The payload
    carries the time, so no watcher has to read it back."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{task_id} {requested_at.isoformat()}"])


def stopped_among(task_ids: Iterable[int]) -> dict[int, datetime | None]:
    ids = list(task_ids)
    if not ids:
        return {}
    rows = Task.objects.filter(pk__in=ids, stop_requested_at__isnull=False).values_list("pk", "stop_requested_at")
    return dict(rows)
