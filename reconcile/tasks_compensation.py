"""The compensation jobs: ids in, one service call. Imported by reconcile.tasks so Celery's
autodiscovery registers them."""

from celery import shared_task

from reconcile.services.compensation import compensation_execute, compensations_sweep


@shared_task(name="reconcile.execute_compensation", time_limit=120, soft_time_limit=110, acks_late=True)
def execute_compensation(compensation_id: int) -> str:
    return compensation_execute(compensation_id=compensation_id).state


@shared_task(name="reconcile.sweep_compensations", time_limit=120, soft_time_limit=110)
def sweep_compensations() -> dict[str, list[int]]:
    return compensations_sweep()
