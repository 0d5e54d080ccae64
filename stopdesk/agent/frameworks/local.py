"""The in-process runtime, with the calls a framework run makes most, each one round trip.

`LocalRuntime` answers the same methods as the HTTP client. A framework run also uses:
- `register_started(...)`: register a tool call or model request and pass the boundary; on
  PostgreSQL one statement, so one round trip (and one commit) on the tool's path;
- `finish(...)`: as LocalRuntime's, but a running item's plain result is one statement (anything
  else, such as a late result, takes the general path);
- `report_stopped(item_id)`: the run's own item ended by Stop, cancelled also from awaiting
  reconciliation (where Stop's job for a "manual" item leaves it, waiting for this report);
- `task_settle_check(task_id)`: whether the task settled, for results written with `open_item`
  that may have committed after the run's item settled;
- `task_stopped(task_id)`: one indexed read, for watching Stop without building the task's detail;
- `record_launched(item_id, calls)`: tool calls a model response ran itself, as children of the
  response's item (the service the OpenAI adapter's read-back uses, so each call once);
- `thread_prepare(wait_for_flush)`: called by the run's threads before each call: the thread's
  connection checked as Django checks one per request, and whether its commits wait for the disk
  flush (see `StopdeskRun` for which writes do not wait).
"""

from __future__ import annotations

from typing import Any, Literal

from reconcile.services.launched import response_launched_record
from stopdesk.agent import schemas
from stopdesk.agent.runtime import LocalRuntime, _id
from stopdesk.client.errors import NotFound, StopRequested
from stopdesk.client.errors import TaskClosed as ClientTaskClosed
from stopdesk.services.errors import TaskClosed, TaskStopped
from stopdesk.services.items import item_register_started, item_report_stopped
from stopdesk.services.sql import is_postgres, thread_connection_ready
from stopdesk.services.transitions import item_close_running, task_settle_check
from stopdesk.states import ItemState


class FrameworkRuntime(LocalRuntime):
    def register_started(
        self, task_id: int, *, submit_key: str = "", worker: str | None = None, **register: Any
    ) -> int:
        try:
            item_id = item_register_started(
                task_id=_id(task_id, "task"),
                runtime_id=self.runtime.pk if self.runtime is not None else None,  # scoped: another's is NotFound
                actor=self.actor,
                worker=self.worker if worker is None else worker,
                submit_key=submit_key,
                **register,
            )
        except TaskStopped as exc:
            raise StopRequested(str(exc), task=task_id, item=exc.item_id, state=ItemState.CANCELLED) from exc
        except TaskClosed as exc:
            raise ClientTaskClosed(str(exc), task=task_id) from exc
        if item_id is None:
            raise NotFound(f"No task {task_id}.")
        return item_id

    def finish_fast(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        open_item: int | None = None,
    ) -> None:
        """`finish` without the answer: a running item's result in one statement; any other case
        (a late result, an item Stop settled, a database without that statement) as `finish`.
        `open_item`: the caller's item that keeps the task unsettled (its run), so the task's
        settle check is skipped while that item is open."""
        args = schemas.Finish.parse({"status": status, "detail": detail})
        if is_postgres() and item_close_running(
            item_id=_id(item_id, "item"),
            succeeded=args.status == "completed",
            actor=self.actor,
            outcome=args.detail,
            runtime_id=self.runtime.pk if self.runtime is not None else None,
            open_item=open_item,
        ):
            return
        self.finish(item_id, status=args.status, detail=args.detail)

    def report_stopped(self, item_id: int, *, detail: str = "") -> None:
        """The work stopped because of Stop: cancelled, also when Stop's job already left it
        awaiting this report (a "manual" item); an item recorded otherwise keeps its outcome and
        this becomes a late result."""
        self._check_item(item_id)  # scoped, as every item call
        item_report_stopped(item_id=_id(item_id, "item"), actor=self.actor, outcome=detail or "stopped between steps")

    def task_settle_check(self, task_id: int) -> None:
        """Whether the task settled (see `finish_fast`'s `open_item`)."""
        task_settle_check(task_id=self._task(task_id).pk)

    def task_stopped(self, task_id: int) -> bool:
        return self._tasks().filter(pk=task_id, stop_requested_at__isnull=False).exists()

    def thread_prepare(self, wait_for_flush: bool) -> None:
        """This thread's connection, checked, and whether its commits wait for the disk flush."""
        thread_connection_ready(wait_for_flush=wait_for_flush)

    def record_launched(self, item_id: int, calls: list[dict[str, Any]]) -> list[int]:
        self._check_item(item_id)  # scoped, as every item call
        return response_launched_record(item_id=item_id, calls=calls, actor=self.actor)
