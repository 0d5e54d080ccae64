"""Celery jobs of the ledger: ids in, one service call."""

from celery import shared_task
from celery.signals import worker_ready
from django.core.cache import cache
from django.db import close_old_connections

from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.closing import tasks_close_idle
from stopdesk.services.partitions import event_partitions_ensure
from stopdesk.services.reaper import api_replays_purge, items_reap_stale
from stopdesk.services.stop import stops_resume_fanout
from stopdesk.services.transitions import tasks_settle_sweep


@shared_task(name="stopdesk.reap_stale_items", time_limit=60, soft_time_limit=55)
def reap_stale_items() -> int:
    return items_reap_stale()


@shared_task(name="stopdesk.resume_stop_fanouts", time_limit=120, soft_time_limit=110)
def resume_stop_fanouts() -> int:
    return len(stops_resume_fanout())


@shared_task(name="stopdesk.purge_api_replays", time_limit=300, soft_time_limit=290)
def purge_api_replays() -> int:
    return api_replays_purge()


@shared_task(name="stopdesk.ensure_event_partitions", time_limit=120, soft_time_limit=110)
def ensure_event_partitions() -> int:
    return len(event_partitions_ensure())


@shared_task(name="stopdesk.seal_audit_events", time_limit=120, soft_time_limit=110)
def seal_audit_events() -> int:
    # Bounded per run (the next run carries on); skipped while another sealer holds the lock.
    return audit_seal(max_batches=20) or 0


SETTLE_CURSOR = "stopdesk:settle_tasks:after"


@shared_task(name="stopdesk.settle_tasks", time_limit=120, soft_time_limit=110)
def settle_tasks() -> int:
    # A window of the unsettled tasks a run, carrying on where the last one stopped (the cache is
    # shared by the workers; losing the cursor only means starting again from the first task).
    settled, after = tasks_settle_sweep(after=cache.get(SETTLE_CURSOR, 0))
    cache.set(SETTLE_CURSOR, after, None)
    return len(settled)


@shared_task(name="stopdesk.close_idle_tasks", time_limit=120, soft_time_limit=110)
def close_idle_tasks() -> int:
    return len(tasks_close_idle())


@worker_ready.connect
def reap_on_worker_start(sender: object = None, **_: object) -> None:
    """A starting worker finds outstanding work from the database: anything it had claimed under
    the same node name before a restart, and anything whose lease ran out."""
    close_old_connections()
    hostname = getattr(sender, "hostname", "") or ""
    items_reap_stale(actor=f"system:worker-start:{hostname}", worker=hostname)
    stops_resume_fanout()
