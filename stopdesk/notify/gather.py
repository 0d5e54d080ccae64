"""Where the outbox files a per-item fact: its task's open digest, opened here if there is none.

Runs in the transaction that writes the fact. On PostgreSQL it holds a KEY SHARE lock on the
digest row until that transaction ends; the digest writer (notify/digest.py) takes the row FOR
UPDATE before it counts. So a fact is either committed before the count (and counted) or filed
after it (in the same digest if it stays open, in a new one if it was closed): none is counted
twice and none is missed. Facts of one task do not wait for each other (KEY SHARE locks share).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from stopdesk.notify.models import Digest, Notification
from stopdesk.notify.topics import DIGESTED


def digest_window() -> timedelta:
    """How long a digest gathers before its first message (STOPDESK_NOTIFY_DIGEST_WINDOW_SECONDS)."""
    notify: dict[str, Any] = settings.STOPDESK_NOTIFY
    return timedelta(seconds=float(notify.get("DIGEST_WINDOW_SECONDS", 60)))


def digests_attach(rows: Iterable[Notification], *, now: datetime | None = None) -> None:
    """Point each per-item fact of a task at that task's open digest. Call it inside the
    transaction that inserts the rows."""
    now = now or timezone.now()
    by_task: dict[int, list[Notification]] = {}
    for row in rows:
        if row.topic in DIGESTED and row.task_id is not None:
            by_task.setdefault(row.task_id, []).append(row)
    # In task order, so two transactions filing facts of the same tasks lock them in one order.
    for task_id in sorted(by_task):
        digest_id = _open_digest(task_id, now)
        for row in by_task[task_id]:
            row.digest_id = digest_id


def _open_digest(task_id: int, now: datetime) -> int:
    for _ in range(5):
        found = _lock_open(task_id)
        if found is not None:
            return found
        # One open digest per task (a partial unique index): a concurrent opener wins, and the
        # lock below then finds its row once it commits.
        Digest.objects.bulk_create(
            [Digest(task_id=task_id, opened_at=now, due_at=now + digest_window())], ignore_conflicts=True
        )
    raise RuntimeError(f"no open digest for task {task_id} after five tries")


def _lock_open(task_id: int) -> int | None:
    if connection.vendor != "postgresql":  # SQLite runs one writer at a time
        return Digest.objects.filter(task_id=task_id, closed_at__isnull=True).values_list("id", flat=True).first()
    with connection.cursor() as cursor:
        # Re-checked after a wait: a digest closed meanwhile is not returned, and a new one opens.
        cursor.execute("SELECT id FROM notify_digest WHERE task_id = %s AND closed_at IS NULL FOR KEY SHARE", [task_id])
        row = cursor.fetchone()
    return int(row[0]) if row else None
