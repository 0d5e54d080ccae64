"""Time-based notifications: an investigate-by deadline near or passed, a stop not settled in
time. A beat job scans forward from a cursor kept in a heartbeat row, in bounded batches on the
indexed columns, so each run reads at most `limit` rows whatever the ledger's size."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.notify.models import Heartbeat, Notification
from stopdesk.notify.outbox import item_words, notification_body, notifications_write
from stopdesk.notify.topics import Topic
from stopdesk.states import SETTLED, ItemState

CURSOR = "notify_scan"


def _cfg() -> dict[str, Any]:
    return settings.STOPDESK_NOTIFY  # type: ignore[no-any-return]


def _cursor(name: str, cursors: dict[str, str], default: datetime) -> datetime:
    value = cursors.get(name)
    return datetime.fromisoformat(value) if value else default


def notifications_scan(*, now: datetime | None = None, limit: int = 500) -> dict[str, int]:
    """One pass; returns how many notifications of each topic it wrote."""
    now = now or timezone.now()
    near = timedelta(minutes=float(_cfg()["INVESTIGATE_NEAR_MINUTES"]))
    unsettled_after = timedelta(minutes=float(_cfg()["STOP_UNSETTLED_MINUTES"]))
    start = now - timedelta(days=1)  # a fresh install looks back a day, not over all history
    row = Heartbeat.objects.filter(name=CURSOR).first()
    cursors: dict[str, str] = dict(row.detail) if row else {}
    written: dict[str, int] = {}

    def deadlines(topic: str, after: datetime, through: datetime) -> datetime:
        items: list[Any] = list(
            WorkItem.objects.filter(state=ItemState.UNCERTAIN, investigate_by__gt=after, investigate_by__lte=through)
            .order_by("investigate_by", "id")
            .values("id", "task_id", "noun", "label", "mechanism", "investigate_by")[:limit]
        )
        verb = "is near" if topic == Topic.INVESTIGATE_NEAR else "passed"
        rows = [
            Notification(
                topic=topic,
                dedupe_key=f"{topic}:item:{i['id']}:{i['investigate_by'].isoformat()}",
                task_id=i["task_id"],
                item_id=i["id"],
                title=(t := f"{item_words(i)}: investigate-by {i['investigate_by']:%Y-%m-%d %H:%M} UTC {verb}"),
                body=notification_body(t, i["task_id"]),
                data={"task_id": i["task_id"], "item_id": i["id"], "investigate_by": i["investigate_by"].isoformat()},
            )
            for i in items
        ]
        written[topic] = len(notifications_write(rows))
        # A full batch moves the cursor only as far as it read; the next run continues there.
        last: datetime = items[-1]["investigate_by"] if len(items) == limit else through
        return last

    passed = deadlines(Topic.INVESTIGATE_PASSED, _cursor("passed", cursors, start), now)
    near_through = deadlines(Topic.INVESTIGATE_NEAR, max(_cursor("near", cursors, start), now), now + near)

    stop_after = _cursor("stop", cursors, start - unsettled_after)
    unsettled = WorkItem.objects.filter(task=OuterRef("pk")).exclude(state__in=SETTLED)
    tasks: list[Any] = list(
        Task.objects.filter(stop_requested_at__gt=stop_after, stop_requested_at__lte=now - unsettled_after)
        .order_by("stop_requested_at", "id")
        .annotate(open=Exists(unsettled))
        .values("id", "title", "stop_requested_at", "open")[:limit]
    )
    minutes = int(unsettled_after.total_seconds() // 60)
    rows = [
        Notification(
            topic=Topic.STOP_UNSETTLED,
            dedupe_key=f"{Topic.STOP_UNSETTLED}:task:{t['id']}",
            task_id=t["id"],
            title=(title := f"Stop of task {t['title']!r} has not settled after {minutes} min"),
            body=notification_body(title, t["id"]),
            data={"task_id": t["id"], "stop_requested_at": t["stop_requested_at"].isoformat()},
        )
        for t in tasks
        if t["open"]
    ]
    written[Topic.STOP_UNSETTLED] = len(notifications_write(rows))
    stop_through: datetime = tasks[-1]["stop_requested_at"] if len(tasks) == limit else now - unsettled_after

    cursors = {"passed": passed.isoformat(), "near": near_through.isoformat(), "stop": stop_through.isoformat()}
    Heartbeat.objects.update_or_create(name=CURSOR, defaults={"at": now, "detail": cursors})
    return written
