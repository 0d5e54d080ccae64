"""The toy's drill driver."""

from __future__ import annotations

import uuid
from typing import Any

from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import AGENT, Driver, _arrived, _sandbox, _task
from tests.mechanisms.toy.agent import toy_run


class ToyDriver(Driver):
    mechanism = "toy"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled"}),
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:
        base_url = _sandbox(ctx).urls["toy"]
        key = f"toy-{uuid.uuid4().hex[:8]}"
        item = item_register(task=_task(ctx), kind=Kind.EXTERNAL_OPERATION, noun="job", actor=AGENT, mechanism="toy")

        def run() -> Any:
            return toy_run(item_id=item.pk, key=key, base_url=base_url, actor=AGENT)

        return ctx.add(Child(item.pk, run, key=key))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return _arrived(ctx, key=child.key)


DRIVER = ToyDriver
