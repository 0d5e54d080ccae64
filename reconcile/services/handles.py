"""Recording the correlation id of work that was just started elsewhere, before anything else."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from stopdesk.models import WorkItem
from stopdesk.services.events import event_record


def item_record_handle(*, item_id: int, handle: str, actor: str, detail: dict[str, Any] | None = None) -> WorkItem:
    """Store the remote id (response id, task id...) and mechanism facts on the item, with an event."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        item.handle = handle
        if detail:
            item.detail = {**item.detail, **detail}
        item.save(update_fields=["handle", "detail"])
        event_record(kind="handle_recorded", actor=actor, item=item, message=handle, data={"detail": detail or {}})
    return item


def item_record_detail(*, item_id: int, detail: dict[str, Any]) -> None:
    """Merge mechanism facts (server, tool annotations, protocol version...) into the item."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        item.detail = {**item.detail, **detail}
        item.save(update_fields=["detail"])
