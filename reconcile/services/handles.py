"""Recording the correlation id of work that was just started elsewhere, before anything else."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction

from reconcile.mechanisms.base import RecordFact
from stopdesk.models import ExternalRecord, WorkItem
from stopdesk.services.items import detail_declarable, item_attach_record, item_note_evidence, item_set_handle


def item_record_handle(*, item_id: int, handle: str, actor: str, detail: dict[str, Any] | None = None) -> WorkItem:
    """Store the remote id (response id, task id...) and mechanism facts on the item, with an event
    (the runtime API's rules: see `item_set_handle`)."""
    return item_set_handle(item_id=item_id, handle=handle, actor=actor, detail=detail)


def item_record_detail(*, item_id: int, detail: dict[str, Any]) -> None:
    """Merge mechanism facts (server, tool annotations, protocol version...) into the item."""
    detail_declarable(detail)
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        item.detail = {**item.detail, **detail}
        item.save(update_fields=["detail"])


def item_attach_fact(*, item_id: int, fact: RecordFact, actor: str) -> ExternalRecord:
    """Attach an external record as an adapter observed it (the fact's fields are the ledger's)."""
    return item_attach_record(item_id=item_id, actor=actor, **dataclasses.asdict(fact))


def item_add_evidence(*, item_id: int, evidence: dict[str, Any], actor: str, message: str) -> None:
    """Add an observation to an item's evidence without changing its state (see `item_note_evidence`)."""
    item_note_evidence(item_id=item_id, evidence=evidence, actor=actor, message=message)


def item_state_of(*, item_id: int) -> str:
    return str(WorkItem.objects.values_list("state", flat=True).get(pk=item_id))
