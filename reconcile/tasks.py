"""Celery jobs of the reconcile app: ids in, one service call."""

from celery import shared_task

from reconcile import tasks_compensation  # noqa: F401  (autodiscovery imports only this module)
from reconcile.services.cancel import item_cancel, items_cancel
from reconcile.services.reconcile import sweep_once
from reconcile.services.webhooks import item_wake
from stopdesk.celery import app
from stopdesk.models import WorkItem
from stopdesk.notify.heartbeat import heartbeat_record

# One job per item is the rule: a job is then as small as the work, and one item's trouble (a
# hanging endpoint, a crashed worker) delays only that item. Past this many in-flight items of one
# mechanism, the per-item jobs cost ten round trips each and tie up workers for the whole stop, so
# they go in chunks to the batched canceller, which records them set-based. A chunk is kept small
# enough that all its calls could time out within the job's time limit (with the mechanisms'
# defaults, 32 in flight and 10 s a call: 8 rounds of cancel + read-back, under 3 minutes).
BATCH_ABOVE = 50
BATCH_CHUNK = 250


@shared_task(name="reconcile.cancel_item", time_limit=120, soft_time_limit=110)
def cancel_item(item_id: int) -> str:
    return item_cancel(item_id=item_id).state


# Stop sends this instead of one cancel_item per item only for many items of one mechanism, in
# chunks small enough that every round of calls could run into its timeout within the limit.
@shared_task(name="reconcile.cancel_items", time_limit=600, soft_time_limit=580)
def cancel_items(item_ids: list[int], mechanism: str) -> int:
    return len(items_cancel(item_ids=item_ids, mechanism=mechanism))


# A provider's webhook asked for this item's read-back (reconcile/services/webhooks.py).
@shared_task(name="reconcile.wake_item", time_limit=60, soft_time_limit=50)
def wake_item(item_id: int) -> str:
    return item_wake(item_id=item_id).state


def wakes_dispatch(item_ids: list[int]) -> None:
    """Queue one read-back per item a webhook woke (run inline when Celery runs eagerly)."""
    for item_id in item_ids:
        if app.conf.task_always_eager:
            wake_item.apply(args=[item_id])
        else:
            wake_item.apply_async(args=[item_id])


@shared_task(name="reconcile.sweep", time_limit=300, soft_time_limit=280)
def sweep() -> dict[str, int]:
    report = sweep_once()
    heartbeat_record("reconcile_sweep", detail={"claimed": report.claimed, "errors": report.errors})
    return {"claimed": report.claimed, "errors": report.errors, "flagged_overdue": report.flagged_overdue}


def cancellations_dispatch(item_ids: list[int]) -> None:
    """The ledger's `cancellations_dispatch` port (registered in ReconcileConfig.ready): queue one
    cancellation job per item, or chunks for many items of one mechanism."""
    if not item_ids:
        return
    singles, chunks = list(item_ids), []
    if len(item_ids) > BATCH_ABOVE:
        by_mechanism: dict[str, list[int]] = {}
        for item_id, mechanism in WorkItem.objects.filter(pk__in=item_ids).values_list("pk", "mechanism"):
            by_mechanism.setdefault(mechanism, []).append(item_id)
        singles = []
        for mechanism, ids in sorted(by_mechanism.items()):
            if len(ids) <= BATCH_ABOVE:
                singles += ids
                continue
            ids.sort()
            chunks += [(ids[n : n + BATCH_CHUNK], mechanism) for n in range(0, len(ids), BATCH_CHUNK)]
    if app.conf.task_always_eager:
        for item_id in singles:
            cancel_item.apply(args=[item_id])
        for chunk, mechanism in chunks:
            cancel_items.apply(args=[chunk, mechanism])
        return
    with app.producer_or_acquire() as producer:
        for item_id in singles:
            cancel_item.apply_async(args=[item_id], producer=producer)
        for chunk, mechanism in chunks:
            cancel_items.apply_async(args=[chunk, mechanism], producer=producer)
