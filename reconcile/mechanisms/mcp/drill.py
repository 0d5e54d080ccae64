"""The drill driver for MCP tool calls (the sandbox's SDK-built tool server): the agent side as a drill drives it against the sandbox
(the variants and `expected` are described in `stopdrill.drills.drivers`)."""

from __future__ import annotations

import functools
from typing import Any

import anyio

from reconcile.mechanisms.mcp import sandbox as mcp_faults
from reconcile.mechanisms.mcp.agent import mcp_call_tool, mcp_start_task, task_owner
from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from stopdrill.drills.core import Child, DrillContext, wait_until
from stopdrill.drills.drivers import AGENT, REVIEW, Driver, _arrived, _sandbox, _task

_MCP_ENDED = frozenset({"applied", "interrupted", "finished", "failed"})


class McpDriver(Driver):
    """Plain calls through `mcp_call_tool` (cancelled by scope) and tasks through `mcp_start_task`
    (tasks/cancel, then tasks/get), in the revision the sandbox negotiates (2026-07-28). Per drill:

    - before_dispatch: a destructive slow_write and an export task, both after Stop: nothing sent.
    - during_tool_call: a read-only slow_lookup (cancelled), a destructive slow_write (uncertain:
      no answer follows a cancelled call) and an export task (tasks/cancel, read back `cancelled`,
      which by spec does not prove the work stopped: uncertain, the tool is not read-only).
    - after_acceptance: the server has started the write (journal `started`): uncertain; an export
      task whose CreateTaskResult came back: uncertain, for the same reason.
    - slow_child: the export task ignores tasks/cancel (`tasks_ignore_cancel`) and the write ignores
      its cancel (`ignore_cancel`); both effects land after the cancel. In 2025-11-25 the task reads
      `cancelled` (kept by spec though the work went on): uncertain, or a flagged late result. In
      2026-07-28 it stays `working` and its read-back ends `completed`, which is what happened.
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
        # The export task: 2025-11-25 reads `cancelled` while its work runs on (uncertain); 2026-07-28
        # keeps it `working` until the export lands, and the read-back says `completed`.
        "slow_child": frozenset({"uncertain", REVIEW, "completed"}),
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
        ctx.cleanups.append(lambda: self._owners_end(ctx))  # runs last: cleanups run in reverse
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
            ctx.fault(
                "mcp: the export task's work ignores tasks/cancel and exports (2025-11-25: the task reads cancelled; "
                "2026-07-28: it stays working and ends completed)"
            )
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

    def _owners_end(self, ctx: DrillContext, timeout: float = 15.0) -> None:
        """Before the checker looks and before the drill's task is left: wait for the threads that
        own the drill's MCP tasks to end. An owner writes its last read-back and the end of its
        session on the item as it ends; left running, it wrote after the drill was over (and a
        test's database teardown deadlocked against it)."""
        for child in ctx.children:
            owner = task_owner(child.item_id)
            if owner is not None and not owner.join(timeout):
                ctx.notes.append(
                    f"the owner of the MCP task of item {child.item_id} had not ended after {timeout:.0f} s"
                )

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


DRIVER = McpDriver
