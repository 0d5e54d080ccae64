"""Cancelling one in-flight item through its mechanism: the job Stop dispatches per item."""

from __future__ import annotations

from reconcile.services.reconcile import Result, item_reconcile


def item_cancel(*, item_id: int, actor: str = "system:canceller") -> Result:
    """Send the mechanism's cancel (once) and read back; the engine decides what follows. If a
    sweep already holds the item, this does nothing: the sweep will do the same work."""
    return item_reconcile(item_id=item_id, actor=actor)
