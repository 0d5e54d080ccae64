"""The drill driver for generic HTTP operations (the CRM): the agent side as a drill drives it against the sandbox
(the variants and `expected` are described in `stopdrill.drills.drivers`)."""

from __future__ import annotations

from typing import Any

from reconcile.mechanisms.http import sandbox as crm_faults
from reconcile.mechanisms.http.agent import http_submit
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.agent import crm_declaration, outbox_declaration
from stopdrill.drills.core import Child, DrillContext
from stopdrill.drills.drivers import AGENT, REVIEW, Driver, _arrived, _sandbox, _task, wait_done


class HttpDriver(Driver):
    mechanism = "http"
    tool = "http (crm, outbox)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"completed"}),
        "after_acceptance": frozenset({"completed"}),
        "slow_child": frozenset({REVIEW, "completed", "uncertain"}),
        "disconnected_client": frozenset({"completed"}),
        "cancel_endpoint_down": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"completed"}),
    }

    def child(self, ctx: DrillContext, variant: str) -> Child:

        sandbox = _sandbox(ctx)
        crm, outbox = sandbox.sandbox.crm, sandbox.sandbox.outbox
        use_crm = variant in ("accept", "down")
        base = sandbox.urls["crm" if use_crm else "outbox"]
        decl = (
            crm_declaration(base, sandbox.system("crm"))
            if use_crm
            else outbox_declaration(base, sandbox.system("outbox"))
        )
        item = item_register(
            task=_task(ctx),
            kind=Kind.EXTERNAL_OPERATION,
            noun="record" if use_crm else "message",
            actor=AGENT,
            mechanism="http",
            detail={"http": decl},
        )
        key = f"drill-{item.task_id}-{item.pk}"
        timeout: float | None = None
        if variant == "accept":
            crm.set_fault(crm_faults.HANG_AFTER_COMMIT, target=key)
            ctx.fault("crm: the record is created but the answer never comes")
        elif variant == "down":
            crm.set_fault(crm_faults.FAIL_500_AFTER_COMMIT, target=key)
            ctx.fault("crm: the create lands, then answers 500")
        elif variant == "slow":
            outbox.configure(accept_delay_s=2.0)
            ctx.cleanups.append(lambda: outbox.configure(accept_delay_s=0.0))
            ctx.fault("outbox: the send lands 2 s after it arrives, after the call timeout and the deadline")
        elif variant == "disconnect":
            outbox.configure(accept_delay_s=0.4)
            ctx.cleanups.append(lambda: outbox.configure(accept_delay_s=0.0))
            timeout = 0.1
            ctx.fault("client: hangs up 0.1 s into a send the outbox completes anyway")
        else:
            outbox.configure(accept_delay_s=0.5)
            ctx.cleanups.append(lambda: outbox.configure(accept_delay_s=0.0))

        body: dict[str, Any] = {"name": key} if use_crm else {"to": "drill@example.test", "subject": key}

        def run() -> Any:
            return http_submit(
                item_id=item.pk,
                actor=AGENT,
                idempotency_key=key,
                url=base + ("/records" if use_crm else "/messages"),
                json=body,
                declaration=decl,
                timeout_s=timeout,
            )

        return ctx.add(Child(item.pk, run, key=key))

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return _arrived(ctx, key=child.key)

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        return any(r["idempotency_key"] == child.key for r in _sandbox(ctx).sandbox.crm.records())

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        crm = _sandbox(ctx).sandbox.crm
        wait_done(child)
        crm.set_fault(crm_faults.READ_500)
        ctx.fault("crm: every lookup answers 500 for the whole deadline")
        ctx.cleanups.append(lambda: crm.set_fault(crm_faults.READ_500, enabled=False))


DRIVER = HttpDriver
