"""The in-process runtime API: the same methods, arguments, answers and errors as the HTTP client
(`stopdesk.client.Client`), calling the ledger services directly. The HTTP API is a thin door in
front of this class, so the two cannot drift apart.

    from stopdesk.agent.runtime import LocalRuntime
    sd = LocalRuntime(actor="agent:invoices")
    task = sd.create_task("Analyse invoices")
    item = sd.register(task.id, kind="local_worker", noun="draft")
    sd.start(item.id)   # raises StopRequested after a stop

Bound to a `Runtime`, it sees and changes only that runtime's tasks (another's task is NotFound).
`request_key` is the HTTP client's Idempotency-Key, kept for the same signatures; the API door
stores and replays keyed requests (`stopdesk.api.idempotency`), and an in-process call, whose
answer cannot be lost on the way, has nothing to replay.

The calls a framework run makes most, each one round trip:
- `register_started(...)`: register a tool call or model request and pass the boundary; on
  PostgreSQL one statement, so one round trip (and one commit) on the tool's path;
- `finish_fast(...)`: as `finish`, but a running item's plain result is one statement (anything
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
  flush (see `StopdeskRun` for which writes may skip it): they all wait unless the operator opted
  out of durable results (STOPDESK_DURABLE_RESULTS=0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from django.db import connections, transaction
from django.db.models import Count, Q
from pydantic import BaseModel

from reconcile.services.launched import response_launched_record
from stopdesk.agent import schemas
from stopdesk.agent.runtime.errors import ledger_errors
from stopdesk.agent.runtime.info import item_info, record_info, stop_info, task_info
from stopdesk.agent.runtime.watch import LocalStopWatch
from stopdesk.models import Runtime, Task, WorkItem
from stopdesk.protocol.action import ExternalAction
from stopdesk.protocol.errors import Conflict, InvalidRequest, NotFound, StopRequested
from stopdesk.protocol.errors import TaskClosed as ClientTaskClosed
from stopdesk.protocol.spec import ItemSpec
from stopdesk.protocol.types import (
    HeartbeatInfo,
    ItemInfo,
    RecordInfo,
    StopInfo,
    TaskDetail,
    TaskInfo,
)
from stopdesk.services.closing import task_close
from stopdesk.services.errors import (
    TaskClosed,
    TaskStopped,
)
from stopdesk.services.items import (
    item_attach_record,
    item_finish,
    item_heartbeat,
    item_note_evidence,
    item_register,
    item_register_started,
    item_report_stopped,
    item_set_handle,
    item_transition,
    task_create,
)
from stopdesk.services.sql import is_postgres, thread_connection_ready
from stopdesk.services.stop import dispatch_cancellations, task_request_stop
from stopdesk.services.transitions import item_close_running, item_start, item_submit, task_settle_check
from stopdesk.states import ItemState
from stopdesk.summary import task_summary

log = logging.getLogger(__name__)
S = ItemState
ITEMS_IN_DETAIL = 1000


class LocalRuntime:
    def __init__(
        self,
        *,
        runtime: Runtime | None = None,
        actor: str | None = None,
        worker: str = "",
        dispatch: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.actor = actor or (f"runtime:{runtime.name}" if runtime is not None else "python:local")
        self.worker = worker
        # Where Stop sends its cancellation jobs; None is the Celery default.
        self.dispatch = dispatch

    # Tasks
    def create_task(self, title: str, *, request_key: str | None = None) -> TaskInfo:
        args = schemas.CreateTask.parse({"title": title})
        return task_info(task_create(title=args.title, actor=self.actor, runtime=self.runtime))

    def get_task(self, task_id: int) -> TaskDetail:
        task = self._task(task_id)
        counts = {state: 0 for state in S.values}
        for row in WorkItem.objects.filter(task=task).values("state").annotate(n=Count("id")).order_by():
            counts[row["state"]] = row["n"]
        items = list(WorkItem.objects.filter(task=task).order_by("id")[: ITEMS_IN_DETAIL + 1])
        return TaskDetail(
            **task_info(task).__dict__,
            counts=counts,
            items=[item_info(i) for i in items[:ITEMS_IN_DETAIL]],
            items_truncated=len(items) > ITEMS_IN_DETAIL,
            summary=task_summary(task),
        )

    def request_stop(self, task_id: int, *, reason: str = "") -> StopInfo:
        """Idempotent: every call returns the task's one stop request; `created` is true only for
        the call that made it."""
        args = schemas.RequestStop.parse({"reason": reason})
        task = self._task(task_id)
        outcome = task_request_stop(
            task_id=task.pk, actor=self.actor, reason=args.reason, dispatch=self.dispatch or _dispatch_or_log
        )
        return stop_info(outcome.stop_request, created=outcome.created)

    def close_task(self, task_id: int, *, reason: str = "") -> TaskInfo:
        """Say the task is over: it takes no new work from now on (a registration is refused with
        TaskClosed). Until then a task whose items have all settled stays open and keeps its Stop.
        Idempotent."""
        args = schemas.CloseTask.parse({"reason": reason})
        task, _ = task_close(task_id=self._task(task_id).pk, actor=self.actor, reason=args.reason)
        return task_info(task)

    def watch_stop(self, task_id: int, *, poll_s: float = 25.0) -> LocalStopWatch:
        """A handle set (like a threading.Event) the moment the task's Stop commits, pushed by the
        process's one listener. `poll_s` is the HTTP client's long-poll length; here there is no
        poll."""
        task = self._task(task_id)
        return LocalStopWatch(task.pk)

    # Items
    def register(
        self,
        task_id: int,
        *,
        kind: str,
        noun: str,
        noun_plural: str = "",
        mechanism: str = "manual",
        handle: str = "",
        label: str = "",
        parent: int | None = None,
        idempotency_key: str = "",
        detail: dict[str, Any] | None = None,
        request_key: str | None = None,
    ) -> ItemInfo:
        """Record a child before dispatching it."""
        spec = ItemSpec(
            kind=kind,
            noun=noun,
            noun_plural=noun_plural,
            mechanism=mechanism,
            handle=handle,
            label=label,
            parent=parent,
            idempotency_key=idempotency_key,
            detail=detail,
        )
        return self.register_spec(task_id, spec)

    def register_spec(self, task_id: int, spec: ItemSpec, *, request_key: str | None = None) -> ItemInfo:
        """`register`, with the item as one value (`stopdesk.client.ItemSpec`)."""
        args = _parse(schemas.RegisterItem, **spec.to_json())
        task = self._task(task_id)
        if args.parent is not None and not WorkItem.objects.filter(pk=args.parent, task=task).exists():
            raise InvalidRequest("parent must be an item of the same task.", field="parent")
        with ledger_errors():
            item = item_register(task=task, actor=self.actor, spec=args.spec())
        return item_info(item)

    def get_item(self, item_id: int) -> ItemInfo:
        return item_info(self._item(item_id))

    def start(
        self,
        item_id: int,
        *,
        worker: str | None = None,
        lease_seconds: int | None = None,
        request_key: str | None = None,
    ) -> ItemInfo:
        """The boundary before starting queued work. Raises StopRequested once Stop was requested
        (the item is then cancelled), Conflict if the item is not queued."""
        args = _parse(schemas.Start, worker=self.worker if worker is None else worker, lease_seconds=lease_seconds)
        self._check_item(item_id)

        with ledger_errors():
            item_start(item_id=item_id, actor=self.actor, worker=args.worker, lease_seconds=args.lease_seconds)
        return item_info(WorkItem.objects.get(pk=item_id))

    def submit(
        self,
        item_id: int,
        *,
        idempotency_key: str,
        worker: str | None = None,
        lease_seconds: int | None = None,
        request_key: str | None = None,
    ) -> ItemInfo:
        """The boundary before an external action; records its idempotency key before the call."""
        args = _parse(
            schemas.Submit,
            idempotency_key=idempotency_key,
            worker=self.worker if worker is None else worker,
            lease_seconds=lease_seconds,
        )
        self._check_item(item_id)

        with ledger_errors():
            item_submit(
                item_id=item_id,
                idempotency_key=args.idempotency_key,
                actor=self.actor,
                worker=args.worker,
                lease_seconds=args.lease_seconds,
            )
        return item_info(WorkItem.objects.get(pk=item_id))

    def heartbeat(self, item_id: int, *, lease_seconds: int | None = None, raise_on_stop: bool = True) -> HeartbeatInfo:
        """Extend a running item's lease and answer whether Stop was requested. With
        `raise_on_stop`, a stop raises StopRequested: stop between steps and call cancel()."""
        args = _parse(schemas.Heartbeat, lease_seconds=lease_seconds)
        item = self._item(item_id)
        if item.state != S.RUNNING:
            if item.task.is_stopped:
                raise StopRequested(
                    f"Task {item.task_id} was stopped; item {item.pk} is {item.state}.",
                    task=item.task_id,
                    item=item.pk,
                    state=item.state,
                )
            raise Conflict(
                f"Item {item.pk} is {item.state}; only a running item has a lease.", state=item.state, item=item.pk
            )
        stopped = item_heartbeat(item_id=item.pk, lease_seconds=args.lease_seconds)
        item.refresh_from_db(fields=["state", "lease_until"])
        beat = HeartbeatInfo(item=item.pk, state=item.state, stop_requested=stopped, lease_until=item.lease_until)
        if stopped and raise_on_stop:
            raise StopRequested(
                "Stop was requested; stop between steps and report with cancel().",
                task=item.task_id,
                item=item.pk,
                state=item.state,
            )
        return beat

    def record_handle(
        self, item_id: int, *, handle: str, detail: dict[str, Any] | None = None, request_key: str | None = None
    ) -> ItemInfo:
        """Record the handle of work dispatched after registration (register, start or submit,
        dispatch, then this), so Stop can cancel it through its mechanism. Refused (Conflict) for
        an item that never passed the boundary, or that has another handle."""
        args = _parse(schemas.RecordHandle, handle=handle, detail=detail)
        self._check_item(item_id)

        with ledger_errors():
            item = item_set_handle(item_id=item_id, handle=args.handle, actor=self.actor, detail=args.detail)
        return item_info(item)

    def attach_record(
        self,
        item_id: int,
        *,
        system: str,
        record_id: str,
        effect: str,
        version: str = "",
        reversible: bool = False,
        reversal: str = "",
        link: str = "",
        request_key: str | None = None,
    ) -> RecordInfo:
        """Report an effect in another system. The item must have passed the boundary."""
        args = _parse(
            schemas.AttachRecord,
            system=system,
            record_id=record_id,
            effect=effect,
            version=version,
            reversible=reversible,
            reversal=reversal,
            link=link,
        )
        item = self._item(item_id)

        if item.started_at is None:
            raise Conflict(
                f"Item {item.pk} is {item.state} and never passed the boundary; it cannot have had an effect.",
                state=item.state,
                item=item.pk,
            )
        record = item_attach_record(item_id=item.pk, actor=self.actor, **args.model_dump())
        return record_info(record)

    def finish(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        evidence: dict[str, Any] | None = None,
        request_key: str | None = None,
    ) -> ItemInfo:
        """Report the result. A result for an item that Stop already settled is kept as a late
        result (an event, and the item flagged for review), never written over the outcome."""
        args = _parse(schemas.Finish, status=status, detail=detail, evidence=evidence)
        item = self._item(item_id)

        if item.state == S.QUEUED:
            # A result for work that never passed the boundary is a runtime bug; refuse it
            # loudly instead of recording work the boundary never allowed.
            raise Conflict(
                f"Item {item.pk} is queued; start it before reporting its result.", state=item.state, item=item.pk
            )
        result = item_finish(
            item_id=item.pk,
            succeeded=args.status == "completed",
            actor=self.actor,
            outcome=args.detail,
            evidence=args.evidence,
        )
        return item_info(result)

    def mark_uncertain(
        self, item_id: int, *, detail: str = "", evidence: dict[str, Any] | None = None, request_key: str | None = None
    ) -> ItemInfo:
        """The external call's outcome is unknown: uncertain, with an investigate-by deadline."""
        args = _parse(schemas.MarkUncertain, detail=detail, evidence=evidence)
        self._check_item(item_id)
        return self._move(
            item_id,
            S.UNCERTAIN,
            frozenset({S.RUNNING, S.AWAITING_RECONCILIATION}),
            args.detail or "outcome unknown",
            args.evidence,
        )

    def cancel(self, item_id: int, *, detail: str = "", request_key: str | None = None) -> ItemInfo:
        """The worker stopped (typically after heartbeat said Stop), or a queued item will never be
        dispatched."""
        args = _parse(schemas.Cancel, detail=detail)
        self._check_item(item_id)
        return self._move(
            item_id, S.CANCELLED, frozenset({S.QUEUED, S.RUNNING}), args.detail or "stopped between steps", None
        )

    def note_evidence(
        self, item_id: int, *, message: str, evidence: dict[str, Any], request_key: str | None = None
    ) -> ItemInfo:
        """An observation on the item, its state unchanged (a tool body Stop cannot interrupt, still
        running), with an event."""
        args = _parse(schemas.NoteEvidence, message=message, evidence=evidence)
        self._check_item(item_id)
        item_note_evidence(item_id=_id(item_id, "item"), evidence=args.evidence, actor=self.actor, message=args.message)
        return item_info(WorkItem.objects.get(pk=item_id))

    def external_action(
        self,
        item_id: int,
        *,
        idempotency_key: str,
        worker: str | None = None,
        failures: tuple[type[BaseException], ...] = (),
        complete: bool = True,
    ) -> ExternalAction:
        return ExternalAction(
            self, item_id, idempotency_key=idempotency_key, worker=worker, failures=failures, complete=complete
        )

    # The calls a framework run makes most, each one round trip (see the module docstring).
    def register_started(
        self,
        task_id: int,
        *,
        submit_key: str = "",
        worker: str | None = None,
        lease_seconds: int | None = None,
        **register: Any,
    ) -> int:
        """`register`, then the boundary (start, or submit with `submit_key`); the item's fields
        as `register` takes them."""
        spec = ItemSpec(**register)
        try:
            item_id = item_register_started(
                task_id=_id(task_id, "task"),
                runtime_id=self.runtime.pk if self.runtime is not None else None,  # scoped: another's is NotFound
                actor=self.actor,
                worker=self.worker if worker is None else worker,
                lease_seconds=lease_seconds,
                submit_key=submit_key,
                spec=spec,
            )
        except TaskStopped as exc:
            raise StopRequested(str(exc), task=task_id, item=exc.item_id, state=ItemState.CANCELLED) from exc
        except TaskClosed as exc:
            raise ClientTaskClosed(str(exc), task=task_id) from exc
        if item_id is None:
            raise NotFound(f"No task {task_id}.")
        return item_id

    def write_results(self, results: list[dict[str, Any]]) -> None:
        """Several items' results, each the keywords of `finish_fast` and its `item`, written as
        `finish_fast` writes each (status "stopped": as `report_stopped` does), in one transaction
        (over HTTP, one request): one refused (an unknown item) refuses them all, and nothing is
        written."""
        parsed = schemas.WriteResults.parse({"results": results}).results
        with transaction.atomic():
            for result in parsed:
                if result.status == "stopped":
                    self.report_stopped(result.item, detail=result.detail)
                else:
                    self.finish_fast(
                        result.item, status=result.status, detail=result.detail, open_item=result.open_item
                    )

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

    @staticmethod
    def thread_close() -> None:
        """Close this thread's database connections (a framework run's threads, when the program
        is done with them: `stopdesk.agent.frameworks.lanes.close_connections`)."""
        connections.close_all()

    def thread_prepare(self, wait_for_flush: bool) -> None:
        """This thread's connection, checked, and whether its commits wait for the disk flush
        (`wait_for_flush=False` is honoured only where the operator opted out of durable results)."""
        thread_connection_ready(wait_for_flush=wait_for_flush)

    def record_launched(self, item_id: int, calls: list[dict[str, Any]]) -> list[int]:
        self._check_item(item_id)  # scoped, as every item call
        return response_launched_record(item_id=item_id, calls=calls, actor=self.actor)

    # Scoping: the one place a runtime's lookups are narrowed to its own tasks.
    def _tasks(self) -> Any:
        tasks = Task.objects.all()
        return tasks if self.runtime is None else tasks.filter(runtime=self.runtime)

    def _task(self, task_id: int) -> Task:
        task = self._tasks().filter(pk=_id(task_id, "task")).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        return task

    def _items(self) -> Any:
        items = WorkItem.objects.select_related("task")
        return items if self.runtime is None else items.filter(task__runtime=self.runtime)

    def _item(self, item_id: int) -> WorkItem:
        item = self._items().filter(pk=_id(item_id, "item")).first()
        if item is None:
            raise NotFound(f"No item {item_id}.")
        return item

    def _check_item(self, item_id: int) -> None:
        where = Q(pk=_id(item_id, "item"))
        if self.runtime is not None:
            where &= Q(task__runtime=self.runtime)
        if not WorkItem.objects.filter(where).exists():
            raise NotFound(f"No item {item_id}.")

    def _move(
        self, item_id: int, to_state: str, allowed: frozenset[str], outcome: str, evidence: dict[str, Any] | None
    ) -> ItemInfo:
        with ledger_errors():
            item = item_transition(
                item_id=item_id,
                to_state=to_state,
                actor=self.actor,
                outcome=outcome,
                evidence=evidence,
                allowed_from=allowed,
            )
        return item_info(item)


def _dispatch_or_log(item_ids: list[int]) -> None:
    """Queue the cancellation jobs after Stop commits. If the broker is down, the stop still stands
    and the runtime is told so: the items carry cancel_requested_at and a due next_check_at, and the
    reconcile sweep picks them up from the database."""
    try:
        dispatch_cancellations(item_ids)
    except Exception:
        log.exception(
            "Stop committed, but queueing %d cancellation job(s) failed; the sweep will find them", len(item_ids)
        )


def _parse(model: type[BaseModel], **values: Any) -> Any:
    return model.parse({k: v for k, v in values.items() if v is not None})  # type: ignore[attr-defined]


def _id(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= schemas.MAX_ID:
        raise NotFound(f"No {what} {value}.")
    return value
