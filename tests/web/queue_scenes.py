"""A bad day for the review queue, built through the services: uncertain items that share a task,
a system, a tool and the reason they are uncertain, as a runtime records them."""

from __future__ import annotations

import itertools

from stopdesk.models import Task, WorkItem
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState, Kind
from tests.factories import ACTOR, make_item, make_task

S = ItemState
_keys = itertools.count(1)


def unknown_call(
    task: Task,
    *,
    tool: str = "crm.create_record",
    system: str = "crm",
    reason: str = "The CRM answered 503 to every status lookup.",
) -> WorkItem:
    """One external operation whose outcome is unknown: it crossed the boundary, and the status
    lookup failed for the reason given."""
    n = next(_keys)
    item = make_item(
        task,
        state=S.RUNNING,
        noun="record",
        kind=Kind.EXTERNAL_OPERATION,
        mechanism="http",
        idempotency_key=f"{tool}-{n:05d}",
        detail={"tool": {"framework": "demo", "name": tool, "arguments": {"n": n}}, "http": {"system": system}},
    )
    return item_transition(item_id=item.pk, to_state=S.UNCERTAIN, actor=ACTOR, message=reason)


def bad_day(*, sizes: tuple[int, int, int] = (40, 35, 25)) -> list[list[WorkItem]]:
    """Three groups: refunds whose provider timed out, CRM records behind a 503, vendor updates
    the ERP did not confirm."""
    refunds = make_task("Refund March duplicates")
    vendors = make_task("Update vendor bank details")
    shapes = [
        (refunds, "payments.refund", "payments", "The payment provider timed out on every lookup."),
        (vendors, "crm.create_record", "crm", "The CRM answered 503 to every status lookup."),
        (vendors, "erp.update_vendor", "erp", "The ERP has no status lookup for vendor updates."),
    ]
    return [
        [unknown_call(task, tool=tool, system=system, reason=reason) for _ in range(size)]
        for (task, tool, system, reason), size in zip(shapes, sizes, strict=True)
    ]
