"""The drill sandbox (four real loopback servers behind the arrival log), and a deliberately
unsafe mechanism: it submits to the CRM without passing the boundary, also after Stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db.models import Q

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import Capability, ItemRef, Mechanism, Observation, Seen
from stopdesk.models import Task
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import DRIVERS, Driver, register_driver
from stopdrill.drills.sandbox import DrillSandbox, start_drill_sandbox


@pytest.fixture(scope="module")
def drill_sandbox() -> Iterator[DrillSandbox]:
    sandbox = start_drill_sandbox()
    yield sandbox
    sandbox.stop()


class UnsafeMechanism(Mechanism):
    """Claims it can cancel and look up, and says every action completed."""

    name = "unsafe"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})

    def inspect(self, item: ItemRef) -> Observation:
        return Observation(Seen.COMPLETED, remote_status="trust me")


class UnsafeDriver(Driver):
    """Agent code that talks to the CRM directly: no item_submit, and one more create after Stop."""

    mechanism = "unsafe"
    expected = {
        "during_tool_call": frozenset({"cancelled", "completed"}),
        "before_dispatch": frozenset({"cancelled", "completed"}),
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:
        assert ctx.sandbox is not None and ctx.task is not None
        crm = ctx.sandbox.urls["crm"]
        task_id = ctx.task.pk
        key = f"unsafe-{task_id}"
        item = item_register(
            task=ctx.task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor="unsafe", mechanism="unsafe",
            idempotency_key=key,
        )  # fmt: skip

        def run() -> Any:
            httpx.post(crm + "/records", json={"name": "first"}, headers={"Idempotency-Key": key})
            for _ in range(250):  # until the operator pressed Stop
                if Task.objects.filter(Q(pk=task_id), stop_requested_at__isnull=False).exists():
                    break
                import time

                time.sleep(0.02)
            httpx.post(crm + "/records", json={"name": "after stop"}, headers={"Idempotency-Key": key + "-2"})

        return ctx.add(Child(item.pk, run, key=key))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        assert ctx.sandbox is not None
        return any(a.key == child.key for a in ctx.sandbox.log.arrivals(actions_only=True))


@pytest.fixture
def unsafe_mechanism() -> Iterator[str]:
    registry.register(UnsafeMechanism)
    register_driver(UnsafeDriver)
    yield "unsafe"
    registry.unregister("unsafe")
    DRIVERS.pop("unsafe", None)
    registry.reset()
