"""What a drill is made of: a context (sandbox, clock bound, settings), children whose agent side
runs in threads, the stop path run in-process, and the settle loop.

The stop path is the real one: `task_request_stop` commits the boundary, its fan-out hands the
in-flight items to `item_cancel` (called here directly instead of through Celery), and then the
items are reconciled through `item_reconcile`, as the sweep does, until each one has settled and
has no check left, or a time bound passes. Only this drill's items are swept, so a drill against
a shared database does not touch anyone else's work.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, connection
from django.test.utils import override_settings
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.services.cancel import item_cancel
from reconcile.services.reconcile import item_reconcile
from stopdesk.models import Task, WorkItem
from stopdesk.services.items import task_create
from stopdesk.services.stop import StopOutcome, task_request_stop
from stopdesk.states import SETTLED
from stopdrill.drills.sandbox import DrillSandbox

log = logging.getLogger(__name__)

ACTOR = "drill:runner"
OPERATOR = "drill:operator"

# Short per-mechanism timings so a drill runs in seconds; the ratios between them follow the
# adapters' defaults (call timeout < deadline < the watch after `cancelled`).
DRILL_MECHANISMS: dict[str, dict[str, Any]] = {
    "openai": {
        "call_timeout_s": 0.5,
        "deadline_s": 2.5,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 0.5,
        "recheck_interval_s": 0.2,
        "recheck_after_cancelled_s": 1.0,
    },
    "http": {
        "call_timeout_s": 1.0,
        "deadline_s": 3.0,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 0.5,
        "recheck_interval_s": 0.2,
        "recheck_after_cancelled_s": 2.5,
    },
    "celery": {
        "call_timeout_s": 0.3,
        "deadline_s": 2.0,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 0.5,
        "recheck_interval_s": 0.2,
    },
    "manual": {"deadline_s": 2.0},
    "mcp": {
        "call_timeout_s": 0.5,
        "deadline_s": 2.5,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 0.5,
        "recheck_interval_s": 0.2,
        "recheck_after_cancelled_s": 1.0,
    },
    # The registry calls the asyncio adapter "asyncio"; under any other key these would be dropped.
    "asyncio": {"call_timeout_s": 0.5, "deadline_s": 2.0, "recheck_interval_s": 0.2, "recheck_after_cancelled_s": 2.5},
}
SETTLE_BOUND_S = 8.0  # no drill waits longer than this for its items to settle


@contextmanager
def drill_settings(extra: dict[str, dict[str, Any]] | None = None) -> Iterator[None]:
    """Short deadlines, a one-second heartbeat and a short lease, for the length of the drills."""
    from django.conf import settings

    mechanisms = {name: dict(values) for name, values in DRILL_MECHANISMS.items()}
    for name, values in (extra or {}).items():
        mechanisms.setdefault(name, {}).update(values)
    known = set(registry.names())
    mechanisms = {name: values for name, values in mechanisms.items() if name in known}
    # The openai adapter's base URL and key come from settings; keep them.
    for name, values in getattr(settings, "STOPDESK_MECHANISMS", {}).items():
        if name in mechanisms and "options" in values:
            mechanisms[name].setdefault("options", values["options"])
    # A claim whose holder died is free again after RECONCILE_LEASE_SECONDS (a cancel job, a
    # sweep, a batch; RECONCILE_CLAIM_SECONDS is the default hold of a bare claim); short here too.
    ledger = {
        **settings.STOPDESK,
        "HEARTBEAT_SECONDS": 1,
        "LEASE_SECONDS": 2,
        "RECONCILE_CLAIM_SECONDS": 2,
        "RECONCILE_LEASE_SECONDS": 2,
    }
    with override_settings(STOPDESK_MECHANISMS=mechanisms, STOPDESK=ledger):
        registry.reset()
        try:
            yield
        finally:
            registry.reset()


@dataclass
class Child:
    """One child of the drill's task: its item, and the agent code that dispatches it."""

    item_id: int
    run: Callable[[], Any]
    key: str = ""
    # A drill's further children (after the first) may carry their own expectation, checked too;
    # `name` says which one it is in the table ("write", "export task").
    expect: frozenset[str] | None = None
    name: str = ""
    thread: threading.Thread | None = None
    error: str = ""
    result: Any = None
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Child:
        self.thread = threading.Thread(target=self._body, name=f"drill-child-{self.item_id}", daemon=True)
        self.thread.start()
        return self

    def run_now(self) -> Child:
        self._body(close=False)
        return self

    def join(self, timeout: float = 15.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _body(self, close: bool = True) -> None:
        try:
            self.result = self.run()
        except Exception as exc:  # the agent side failing is a fact to report, not a crash
            self.error = f"{type(exc).__name__}: {exc}"[:300]
            log.debug("drill child %s raised\n%s", self.item_id, traceback.format_exc())
        finally:
            self.done.set()
            if close:
                connection.close()


@dataclass
class DrillContext:
    sandbox: DrillSandbox | None
    mechanism: str
    drill: str
    # A user's own integration (no control routes); None on the sandbox.
    target: Any = None
    task: Task | None = None
    children: list[Child] = field(default_factory=list)
    stop_outcomes: list[StopOutcome] = field(default_factory=list)
    dispatched: list[int] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Hooks run when the drill ends, whatever happened (clear a fault, release a parked child).
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def new_task(self) -> Task:
        self.task = task_create(title=f"drill: {self.drill} on {self.mechanism}", actor=ACTOR)
        return self.task

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def fault(self, description: str) -> None:
        self.faults.append(description)

    def stop(self, *, reason: str = "drill") -> StopOutcome:
        assert self.task is not None
        outcome = task_request_stop(task_id=self.task.pk, actor=OPERATOR, reason=reason, dispatch=self._cancel)
        self.stop_outcomes.append(outcome)
        return outcome

    def _cancel(self, item_ids: list[int]) -> None:
        """Stop's dispatch, in-process: the same service the Celery job `reconcile.cancel_item` calls."""
        self.dispatched.extend(item_ids)
        for item_id in item_ids:
            try:
                item_cancel(item_id=item_id, actor="drill:canceller")
            except Exception as exc:
                self.notes.append(f"cancel of item {item_id} raised {type(exc).__name__}: {exc}"[:300])

    def settle(self, *, bound_s: float = SETTLE_BOUND_S) -> bool:
        """Reconcile this task's due items until every item is settled with no check pending."""
        assert self.task is not None
        ends = time.monotonic() + bound_s
        while True:
            now = timezone.now()
            items = list(WorkItem.objects.filter(task=self.task).values("id", "state", "next_check_at"))
            pending = [i for i in items if i["state"] not in SETTLED or i["next_check_at"] is not None]
            if not pending:
                return True
            if time.monotonic() >= ends:
                return False
            for row in pending:
                if row["next_check_at"] is not None and row["next_check_at"] <= now:
                    try:
                        item_reconcile(item_id=row["id"], actor="drill:sweep")
                    except Exception as exc:
                        self.notes.append(f"reconcile of item {row['id']} raised {type(exc).__name__}: {exc}"[:300])
            time.sleep(0.05)

    def join_children(self, timeout: float = 10.0) -> None:
        for child in self.children:
            child.join(timeout)
            if child.thread is not None and child.thread.is_alive():
                self.notes.append(f"agent side of item {child.item_id} still running after {timeout:.0f}s")
            if child.error:
                self.notes.append(f"agent side of item {child.item_id}: {child.error}")

    def close(self) -> None:
        for hook in reversed(self.cleanups):
            try:
                hook()
            except Exception:
                log.exception("drill cleanup failed")
        close_old_connections()


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> Any:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("drill condition not met in time")


def stop_twice_at_once(ctx: DrillContext) -> None:
    """Two operators press Stop at the same moment, from two connections."""
    barrier = threading.Barrier(2)
    errors: list[str] = []

    def press() -> None:
        try:
            barrier.wait(5)
            ctx.stop(reason="duplicate stop drill")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=press, name=f"drill-stop-{n}") for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    ctx.notes.extend(f"stop raised {e}" for e in errors)
