"""Celery jobs of the reconcile app: ids in, one service call."""

from celery import shared_task

from reconcile import tasks_compensation  # noqa: F401  (autodiscovery imports only this module)
from reconcile.services.cancel import item_cancel
from reconcile.services.reconcile import sweep_once


@shared_task(name="reconcile.cancel_item", time_limit=120, soft_time_limit=110)
def cancel_item(item_id: int) -> str:
    return item_cancel(item_id=item_id).state


@shared_task(name="reconcile.sweep", time_limit=300, soft_time_limit=280)
def sweep() -> dict[str, int]:
    report = sweep_once()
    return {"claimed": report.claimed, "errors": report.errors, "flagged_overdue": report.flagged_overdue}
