from celery import shared_task

from reconcile.services.cancel import item_cancel


@shared_task(name="reconcile.cancel_item", time_limit=120, soft_time_limit=110)
def cancel_item(item_id: int) -> str:
    return item_cancel(item_id=item_id).state
