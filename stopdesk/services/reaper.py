"""Restart safety: running items whose lease ran out are presumed lost and go to reconciliation.
Nothing here depends on any process's memory; the database says what is outstanding."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from stopdesk.models import ApiIdempotency, WorkItem
from stopdesk.services.transitions import NOW, items_move
from stopdesk.states import ItemState

S = ItemState
# Items moved per run: the job runs every 30 seconds, so a backlog drains in bounded steps.
REAP_BATCH = 1000


def items_reap_stale(*, actor: str = "system:reaper", worker: str = "", limit: int = REAP_BATCH) -> int:
    """Move running items with an expired lease to awaiting_reconciliation, at most `limit`,
    the longest expired first. With `worker`, also every item that worker had claimed: a worker
    that is starting cannot still be running them. Only running items are read (a partial index
    on the lease), never settled history."""
    stale = Q(lease_until__lt=timezone.now()) | Q(lease_until__isnull=True)
    if worker:
        stale |= Q(worker=worker)
    batch = WorkItem.objects.filter(stale, state=S.RUNNING).order_by("lease_until", "id").values("id")[:limit]
    return items_move(  # type: ignore[return-value]
        where=Q(pk__in=batch),
        from_states=(S.RUNNING,),
        to_state=S.AWAITING_RECONCILIATION,
        actor=actor,
        kind="lease_expired",
        message="No heartbeat within the lease; the worker is presumed lost.",
        sets={"next_check_at": NOW},
    )


def api_replays_purge(*, older_than_days: int = 7) -> int:
    """Stored first answers for Idempotency-Key replays are kept a week: long enough for any
    client's retries, not forever. Set-based, so one statement whatever the count."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted, _ = ApiIdempotency.objects.filter(created_at__lt=cutoff).delete()
    return deleted
