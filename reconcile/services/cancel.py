"""Cancelling in-flight items through their mechanisms: the job Stop dispatches per item, and a
concurrent canceller for many items in one process."""

from __future__ import annotations

from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.reconcile import Result, item_reconcile, items_claim, items_reconcile_many


def item_cancel(*, item_id: int, actor: str = "system:canceller") -> Result:
    """Send the mechanism's cancel (once) and read back; the engine decides what follows. If a
    sweep already holds the item, this does nothing: the sweep will do the same work."""
    return item_reconcile(item_id=item_id, actor=actor)


def items_cancel(
    *, item_ids: list[int], mechanism: str, actor: str = "system:canceller", concurrency: int | None = None
) -> list[Result]:
    """Claim the items in one statement, then cancel and read back with the mechanism's configured
    concurrency. Items someone else holds are left to them."""
    claimed = items_claim(item_ids=item_ids)
    return items_reconcile_many(
        item_ids=claimed,
        concurrency=concurrency or mechanism_settings(mechanism).concurrency,
        actor=actor,
        claimed=True,
    )
