"""The drill driver for asyncio children under supervise(): the agent side as a drill drives it against the sandbox
(the variants and `expected` are described in `stopdrill.drills.drivers`)."""

from __future__ import annotations

from typing import Any

from reconcile.mechanisms.http import sandbox as crm_faults
from stopdesk.agent.aio import supervise
from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.agent import crm_declaration, outbox_declaration
from stopdrill.drills.core import Child, DrillContext, wait_until
from stopdrill.drills.drivers import AGENT, REVIEW, Driver, _arrived, _sandbox, _task


class AsyncioDriver(Driver):
    """One `supervise()` group per drill, run in a thread: a child that creates a CRM record
    (declares the HTTP lookup, passes the boundary with `child.submit(key)`, POSTs with httpx) and a
    child that only computes. Stop before dispatch, mid-call, right after the CRM accepted; a
    create slower than every timeout next to a cleanup that overruns; the agent's HTTP client
    timing out; the CRM's lookups down for the whole deadline."""

    mechanism = "asyncio"
    tool = "asyncio (supervise(): a CRM create, a computation)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"completed"}),
        "after_acceptance": frozenset({"completed"}),
        # The action lands after every timeout: found late (a late result for review), or unknown.
        "slow_child": frozenset({"uncertain", REVIEW, "completed"}),
        # The agent's client gave up on a create the CRM completes: the lookup finds it, or unknown.
        "disconnected_client": frozenset({"completed", "uncertain"}),
        "cancel_endpoint_down": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"completed"}),
    }
    CLEANUP_S = 0.5

    def child(self, ctx: DrillContext, variant: str) -> Child:
        import asyncio
        import threading

        sandbox = _sandbox(ctx)
        crm, outbox = sandbox.sandbox.crm, sandbox.sandbox.outbox
        use_outbox = variant == "slow"
        base = sandbox.urls["outbox" if use_outbox else "crm"]
        decl = (
            outbox_declaration(base, sandbox.system("outbox"))
            if use_outbox
            else crm_declaration(base, sandbox.system("crm"))
        )
        action = item_register(
            task=_task(ctx), kind=Kind.EXTERNAL_OPERATION, noun="message" if use_outbox else "record", actor=AGENT,
            mechanism="asyncio",
        )  # fmt: skip
        compute = item_register(task=_task(ctx), kind=Kind.LOCAL_WORKER, noun="sum", actor=AGENT, mechanism="asyncio")
        key = f"drill-{action.task_id}-{action.pk}"
        timeout = 5.0
        overrun = False
        steps = 20 if variant == "disconnect" else 400  # 0.02 s each
        if variant in ("normal", "disconnect"):
            crm.configure(latency_s=0.5 if variant == "normal" else 0.4)
            ctx.cleanups.append(lambda: crm.configure(latency_s=0.0))
            if variant == "disconnect":
                timeout = 0.1
                ctx.fault("asyncio child: its HTTP client times out 0.1 s into a create the CRM completes")
        elif variant == "accept":
            crm.set_fault(crm_faults.HANG_AFTER_COMMIT, target=key)
            ctx.fault("crm: the record is created but the answer never comes")
        elif variant == "down":
            crm.set_fault(crm_faults.HANG_AFTER_COMMIT, target=key)
            ctx.fault("crm: the record is created, the answer never comes, and every lookup answers 500")
        elif variant == "slow":
            outbox.configure(accept_delay_s=3.0)
            ctx.cleanups.append(lambda: outbox.configure(accept_delay_s=0.0))
            overrun = True
            ctx.fault("outbox: the asyncio child's send lands 3 s after it arrives, after every timeout")
            ctx.fault(
                f"asyncio child: its cleanup runs {self.CLEANUP_S + 2:g} s (the supervisor allows {self.CLEANUP_S:g} s)"
            )

            def landed() -> None:
                # Before the checker looks: the parked send commits 3 s after it arrived; seen
                # here, it is judged in this drill rather than leaking into the next one's sandbox.
                try:
                    wait_until(lambda: outbox.sent_count(key) > 0, timeout=6.0, interval=0.05)
                except TimeoutError:
                    ctx.notes.append("the outbox had not committed the slow send when the checker looked")

            ctx.cleanups.append(landed)
        ended = threading.Event()
        body_json: dict[str, Any] = {"to": "drill@example.test", "subject": key} if use_outbox else {"name": key}
        path = "/messages" if use_outbox else "/records"

        async def act(child: Any) -> Any:
            import httpx as ahttpx

            await child.declare({"http": decl})
            await child.submit(key)
            async with ahttpx.AsyncClient(timeout=timeout) as http:
                answer = await http.post(base + path, json=body_json, headers={"Idempotency-Key": key})
                answer.raise_for_status()
                return answer.json()

        async def work(child: Any) -> int:
            total = 0
            try:
                for n in range(steps):
                    total += n * n
                    await asyncio.sleep(0.02)
            finally:
                if overrun:
                    await asyncio.sleep(self.CLEANUP_S + 2)
            return total

        async def group() -> None:
            async with supervise(actor=AGENT, poll_s=0.05, cleanup_s=self.CLEANUP_S) as g:
                g.start(action.pk, act)
                g.start(compute.pk, work)

        def run() -> Any:
            try:
                asyncio.run(group())
            finally:
                ended.set()
            return "group ended"

        main = ctx.add(Child(action.pk, run, key=key, name=action.noun))
        compute_expect = frozenset({"uncertain"}) if overrun else frozenset({"cancelled"})
        if variant == "disconnect":
            compute_expect = frozenset({"completed", "cancelled"})  # it may finish before the Stop
        ctx.add(Child(compute.pk, lambda: ended.wait(20), expect=compute_expect, name="computation"))
        return main

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        started = WorkItem.objects.filter(pk__in=[c.item_id for c in ctx.children], started_at__isnull=False).count()
        return started == len(ctx.children) and _arrived(ctx, key=child.key)

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        return any(r["idempotency_key"] == child.key for r in _sandbox(ctx).sandbox.crm.records())

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        crm = _sandbox(ctx).sandbox.crm
        wait_until(lambda: self.accepted(ctx, child))
        crm.set_fault(crm_faults.READ_500)
        ctx.cleanups.append(lambda: crm.set_fault(crm_faults.READ_500, enabled=False))


DRIVER = AsyncioDriver
