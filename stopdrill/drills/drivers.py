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

import functools
import time
import uuid
from typing import Any, ClassVar

import anyio
import httpx

from stopdesk.agent.aio import supervise
from stopdesk.agent.http import http_submit
from stopdesk.agent.mcp import mcp_call_tool, mcp_start_task
from stopdesk.agent.openai import response_create
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import Task, WorkItem
from stopdesk.protocol.errors import StopRequested
from stopdesk.services.items import item_register
from stopdesk.services.transitions import item_start
from stopdesk.states import Kind
from stopdrill.drills.agent import crm_declaration, drill_steps, outbox_declaration
from stopdrill.drills.core import Child, DrillContext, wait_until
from stopdrill.sandbox import crm as crm_faults
from stopdrill.sandbox import mcp_server as mcp_faults
from stopdrill.sandbox import openai_standin as oa_faults

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


# --- MCP tool calls (the sandbox's SDK-built tool server) ---------------------------------------

_MCP_ENDED = frozenset({"applied", "interrupted", "finished", "failed"})


@register_driver
class McpDriver(Driver):
    """Plain calls through `mcp_call_tool` (cancelled by scope) and 2025-11-25 tasks through
    `mcp_start_task` (tasks/cancel, then tasks/get). Per drill:

    - before_dispatch: a destructive slow_write and an export task, both after Stop: nothing sent.
    - during_tool_call: a read-only slow_lookup (cancelled), a destructive slow_write (uncertain:
      no answer follows a cancelled call) and an export task (tasks/cancel, read back `cancelled`,
      which by spec does not prove the work stopped: uncertain, the tool is not read-only).
    - after_acceptance: the server has started the write (journal `started`): uncertain; an export
      task whose CreateTaskResult came back: uncertain, for the same reason.
    - slow_child: the export task ignores tasks/cancel (`tasks_ignore_cancel`) and the write ignores
      notifications/cancelled (`ignore_cancel`); both effects land after the cancel. The honest
      state of each is uncertain (or a flagged late result): MCP offers no way to learn whether a
      cancelled task's work went on, and a task that reads `cancelled` stays `cancelled` by spec.
    - disconnected_client: the agent's read timeout ends the write's call and the agent is gone.
    - cancel_endpoint_down: the MCP server is down (stopped) for the whole deadline.
    - duplicate_stop: an export task, two Stops: one tasks/cancel (then uncertain, as above).

    The checker compares the server's effects (slow_write's key is the item's idempotency key, a
    task's call is its task id, the item's handle) with the ledger, and the arrival log ties each
    tools/call to its item through `_meta.stopdesk_item`.
    """

    mechanism = "mcp"
    tool = "mcp (sandbox tool server)"
    expected = {
        "before_dispatch": frozenset({"cancelled"}),
        "during_tool_call": frozenset({"cancelled"}),
        "after_acceptance": frozenset({"uncertain"}),
        "slow_child": frozenset({"uncertain", REVIEW}),
        "disconnected_client": frozenset({"uncertain"}),
        "cancel_endpoint_down": frozenset({"uncertain"}),
        "duplicate_stop": frozenset({"uncertain"}),
    }

    def _item(self, ctx: DrillContext, noun: str) -> Any:
        return item_register(task=_task(ctx), kind=Kind.REMOTE_TOOL, noun=noun, actor=AGENT, mechanism="mcp")

    def _call(
        self, ctx: DrillContext, tool: str, *, name: str, seconds: float, timeout_s: float = 30.0,
        expect: frozenset[str] | None = None,
    ) -> Child:  # fmt: skip

        url = _sandbox(ctx).urls["mcp"]
        item = self._item(ctx, "lookup" if tool == "slow_lookup" else "write")
        key = f"mcp-item-{item.pk}"  # the idempotency key mcp_call_tool records for a non-read-only call
        arguments: dict[str, Any] = {"seconds": seconds}
        arguments.update({"query": key} if tool == "slow_lookup" else {"key": key, "value": "drill"})

        def run() -> Any:
            return anyio.run(
                functools.partial(
                    mcp_call_tool, item_id=item.pk, url=url, tool=tool, arguments=arguments, actor=AGENT,
                    poll_s=0.05, timeout_s=timeout_s,
                )
            )  # fmt: skip

        return ctx.add(Child(item.pk, run, key=key, expect=expect, name=name))

    def _task_child(self, ctx: DrillContext, *, seconds: float, expect: frozenset[str] | None = None) -> Child:

        url = _sandbox(ctx).urls["mcp"]
        item = self._item(ctx, "export")

        def run() -> Any:
            return mcp_start_task(
                item_id=item.pk, url=url, tool="export_report", arguments={"name": f"drill-{item.pk}", "seconds": seconds},
                actor=AGENT,
            )  # fmt: skip

        return ctx.add(Child(item.pk, run, expect=expect, name="export task"))

    def child(self, ctx: DrillContext, variant: str) -> Child:

        party = _sandbox(ctx).sandbox.mcp
        ctx.cleanups.append(lambda: self._world_settles(ctx))
        if variant == "normal" and ctx.drill == "during_tool_call":
            main = self._call(ctx, mcp_faults.SLOW_LOOKUP, name="lookup", seconds=3.0)
            self._call(ctx, mcp_faults.SLOW_WRITE, name="write", seconds=3.0, expect=frozenset({"uncertain"}))
            self._task_child(ctx, seconds=3.0, expect=frozenset({"uncertain"}))
            return main
        if variant == "normal" and ctx.drill == "before_dispatch":
            main = self._call(ctx, mcp_faults.SLOW_WRITE, name="write", seconds=3.0)
            self._task_child(ctx, seconds=3.0, expect=frozenset({"cancelled"}))
            return main
        if variant == "normal":  # duplicate_stop
            return self._task_child(ctx, seconds=3.0)
        if variant == "accept":
            main = self._call(ctx, mcp_faults.SLOW_WRITE, name="write", seconds=3.0)
            self._task_child(ctx, seconds=3.0, expect=frozenset({"uncertain"}))
            return main
        if variant == "slow":
            main = self._task_child(ctx, seconds=1.0)
            write = self._call(
                ctx, mcp_faults.SLOW_WRITE, name="write", seconds=1.0, expect=frozenset({"uncertain", REVIEW})
            )
            party.set_fault(mcp_faults.TASKS_IGNORE_CANCEL)
            party.set_fault(mcp_faults.IGNORE_CANCEL, target=write.key)
            ctx.fault("mcp: the export task reads cancelled after tasks/cancel, but its work runs on and exports")
            ctx.fault("mcp: slow_write ignores notifications/cancelled and writes after the cancel")
            return main
        if variant == "disconnect":
            ctx.fault("mcp client: read timeout 0.3 s into a 3 s write; the agent is gone")
            return self._call(ctx, mcp_faults.SLOW_WRITE, name="write", seconds=3.0, timeout_s=0.3)
        if variant == "down":
            return self._task_child(ctx, seconds=3.0)
        raise ValueError(variant)

    def _all_in(self, ctx: DrillContext, predicate: Any) -> bool:
        return all(predicate(c) for c in ctx.children)

    def _reached(self, ctx: DrillContext, child: Child) -> bool:
        if child.name == "export task":
            return bool(WorkItem.objects.filter(pk=child.item_id).exclude(handle="").exists())
        return _arrived(ctx, item=child.item_id)

    def in_call(self, ctx: DrillContext, child: Child) -> bool:
        return self._all_in(ctx, lambda c: self._reached(ctx, c))

    def accepted(self, ctx: DrillContext, child: Child) -> bool:
        journal = _sandbox(ctx).sandbox.mcp.journal()
        started = {e["call"] for e in journal if e["event"] == "started"}

        def ok(c: Child) -> bool:
            return self._reached(ctx, c) if c.name == "export task" else c.key in started

        return self._all_in(ctx, ok)

    def endpoint_down(self, ctx: DrillContext, child: Child) -> None:
        server = _sandbox(ctx).sandbox.servers["mcp"]
        server.stop()
        ctx.fault("mcp: the tool server is down (stopped) for the whole deadline; tasks/cancel and tasks/get refused")
        ctx.cleanups.append(server.start)

    def _world_settles(self, ctx: DrillContext, timeout: float = 6.0) -> None:
        """Before the checker looks: wait until each call and task the drill sent has ended at the
        server (applied, interrupted, finished or failed), so an effect that lands after the cancel
        is seen, not missed."""
        sandbox = _sandbox(ctx)
        if not sandbox.sandbox.servers["mcp"].running:
            return
        calls = {c.key for c in ctx.children if c.key}
        calls |= set(
            WorkItem.objects.filter(pk__in=[c.item_id for c in ctx.children])
            .exclude(handle="")
            .values_list("handle", flat=True)
        )
        started = {e["call"] for e in sandbox.sandbox.mcp.journal() if e["event"] == "started"}

        def ended() -> bool:
            done = {e["call"] for e in sandbox.sandbox.mcp.journal() if e["event"] in _MCP_ENDED}
            return (calls & started) <= done

        try:
            wait_until(ended, timeout=timeout, interval=0.05)
        except TimeoutError:
            ctx.notes.append("the MCP server had not finished every call when the checker looked")


# --- asyncio: children under supervise(), one with an external action, one that only computes ---


@register_driver
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
