"""Cancelling in-flight items through their mechanisms: the job Stop dispatches per item, and a
batched canceller for many items in one process."""

from __future__ import annotations

import math
from datetime import datetime

from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.batch import items_reconcile_batch
from reconcile.services.reconcile import Result, claim_seconds, item_reconcile, items_claim


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
    concurrency, and record the results set-based. Items someone else holds are left to them.
    `now` fixes the clock for the claim and every decision (tests); by default each item is
    decided at the moment its answer came back."""
    cfg = mechanism_settings(mechanism)
    concurrency = concurrency or cfg.concurrency
    # The claim must outlast the whole batch, or a sweep could take an item whose calls are still
    # out: in the worst case every round of calls (cancel + read-back) runs into its timeout.
    rounds = math.ceil(len(item_ids) / concurrency)
    claimed = items_claim(item_ids=item_ids, now=now, hold_s=claim_seconds() + rounds * 2 * cfg.call_timeout_s)
    return items_reconcile_batch(item_ids=claimed, concurrency=concurrency, actor=actor, now=now)
