"""Agent code the drills run: a Celery job with steps, each step an external action of its own
that passes the boundary (`http_submit`). Imported by the drill runner, and by real workers in the
fault tests (`celery worker -I stopdrill.drills.agent`)."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

from reconcile.mechanisms.http.agent import http_submit
from stopdesk.agent.workers import LedgerTask, StopRequested
from stopdesk.models import WorkItem
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.sandbox import configure_system


def crm_declaration(base: str, system: str = "crm") -> dict[str, Any]:
    """An item's http declaration names its system; where the system is (`base`) is configuration,
    written by `configure_system` in the process that reconciles."""
    configure_system(system, like="crm", base_url=base)
    return {"system": system, "effect": "created"}


def outbox_declaration(base: str, system: str = "outbox") -> dict[str, Any]:
    configure_system(system, like="outbox", base_url=base)
    return {"system": system, "effect": "sent"}


def crm_step(*, parent_id: int, task_id: int, crm_url: str, key: str, actor: str, system: str = "crm") -> None:
    """One external action as its own child item: registered, then through the boundary."""

    decl = crm_declaration(crm_url, system)
    sub = item_register(
        task=task_id,
        parent=parent_id,
        kind=Kind.EXTERNAL_OPERATION,
        noun="record",
        actor=actor,
        mechanism="http",
        detail={"http": decl},
    )
    http_submit(
        item_id=sub.pk, actor=actor, idempotency_key=key, url=crm_url + "/records", json={"name": key}, declaration=decl
    )


@shared_task(base=LedgerTask, bind=True, name="stopdrill.drills.steps")
def drill_steps(  # type: ignore[no-untyped-def]
    self, crm_url: str, steps: int, step_s: float, slow_s: float = 0.0, system: str = "crm", *, item_id: int
) -> str:

    task_id = WorkItem.objects.values_list("task_id", flat=True).get(pk=item_id)
    for n in range(steps):
        self.raise_if_stopped()
        if n == 0 and slow_s:
            time.sleep(slow_s)  # a step that never looks at the ledger: slower than every timeout
        try:
            crm_step(
                parent_id=item_id,
                task_id=task_id,
                crm_url=crm_url,
                key=f"drill-{item_id}-{n}",
                actor=f"celery:{self.name}",
                system=system,
            )
        except TaskStopped as exc:
            raise StopRequested() from exc
        time.sleep(step_s)
    return "done"
