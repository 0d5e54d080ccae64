"""Cancelling one in-flight item through its mechanism.

Until a mechanism has an adapter that can cancel and read back, the `manual` rule applies: the
item crossed the boundary, nobody can prove what it did, so it waits for reconciliation.
"""

from __future__ import annotations

from django.utils import timezone

from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import item_transition
from stopdesk.states import ItemState

S = ItemState


def item_cancel(*, item_id: int, actor: str = "system:canceller") -> WorkItem:
    item = WorkItem.objects.get(pk=item_id)
    if item.state != S.RUNNING:
        return item  # settled already, or waiting for reconciliation: nothing to send
    attempt = CancellationAttempt.objects.create(item=item, mechanism=item.mechanism, action="cancel")
    try:
        item = item_transition(
            item_id=item_id,
            to_state=S.AWAITING_RECONCILIATION,
            actor=actor,
            message="No cancel route for this mechanism; its result must be reconciled.",
            allowed_from=frozenset({S.RUNNING}),
        )
    except IllegalTransition:
        item.refresh_from_db()
    CancellationAttempt.objects.filter(pk=attempt.pk).update(
        answered_at=timezone.now(), ok=False, observed_status="not cancellable", detail={"mechanism": item.mechanism}
    )
    return item
