"""The drill driver for OpenAI background responses: the agent side as a drill drives it against the sandbox
(the variants and `expected` are described in `stopdrill.drills.drivers`)."""

from __future__ import annotations

from typing import Any

from reconcile.mechanisms.openai import sandbox as oa_faults
from reconcile.mechanisms.openai.agent import response_create
from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import AGENT, Driver, _sandbox, _task


class OpenAIDriver(Driver):
    mechanism = "openai"
    tool = "openai (background responses)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled"}),
        "after_acceptance": frozenset({"cancelled", "completed"}),
        "slow_child": frozenset({"uncertain"}),
        "disconnected_client": frozenset({"uncertain"}),
        "cancel_endpoint_down": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"cancelled"}),
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:

        sandbox = _sandbox(ctx)
        party = sandbox.sandbox.openai
        item = item_register(task=_task(ctx), kind=Kind.MODEL_REQUEST, noun="draft", actor=AGENT, mechanism="openai")
        if variant == "slow":
            party.arm(oa_faults.IGNORE_CANCEL)
            ctx.fault("openai: the run ignores cancel and outlives the deadline")
        elif variant == "disconnect":
            party.arm(oa_faults.CREATE_HANG)
            ctx.fault("openai: create is accepted but its answer never comes; the client gives up")
        elif variant == "accept":
            party.configure(run_s=0.05)
            ctx.cleanups.append(lambda: party.configure(run_s=30.0))

        def run() -> Any:
            return response_create(
                item_id=item.pk, actor=AGENT, base_url=sandbox.urls["openai"], model="gpt-drill", input="Draft a reply"
            ).id

        return ctx.add(Child(item.pk, run))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return bool(WorkItem.objects.filter(pk=child.item_id).exclude(handle="").exists())

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        party = _sandbox(ctx).sandbox.openai
        party.set_fault(oa_faults.HANG)
        ctx.fault("openai: cancel and retrieve hang for the whole deadline")
        ctx.cleanups.append(lambda: party.set_fault(oa_faults.HANG, enabled=False))


DRIVER = OpenAIDriver
