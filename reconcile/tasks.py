"""Celery jobs of the reconcile app: ids in, one service call."""

from celery import shared_task

from reconcile import tasks_compensation  # noqa: F401  (autodiscovery imports only this module)
from reconcile.services.cancel import item_cancel, items_cancel
from reconcile.services.reconcile import sweep_once
from stopdesk.notify.heartbeat import heartbeat_record


@shared_task(name="reconcile.cancel_item", time_limit=120, soft_time_limit=110)
def cancel_item(item_id: int) -> str:
    return item_cancel(item_id=item_id).state


# Stop sends this instead of one cancel_item per item only for many items of one mechanism, in
# chunks small enough that every round of calls could run into its timeout within the limit.
@shared_task(name="reconcile.cancel_items", time_limit=600, soft_time_limit=580)
def cancel_items(item_ids: list[int], mechanism: str) -> int:
    return len(items_cancel(item_ids=item_ids, mechanism=mechanism))


@shared_task(name="reconcile.sweep", time_limit=300, soft_time_limit=280)
def sweep() -> dict[str, int]:
    report = sweep_once()
    heartbeat_record("reconcile_sweep", detail={"claimed": report.claimed, "errors": report.errors})
    return {"claimed": report.claimed, "errors": report.errors, "flagged_overdue": report.flagged_overdue}
