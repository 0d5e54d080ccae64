"""The compensation job: an id in, one service call. Imported by reconcile.tasks so Celery's
autodiscovery registers it."""

from celery import shared_task

from reconcile.services.compensation import compensation_execute


@shared_task(name="reconcile.execute_compensation", time_limit=120, soft_time_limit=110, acks_late=True)
def execute_compensation(compensation_id: int) -> str:
    return compensation_execute(compensation_id=compensation_id).state
