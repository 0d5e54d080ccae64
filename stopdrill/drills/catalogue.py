"""The drills: the moments and faults Stop must survive, each a short script over a driver.

Every drill ends the same way (the runner settles the task, waits for the agent side, inspects),
so each function here only sets the scene and presses Stop at the right moment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from stopdesk.models import StopRequest
from stopdrill.drills.core import DrillContext, stop_twice_at_once, wait_until
from stopdrill.drills.drivers import Driver


@dataclass(frozen=True)
class Drill:
    name: str
    title: str
    plan: Callable[[DrillContext, Driver], None]
    # Extra checks for this drill, after the common ones: violations as sentences.
    checks: Callable[[DrillContext], list[str]] = field(default=lambda ctx: [])


def start_children(ctx: DrillContext) -> None:
    """Start every child the driver added that is not running yet (a driver may add more than
    one: the first carries the drill's expectation, the others their own)."""
    for child in ctx.children:
        if child.thread is None and not child.done.is_set():
            child.start()


def before_dispatch(ctx: DrillContext, driver: Driver) -> None:
    driver.child(ctx, "normal")
    ctx.stop()
    for child in ctx.children:
        child.run_now()  # the agent dispatches after the stop committed: the boundary must refuse


def during_tool_call(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "normal")
    start_children(ctx)
    wait_until(lambda: driver.in_call(ctx, child))
    ctx.stop()


def after_acceptance(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "accept")
    start_children(ctx)
    wait_until(lambda: driver.accepted(ctx, child))
    ctx.stop()


def slow_child(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "slow")
    start_children(ctx)
    wait_until(lambda: driver.in_call(ctx, child))
    ctx.stop()


def disconnected_client(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "disconnect")
    start_children(ctx)
    wait_until(child.done.is_set, timeout=10)  # the agent gave up and is gone
    ctx.stop()


def cancel_endpoint_down(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "down")
    start_children(ctx)
    wait_until(lambda: driver.in_call(ctx, child))
    driver.endpoint_down(ctx, child)
    ctx.stop()


def duplicate_stop(ctx: DrillContext, driver: Driver) -> None:
    child = driver.child(ctx, "normal")
    start_children(ctx)
    wait_until(lambda: driver.in_call(ctx, child))
    ctx.fault("operator: two Stops at the same moment")
    stop_twice_at_once(ctx)


def _one_stop_one_cancel(ctx: DrillContext) -> list[str]:
    assert ctx.task is not None
    problems = []
    stops = list(StopRequest.objects.filter(task=ctx.task))
    if len(stops) != 1:
        problems.append(f"{len(stops)} stop requests for one task")
    elif stops[0].duplicates != 1:
        problems.append(f"second stop counted {stops[0].duplicates} times, not once")
    created = sum(1 for o in ctx.stop_outcomes if o.created)
    if created != 1:
        problems.append(f"{created} stops claimed to be the first")
    if len(ctx.dispatched) != len(set(ctx.dispatched)):
        problems.append("an item's cancellation was dispatched twice")
    if ctx.sandbox is not None:
        cancels = Counter(a.path for a in ctx.sandbox.log.arrivals() if a.path.endswith("/cancel"))
        problems += [f"{path} sent {n} times" for path, n in cancels.items() if n > 1]
        # MCP's cancel is a JSON-RPC tasks/cancel on one path; the server counts it per task id.
        for task_id, counts in ctx.sandbox.sandbox.mcp.stats()["by_key"].items():
            if counts.get("tasks/cancel", 0) > 1:
                problems.append(f"mcp tasks/cancel for task {task_id} sent {counts['tasks/cancel']} times")
    return problems


DRILLS: list[Drill] = [
    Drill("before_dispatch", "Stop before the child is dispatched", before_dispatch),
    Drill("during_tool_call", "Stop while the child's call is in progress", during_tool_call),
    Drill("after_acceptance", "Stop right after the external system accepted the action", after_acceptance),
    Drill("slow_child", "A child slower than every timeout", slow_child),
    Drill("disconnected_client", "The agent's client hangs up mid-call", disconnected_client),
    Drill("cancel_endpoint_down", "The cancellation endpoint is down for the whole deadline", cancel_endpoint_down),
    Drill("duplicate_stop", "Two Stops at once", duplicate_stop, _one_stop_one_cancel),
]
BY_NAME = {d.name: d for d in DRILLS}
