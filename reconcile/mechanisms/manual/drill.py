"""The drill driver for manual work (the runtime reports its own result): the agent side as a drill drives it against the sandbox
(the variants and `expected` are described in `stopdrill.drills.drivers`)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import Task
from stopdesk.protocol.errors import StopRequested
from stopdesk.states import Kind
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import AGENT, Driver, _arrived, _sandbox, _task


class ManualDriver(Driver):
    mechanism = "manual"
    tool = "manual (runtime reports)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"completed"}),
        "after_acceptance": frozenset({"completed"}),
        "slow_child": frozenset({"uncertain", "completed"}),
        "disconnected_client": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"completed"}),
    }
    not_applicable = {"cancel_endpoint_down": "manual has no cancellation endpoint; it waits for a report"}

    def child(self, ctx: DrillContext, variant: str) -> Child:

        sandbox = _sandbox(ctx)
        outbox = sandbox.sandbox.outbox
        sd = LocalRuntime(actor=AGENT)
        info = sd.register(_task(ctx).pk, kind=Kind.EXTERNAL_OPERATION, noun="message", mechanism="manual")
        key = f"drill-{info.id}"
        delay = {"normal": 0.5, "disconnect": 0.4}.get(variant, 0.0)
        if delay:
            outbox.configure(accept_delay_s=delay)
            ctx.cleanups.append(lambda: outbox.configure(accept_delay_s=0.0))
        if variant == "disconnect":
            ctx.fault("runtime: hangs up mid-send and never reports")
        elif variant == "slow":
            ctx.fault("runtime: reports 3.5 s after the send (deadline 2 s)")
        task_id = info.task

        def run() -> Any:
            try:
                sd.submit(info.id, idempotency_key=key)
            except StopRequested:
                return "refused at the boundary"
            try:
                httpx.post(
                    sandbox.urls["outbox"] + "/messages",
                    json={"to": "drill@example.test", "subject": key},
                    headers={"Idempotency-Key": key},
                    timeout=0.1 if variant == "disconnect" else 5.0,
                )
            except httpx.HTTPError:
                return "gone"  # the runtime disappears: no report ever comes
            if variant == "accept":
                # Accepted; the report goes out only after the operator pressed Stop.
                deadline = time.monotonic() + 5
                while (
                    time.monotonic() < deadline
                    and not Task.objects.filter(pk=task_id, stop_requested_at__isnull=False).exists()
                ):
                    time.sleep(0.02)
            if variant == "slow":
                time.sleep(3.5)
            sd.finish(info.id, status="completed")
            return "reported"

        return ctx.add(Child(info.id, run, key=key))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return _arrived(ctx, key=child.key)

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        return _sandbox(ctx).sandbox.outbox.sent_count(child.key) > 0


DRIVER = ManualDriver
