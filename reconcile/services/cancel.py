"""Cancelling in-flight items through their mechanisms: the job Stop dispatches per item, and a
batched canceller for many items in one process."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.utils import timezone

from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.batch import items_reconcile_batch
from reconcile.services.lease import ClaimLease, lease_seconds
from reconcile.services.reconcile import Result, item_reconcile, items_claim, items_due

log = logging.getLogger(__name__)

# How often, and after how long a pause, a batch tries again for rows a writer held at its claim
# (writers hold an item's row for one short transaction).
LOCKED_RETRIES = 5
LOCKED_PAUSE_S = 0.1


def item_cancel(*, item_id: int, actor: str = "system:canceller", now: datetime | None = None) -> Result:
    """Send the mechanism's cancel (once) and read back; the engine decides what follows. If a
    sweep already holds the item, this does nothing: the sweep will do the same work. `now` fixes
    the clock the claim and the decision use (tests); by default it is the moment of the call."""
    return item_reconcile(item_id=item_id, actor=actor, now=now)


def items_cancel(
    *,
    item_ids: list[int],
    mechanism: str,
    actor: str = "system:canceller",
    concurrency: int | None = None,
    now: datetime | None = None,
) -> list[Result]:
    """Claim the items in one statement, cancel and read back with the mechanism's configured
    concurrency, and record the results set-based. Items someone else has claimed are left to them;
    items whose rows a writer held at the claim are claimed again once it is done. `now` fixes the
    clock for the claim and every decision (tests); by default each item is decided at the moment
    its answer came back."""
    cfg = mechanism_settings(mechanism)
    concurrency = concurrency or cfg.concurrency
    results: list[Result] = []
    left = list(item_ids)
    for attempt in range(1 + LOCKED_RETRIES):
        # The claim must outlast the batch, or a sweep could take an item whose calls are still
        # out; but if this process dies, its items must not wait for the longest a batch could
        # take (every round of calls running into its timeout: minutes). So it holds one short
        # lease, renewed while the batch works, and each slice's items leave the lease once
        # their answers are recorded.
        at = now or timezone.now()
        until = at + timedelta(seconds=lease_seconds())
        claimed = items_claim(item_ids=left, now=at, hold_s=lease_seconds())
        if claimed:
            with ClaimLease(item_ids=claimed, now=at, until=until) as lease:
                results += items_reconcile_batch(
                    item_ids=claimed, concurrency=concurrency, actor=actor, now=now, release=lease.release
                )
        # The claim skips a row another transaction holds (a worker writing the item, another
        # claim in progress) rather than wait for it. Nobody took such an item: it is still due.
        # Its cancel is this job's, so it is claimed again once the writer is done (a claim that
        # did win it in the meantime has made it not due).
        left = items_due(item_ids=sorted(set(left) - set(claimed)), now=now)
        if not left:
            break
        if not claimed:
            time.sleep(LOCKED_PAUSE_S * (attempt + 1))
    if left:
        # Still held after every try: the rows stay due, so the reconcile sweep takes them.
        log.warning("%d item(s) held by other writers throughout; left to the sweep", len(left))
    return results
