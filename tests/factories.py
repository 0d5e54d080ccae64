"""Ledger factories with one trait per state. They go through the services, never around them."""

from __future__ import annotations

import itertools
from typing import Any

from django.db.models import QuerySet

from stopdesk.models import Task, WorkItem
from stopdesk.services.items import item_attach_record, item_finish, item_register, task_create
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState, Kind

ACTOR = "test:factory"
_keys = itertools.count(1)


def make_task(title: str = "Analyse invoices") -> Task:
    return task_create(title=title, actor=ACTOR)


def make_item(
    task: Task,
    *,
    state: str = ItemState.QUEUED,
    noun: str = "draft",
    kind: str = Kind.MODEL_REQUEST,
    mechanism: str = "manual",
    **extra,
) -> WorkItem:  # type: ignore[no-untyped-def]
    item = item_register(task=task, kind=kind, noun=noun, actor=ACTOR, mechanism=mechanism, **extra)
    if state == ItemState.QUEUED:
        return item
    item_start(item_id=item.pk, actor=ACTOR)
    if state == ItemState.COMPLETED:
        item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    elif state == ItemState.FAILED:
        item_finish(item_id=item.pk, succeeded=False, actor=ACTOR, outcome="boom")
    elif state in (ItemState.AWAITING_RECONCILIATION, ItemState.UNCERTAIN, ItemState.CANCELLED):
        item_transition(item_id=item.pk, to_state=state, actor=ACTOR)
    item.refresh_from_db()
    return item


def set_state_by_hand(rows: QuerySet[Any], state: str, **fields: Any) -> int:
    """Put rows in a state as no writer would (no event, no check of the move): for a test that
    needs the aftermath of a lost step. The suite's state guard lets this one helper through."""
    return rows.update(state=state, **fields)


def make_external_effect(
    task: Task,
    *,
    noun: str = "record",
    system: str = "crm",
    effect: str = "created",
    reversible: bool = True,
    version: str = "1",
) -> WorkItem:
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun=noun, actor=ACTOR, mechanism="http")
    key = f"key-{next(_keys)}"
    item_submit(item_id=item.pk, idempotency_key=key, actor=ACTOR)
    item_attach_record(
        item_id=item.pk,
        system=system,
        record_id=f"{system}-{key}",
        effect=effect,
        actor=ACTOR,
        version=version,
        reversible=reversible,
        reversal="archive" if reversible else "",
    )
    item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    item.refresh_from_db()
    return item
