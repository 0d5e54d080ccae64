"""Celery jobs of notifications and heartbeats: ids in, one service call."""

from __future__ import annotations

from celery import shared_task

from stopdesk.notify.delivery import deliveries_due, notifications_deliver
from stopdesk.notify.digest import digests_send
from stopdesk.notify.heartbeat import WORKER, heartbeat_record
from stopdesk.notify.tally import metrics_tally
from stopdesk.notify.timed import notifications_scan


@shared_task(name="notify.deliver", time_limit=300, soft_time_limit=290)
def deliver(notification_ids: list[int]) -> dict[str, int]:
    return notifications_deliver(notification_ids)


@shared_task(name="notify.sweep", time_limit=120, soft_time_limit=110)
def sweep() -> int:
    """Time-based notifications and digests, then anything whose job was lost or whose retry is due."""
    notifications_scan()
    digests_send()
    ids = deliveries_due()
    for n in range(0, len(ids), 20):
        deliver.delay(ids[n : n + 20])
    return len(ids)


@shared_task(name="notify.heartbeat", time_limit=30, soft_time_limit=25)
def heartbeat() -> None:
    heartbeat_record(WORKER)


@shared_task(name="notify.metrics_tally", time_limit=300, soft_time_limit=290)
def tally() -> None:
    metrics_tally()
