"""The agent side of each mechanism, as a drill drives it against the sandbox.

A driver registers a child the way an agent runtime would and returns the code that dispatches
it (run in a thread by the drill). Variants shape the child for a drill:

- "normal": an action that takes a moment at the external system (Stop lands during it);
- "accept": the external system accepts the action, and the caller has not heard back yet;
- "slow": slower than every timeout the mechanism has;
- "disconnect": the agent's client gives up on the call and disappears;
- "down": a child whose cancellation/lookup route will be down for the whole deadline.

`expected` says, per drill, which final states of the child are a correct outcome; a drill that
does not apply to a mechanism says why instead.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar

import httpx

from reconcile.drills.agent import crm_declaration, outbox_declaration
from reconcile.drills.core import Child, DrillContext
from reconcile.sandbox import crm as crm_faults
from reconcile.sandbox import openai_standin as oa_faults
from stopdesk.models import Task, WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind

AGENT = "drill:agent"
REVIEW = "cancelled, review"  # recorded cancelled, then a late result flagged it for review


class Driver:
    mechanism: ClassVar[str]
    tool: ClassVar[str] = ""  # what the table calls it, e.g. "http (crm, outbox)"
    expected: ClassVar[dict[str, frozenset[str]]] = {}
    not_applicable: ClassVar[dict[str, str]] = {}

    def child(self, ctx: DrillContext, variant: str) -> Child:
        raise NotImplementedError

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        """The action has reached the external system (or the child is running)."""
        raise NotImplementedError

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        return self.in_call(ctx, child)

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        raise NotImplementedError

    @property
    def label(self) -> str:
        return self.tool or self.mechanism


def _sandbox(ctx: DrillContext) -> Any:
    assert ctx.sandbox is not None, "this driver needs the sandbox"
    return ctx.sandbox


def _task(ctx: DrillContext) -> Task:
    assert ctx.task is not None
    return ctx.task


def _arrived(ctx: DrillContext, *, key: str = "", item: int | None = None) -> bool:
    return any(
        (key and a.key == key) or (item is not None and a.item == str(item))
        for a in _sandbox(ctx).log.arrivals(actions_only=True)
    )


# --- OpenAI background responses -------------------------------------------------------------


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
        from reconcile.mechanisms.openai import response_create

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


# --- generic HTTP operations: the CRM (reversible) and the mail outbox (irreversible) ----------


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
        from reconcile.mechanisms.http import http_submit

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


def wait_done(child: Child, timeout: float = 10.0) -> None:
    child.done.wait(timeout)


# --- Celery workers (the job body runs in this process, in a thread) ---------------------------


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
        from reconcile.drills.agent import drill_steps
        from stopdesk.services.boundary import item_start

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


# --- manual: the runtime reports its own result (here through the in-process runtime API) ------


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
        from stopdesk.client.errors import StopRequested
        from stopdesk.runtime import LocalRuntime

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


DRIVERS: dict[str, type[Driver]] = {d.mechanism: d for d in (OpenAIDriver, HttpDriver, CeleryDriver, ManualDriver)}


def register_driver(cls: type[Driver]) -> type[Driver]:
    """Make a driver available to the runner (a mechanism's own module, or a test, adds one)."""
    DRIVERS[cls.mechanism] = cls
    return cls
