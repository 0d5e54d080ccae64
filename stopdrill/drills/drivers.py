"""What every drill driver shares. Each mechanism's driver is its folder's `drill.py`
(`reconcile/mechanisms/<name>/drill.py`, found through `folders.FOLDERS`).

A driver is the agent side of a mechanism as a drill drives it against the sandbox: it registers
a child the way an agent runtime would and returns the code that dispatches it (run in a thread
by the drill). Variants shape the child for a drill:

- "normal": an action that takes a moment at the external system (Stop lands during it);
- "accept": the external system accepts the action, and the caller has not heard back yet;
- "slow": slower than every timeout the mechanism has;
- "disconnect": the agent's client gives up on the call and disappears;
- "down": a child whose cancellation/lookup route will be down for the whole deadline.

`expected` says, per drill, which final states of the child are a correct outcome; a drill that
does not apply to a mechanism says why instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

from reconcile.mechanisms import folders
from stopdesk.models import Task
from stopdrill.drills.core import Child, DrillContext

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


def wait_done(child: Child, timeout: float = 10.0) -> None:
    child.done.wait(timeout)


# Drivers of what is not a mechanism folder: the agent frameworks' runs, a test's own adapter.
DRIVERS: dict[str, type[Driver]] = {}


def register_driver(cls: type[Driver]) -> type[Driver]:
    """Make a driver available to the runner without a mechanism folder (a framework's, a test's)."""
    DRIVERS[cls.mechanism] = cls
    return cls


def driver_class(name: str) -> type[Driver] | None:
    """The driver for `name`: its mechanism folder's `drill.DRIVER`, else one registered here."""
    if name in DRIVERS:
        return DRIVERS[name]
    if folders.package(name) is None:
        return None
    drill = folders.part(name, "drill")
    return None if drill is None else drill.DRIVER
