"""The drill driver for Celery workers (the job body runs in this process, in a thread): the agent
side as a drill drives it against the sandbox (variants and `expected`: `stopdrill.drills.drivers`)."""

from __future__ import annotations

import uuid
from typing import Any

from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.transitions import item_start
from stopdesk.states import Kind
from stopdrill.drills.agent import drill_steps
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import AGENT, Driver, _sandbox, _task


class CeleryDriver(Driver):
    mechanism = "celery"
    tool = "celery (LedgerTask jobs)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled"}),
        "after_acceptance": frozenset({"cancelled"}),
        "slow_child": frozenset({"uncertain", "cancelled"}),
        "disconnected_client": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"cancelled"}),
    }
    not_applicable = {
        "cancel_endpoint_down": "Celery's cancel route is the ledger flag the job reads; it is down only with "
        "the database (tests/faults drops PostgreSQL connections and restarts Redis during a stop)",
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:

        sandbox = _sandbox(ctx)
        handle = str(uuid.uuid4())
        item = item_register(
            task=_task(ctx), kind=Kind.LOCAL_WORKER, noun="job", actor=AGENT, mechanism="celery", handle=handle
        )
        if variant == "disconnect":
            ctx.fault("worker: claims the job, then vanishes without a heartbeat or a report")

            def vanish() -> Any:
                item_start(item_id=item.pk, actor=AGENT, worker="drill-vanished", lease_seconds=1)

            return ctx.add(Child(item.pk, vanish))
        slow_s = 0.0
        if variant == "slow":
            slow_s = 3.5
            ctx.fault("worker: one step runs 3.5 s without looking at the ledger (deadline 2 s)")

        def run() -> Any:
            result = drill_steps.apply(
                args=[sandbox.urls["crm"], 20, 0.15, slow_s, sandbox.system("crm")],
                kwargs={"item_id": item.pk},
                task_id=handle,
            )
            if result.failed():
                raise RuntimeError(f"job raised {result.result!r}")
            return result.result

        return ctx.add(Child(item.pk, run))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        item = WorkItem.objects.filter(pk=child.item_id).values("state", "started_at").first()
        return bool(item and item["started_at"])

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        prefix = f"drill-{child.item_id}-"
        return any((r["idempotency_key"] or "").startswith(prefix) for r in _sandbox(ctx).sandbox.crm.records())


DRIVER = CeleryDriver
