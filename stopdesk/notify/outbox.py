"""The hook the ledger calls where it appends events: `notify_for_events`.

It writes outbox rows in the caller's transaction (so a notification exists exactly when its
event does) and queues one delivery job after commit. Imports only models: the ledger's write
module calls it, and it must not call back into services.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from stopdesk.celery import app
from stopdesk.models import WorkItem
from stopdesk.notify.gather import digests_attach
from stopdesk.notify.models import Notification
from stopdesk.notify.topics import Topic, topic_for
from stopdesk.tracing import span_event

log = logging.getLogger(__name__)

DELIVER_TASK = "notify.deliver"
JOB_CHUNK = 5


class EventLike(Protocol):
    @property
    def pk(self) -> Any: ...
    @property
    def kind(self) -> str: ...
    @property
    def from_state(self) -> str: ...
    @property
    def to_state(self) -> str: ...
    @property
    def item_id(self) -> int | None: ...
    @property
    def task_id(self) -> int | None: ...
    @property
    def data(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class MovedItem:
    """An event of a set-based move, which has no row object: the item and its move."""

    item_id: int
    kind: str
    from_state: str
    to_state: str
    task_id: int | None = None
    pk: None = None
    data: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def notifies(*, kind: str, from_state: str, to_state: str | None) -> bool:
        """Whether a set-based move writes notifications (most do not: cancels, reschedules)."""
        return topic_for(kind=kind, from_state=from_state, to_state=to_state or from_state) is not None

    @classmethod
    def many(cls, ids: Sequence[int], *, kind: str, from_state: str, to_state: str | None) -> list[MovedItem]:
        """A set-based move's events, one per moved item."""
        return [cls(i, kind, from_state, to_state or from_state) for i in ids]


def notify_for_events(events: Sequence[EventLike]) -> list[int]:
    """Write a notification for each event that notifies; returns their ids. Call it inside the
    transaction that appends the events."""
    wanted = [(e, t) for e in events if (t := topic_for(kind=e.kind, from_state=e.from_state, to_state=e.to_state))]
    if not wanted:
        return []
    item_ids = {e.item_id for e, _ in wanted if e.item_id is not None}
    items: dict[int, Any] = {
        row["id"]: row
        for row in WorkItem.objects.filter(id__in=item_ids).values(
            "id", "task_id", "noun", "label", "investigate_by", "outcome", "mechanism", "handle", "idempotency_key"
        )
    }
    rows = [_notification(event, topic, items.get(event.item_id or 0)) for event, topic in wanted]
    for event, topic in wanted:
        if topic == Topic.ITEM_UNCERTAIN and (item := items.get(event.item_id or 0)):
            span_event("stopdesk.item_uncertain", _trace_facts(item))
    return notifications_write(rows)


def notifications_write(rows: Iterable[Notification]) -> list[int]:
    """Insert outbox rows (a repeated dedupe key is skipped) and queue their delivery after commit."""
    rows = list(rows)
    if not rows:
        return []
    with transaction.atomic(savepoint=False):  # part of the caller's transaction (its event's)
        digests_attach(rows)
        Notification.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
        keys = [r.dedupe_key for r in rows]
        # ignore_conflicts leaves pks unset; read back this transaction's rows by key.
        ids = list(
            Notification.objects.filter(dedupe_key__in=keys, expanded_at__isnull=True).values_list("id", flat=True)
        )
        if ids:
            transaction.on_commit(lambda: _enqueue(ids))
    return ids


def _enqueue(ids: list[int]) -> None:
    """By task name, the one call of notify's own task from the outbox: tasks sit above what they
    call in the stack, so this cannot be an import. A burst (a set-based move) is split into
    small jobs so that every worker process takes a share. A lost enqueue (broker down) is not
    lost work: the beat sweep finds notifications without deliveries."""
    chunks = [ids[n : n + JOB_CHUNK] for n in range(0, len(ids), JOB_CHUNK)]
    try:
        if app.conf.task_always_eager:
            app.loader.import_default_modules()
            for chunk in chunks:
                app.tasks[DELIVER_TASK].apply(args=[chunk])
            return
        with app.producer_or_acquire() as producer:
            for chunk in chunks:
                app.send_task(DELIVER_TASK, args=[chunk], producer=producer)
    except Exception:
        log.exception("queueing delivery of notifications %s failed; the sweep will pick them up", ids[:10])


def _trace_facts(item: dict[str, Any]) -> dict[str, Any]:
    """The uncertain item as a tool call (GenAI conventions) with its deadline."""
    return {
        "stopdesk.item.id": item["id"],
        "stopdesk.task.id": item["task_id"],
        "stopdesk.investigate_by": item["investigate_by"].isoformat() if item["investigate_by"] else None,
        "gen_ai.tool.name": item["label"] or item["noun"],
        "gen_ai.tool.call.id": item["handle"] or item["idempotency_key"] or None,
    }


def item_words(item: dict[str, Any] | None) -> str:
    if not item:
        return "An item"
    name = item["label"] or f"{item['noun']} #{item['id']}"
    return f"{name} ({item['mechanism']})"


def _notification(event: EventLike, topic: str, item: dict[str, Any] | None) -> Notification:
    task_id = event.task_id or (item["task_id"] if item else None)
    what = item_words(item)
    deadline = item["investigate_by"] if item else None
    data: dict[str, Any] = {"event_kind": event.kind, "task_id": task_id, "item_id": event.item_id}
    if topic == Topic.ITEM_UNCERTAIN:
        when = f"; investigate by {deadline:%Y-%m-%d %H:%M} UTC" if deadline else ""
        title = f"{what} is uncertain{when}"
        data["investigate_by"] = deadline.isoformat() if deadline else None
    elif topic == Topic.LATE_RESULT:
        title = f"{what}: a late result contradicts the recorded outcome"
    else:
        compensation = event.data.get("compensation")
        record = event.data.get("record", "")
        data.update(compensation_id=compensation, record=record)
        verb = {
            Topic.COMPENSATION_PROPOSED: "waits for approval",
            Topic.COMPENSATION_ESCALATED: "was escalated",
            Topic.COMPENSATION_FAILED: "failed",
        }[Topic(topic)]
        title = f"Compensation #{compensation} of {record} {verb}"
    # An event row has an id; a set-based move's events do not, and an item becomes uncertain once.
    key = f"event:{event.pk}" if event.pk is not None else f"{topic}:item:{event.item_id}"
    return Notification(
        topic=topic,
        dedupe_key=key,
        event_id=event.pk,
        task_id=task_id,
        item_id=event.item_id,
        title=title[:300],
        body=notification_body(title, task_id),
        data=data,
        created_at=timezone.now(),
    )


def notification_body(title: str, task_id: int | None) -> str:
    base = str(settings.STOPDESK_NOTIFY["BASE_URL"]).rstrip("/")
    where = f"Task: {base}/tasks/{task_id}/" if task_id else ""
    return "\n".join(line for line in (title + ".", where, f"Review queue: {base}/queue/") if line)
