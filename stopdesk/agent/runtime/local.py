"""The in-process runtime API: the same methods, arguments, answers and errors as the HTTP client
(`stopdesk.client.Client`), calling the ledger services directly. The HTTP API is a thin door in
front of this class, so the two cannot drift apart.

    from stopdesk.agent.runtime import LocalRuntime
    sd = LocalRuntime(actor="agent:invoices")
    task = sd.create_task("Analyse invoices")
    item = sd.register(task.id, kind="local_worker", noun="draft")
    sd.start(item.id)   # raises StopRequested after a stop

Bound to a `Runtime`, it sees and changes only that runtime's tasks (another's task is NotFound).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Literal

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q
from pydantic import BaseModel

from stopdesk.agent import schemas
from stopdesk.client.action import ExternalAction
from stopdesk.client.errors import Conflict, IdempotencyKeyReused, InvalidRequest, NotFound, StopRequested
from stopdesk.client.errors import TaskClosed as ClientTaskClosed
from stopdesk.client.types import (
    HeartbeatInfo,
    ItemInfo,
    RecordInfo,
    StartedInfo,
    StopInfo,
    StopWatchInfo,
    TaskDetail,
    TaskInfo,
)
from stopdesk.models import ApiIdempotency, ExternalRecord, Runtime, StopRequest, Task, WorkItem
from stopdesk.services.closing import task_close
from stopdesk.services.errors import (
    DeclarationRefused,
    HandleConflict,
    IllegalTransition,
    TaskClosed,
    TaskStopped,
    ToolNotReady,
    UnknownMechanism,
)
from stopdesk.services.items import (
    item_attach_record,
    item_finish,
    item_heartbeat,
    item_register,
    item_set_handle,
    item_transition,
    task_create,
)
from stopdesk.services.stop import dispatch_cancellations, task_request_stop
from stopdesk.services.stop_watch import stop_hub
from stopdesk.services.transitions import item_start, item_submit
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
        return self._once(
            request_key,
            "create_task",
            TaskInfo,
            lambda: task_info(task_create(title=args.title, actor=self.actor, runtime=self.runtime)),
            args,
        )

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
        args = _parse(
            schemas.RegisterItem,
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
        task = self._task(task_id)

        def produce() -> ItemInfo:
            if args.parent is not None and not WorkItem.objects.filter(pk=args.parent, task=task).exists():
                raise InvalidRequest("parent must be an item of the same task.", field="parent")
            with _ledger_errors():
                item = item_register(
                    task=task, actor=self.actor, **args.model_dump(exclude={"detail"}), detail=args.detail
                )
            return item_info(item)

        return self._once(request_key, f"register:{task.pk}", ItemInfo, produce, args)

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

        def produce() -> ItemInfo:
            with _ledger_errors():
                item_start(item_id=item_id, actor=self.actor, worker=args.worker, lease_seconds=args.lease_seconds)
            return item_info(WorkItem.objects.get(pk=item_id))

        return self._once_transition(request_key, f"start:{item_id}", ItemInfo, produce, args)

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

        def produce() -> ItemInfo:
            with _ledger_errors():
                item_submit(
                    item_id=item_id,
                    idempotency_key=args.idempotency_key,
                    actor=self.actor,
                    worker=args.worker,
                    lease_seconds=args.lease_seconds,
                )
            return item_info(WorkItem.objects.get(pk=item_id))

        return self._once_transition(request_key, f"submit:{item_id}", ItemInfo, produce, args)

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

        def produce() -> ItemInfo:
            with _ledger_errors():
                item = item_set_handle(item_id=item_id, handle=args.handle, actor=self.actor, detail=args.detail)
            return item_info(item)

        return self._once(request_key, f"record_handle:{item_id}", ItemInfo, produce, args)

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

        def produce() -> RecordInfo:
            if item.started_at is None:
                raise Conflict(
                    f"Item {item.pk} is {item.state} and never passed the boundary; it cannot have had an effect.",
                    state=item.state,
                    item=item.pk,
                )
            record = item_attach_record(item_id=item.pk, actor=self.actor, **args.model_dump())
            return record_info(record)

        return self._once(request_key, f"attach_record:{item.pk}", RecordInfo, produce, args)

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

        def produce() -> ItemInfo:
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

        return self._once(request_key, f"finish:{item.pk}", ItemInfo, produce, args)

    def mark_uncertain(
        self, item_id: int, *, detail: str = "", evidence: dict[str, Any] | None = None, request_key: str | None = None
    ) -> ItemInfo:
        """The external call's outcome is unknown: uncertain, with an investigate-by deadline."""
        args = _parse(schemas.MarkUncertain, detail=detail, evidence=evidence)
        self._check_item(item_id)
        return self._once(
            request_key,
            f"mark_uncertain:{item_id}",
            ItemInfo,
            lambda: self._move(
                item_id,
                S.UNCERTAIN,
                frozenset({S.RUNNING, S.AWAITING_RECONCILIATION}),
                args.detail or "outcome unknown",
                args.evidence,
            ),
            args,
        )

    def cancel(self, item_id: int, *, detail: str = "", request_key: str | None = None) -> ItemInfo:
        """The worker stopped (typically after heartbeat said Stop), or a queued item will never be
        dispatched."""
        args = _parse(schemas.Cancel, detail=detail)
        self._check_item(item_id)
        return self._once(
            request_key,
            f"cancel:{item_id}",
            ItemInfo,
            lambda: self._move(
                item_id, S.CANCELLED, frozenset({S.QUEUED, S.RUNNING}), args.detail or "stopped between steps", None
            ),
            args,
        )

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
        with _ledger_errors():
            item = item_transition(
                item_id=item_id,
                to_state=to_state,
                actor=self.actor,
                outcome=outcome,
                evidence=evidence,
                allowed_from=allowed,
            )
        return item_info(item)

    def _once_transition(
        self,
        key: str | None,
        operation: str,
        kind: type[ItemInfo],
        produce: Callable[[], ItemInfo],
        args: BaseModel,
    ) -> ItemInfo:
        """Like `_once`, for the boundary's transitions, which refuse a repeat on their own (a
        started item cannot start again). So the work goes first, and the stored answer is read
        only when the ledger refuses: one round trip less on every start and submit. A concurrent
        twin waits on the item's row lock, so the winner's answer is committed when it looks."""
        if not key or self.runtime is None:
            return produce()
        fingerprint = request_fingerprint(args)
        # No atomic block of our own around the work: the boundary is one statement, and its
        # refusals (a Conflict, or StopRequested after it cancelled the item) must leave the
        # caller's transaction usable and the cancellation recorded.
        try:
            result = produce()
        except Conflict:
            seen = ApiIdempotency.objects.filter(runtime=self.runtime, key=key, endpoint=operation).first()
            if seen is None:
                raise
            return kind.from_json(_replayable(seen, fingerprint))
        ApiIdempotency.objects.create(
            runtime=self.runtime,
            key=key,
            endpoint=operation,
            status=200,
            body=result.to_json(),
            fingerprint=fingerprint,
        )
        return result

    def _once[T: (TaskInfo, ItemInfo, RecordInfo, StartedInfo)](
        self, key: str | None, operation: str, kind: type[T], produce: Callable[[], T], args: BaseModel
    ) -> T:
        """With a request key, do the work once per (runtime, key, operation) and answer every
        repeat of the same request with the first answer; the same key with another body is
        refused (IdempotencyKeyReused). Only successes are kept: a refused request wrote nothing
        and may be sent again."""
        if not key or self.runtime is None:
            return produce()
        fingerprint = request_fingerprint(args)
        nested = connection.in_atomic_block
        try:
            # No savepoint inside a caller's transaction: if a concurrent twin wins the unique key,
            # the whole request must be retried (the HTTP door does), not half of it kept.
            with transaction.atomic(savepoint=not nested):
                seen = ApiIdempotency.objects.filter(runtime=self.runtime, key=key, endpoint=operation).first()
                if seen is not None:
                    return kind.from_json(_replayable(seen, fingerprint))
                try:
                    result = produce()
                except StopRequested as exc:
                    # The boundary's cancellation is the record: leave the block normally so that
                    # it commits (an exception through it would roll it back), then refuse.
                    refused = exc
                else:
                    ApiIdempotency.objects.create(
                        runtime=self.runtime,
                        key=key,
                        endpoint=operation,
                        status=200,
                        body=result.to_json(),
                        fingerprint=fingerprint,
                    )
                    return result
        except IntegrityError:
            if nested:
                raise
            seen = ApiIdempotency.objects.get(runtime=self.runtime, key=key, endpoint=operation)
            return kind.from_json(_replayable(seen, fingerprint))
        raise refused


class LocalStopWatch:
    """`Client.watch_stop`'s handle, in-process: set by push when the task's Stop commits."""

    def __init__(self, task_id: int) -> None:
        self.task_id = task_id
        self.info: StopWatchInfo | None = None
        self.error: Exception | None = None
        self._stopped = threading.Event()
        self._unwatch = stop_hub().watch_checked(task_id, self._set)

    def _set(self, task_id: int, requested_at: datetime | None) -> None:
        self.info = StopWatchInfo(task_id, True, requested_at)
        self._stopped.set()

    def is_set(self) -> bool:
        return self._stopped.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def cancel(self) -> None:
        self._unwatch()


def request_fingerprint(args: BaseModel) -> str:
    """What was asked, independent of key order and of defaults spelled out or left off: the
    validated arguments, canonically serialised and hashed."""
    canonical = json.dumps(args.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replayable(seen: ApiIdempotency, fingerprint: str) -> Any:
    # Rows stored before fingerprints existed have none; they replay as they always did.
    if seen.fingerprint and seen.fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was already used for a different request; use a new key for new work.",
            field="Idempotency-Key",
        )
    return seen.body


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


@contextlib.contextmanager
def _ledger_errors() -> Iterator[None]:
    """Translate the services' refusals into the errors both doors raise."""
    try:
        yield
    except TaskStopped as exc:
        raise StopRequested(str(exc), task=exc.task_id, item=exc.item_id) from exc
    except TaskClosed as exc:
        raise ClientTaskClosed(str(exc), task=exc.extra.get("task")) from exc
    except IllegalTransition as exc:
        raise Conflict(str(exc), state=exc.current, item=exc.item_id) from exc
    except ToolNotReady as exc:
        raise InvalidRequest(str(exc), code=exc.code, field="mechanism", tool=exc.tool, missing=exc.missing) from exc
    except UnknownMechanism as exc:
        raise InvalidRequest(str(exc), code=exc.code, field="mechanism") from exc
    except HandleConflict as exc:
        raise Conflict(str(exc), code=exc.code, field="handle", item=exc.item_id, handle=exc.handle) from exc
    except DeclarationRefused as exc:
        raise InvalidRequest(str(exc), code=exc.code, field=exc.field) from exc


def task_info(task: Task) -> TaskInfo:
    return TaskInfo(
        id=task.pk,
        title=task.title,
        created_at=task.created_at,
        stop_requested_at=task.stop_requested_at,
        settled_at=task.settled_at,
        stopped=task.stop_requested_at is not None,
        closed_at=task.closed_at,
        closed=task.closed_at is not None,
    )


def item_info(item: WorkItem) -> ItemInfo:
    return ItemInfo(
        id=item.pk,
        task=item.task_id,
        parent=item.parent_id,
        kind=item.kind,
        noun=item.noun,
        state=item.state,
        mechanism=item.mechanism,
        handle=item.handle,
        idempotency_key=item.idempotency_key,
        noun_plural=item.noun_plural,
        label=item.label,
        created_at=item.created_at,
        updated_at=item.updated_at,
        started_at=item.started_at,
        submitted_at=item.submitted_at,
        finished_at=item.finished_at,
        heartbeat_at=item.heartbeat_at,
        lease_until=item.lease_until,
        worker=item.worker,
        cancel_requested_at=item.cancel_requested_at,
        investigate_by=item.investigate_by,
        outcome=item.outcome,
        needs_review=item.review_required,
        detail=item.detail,
        evidence=item.evidence,
    )


def record_info(record: ExternalRecord) -> RecordInfo:
    return RecordInfo(
        id=record.pk,
        item=record.item_id,
        system=record.system,
        record_id=record.record_id,
        effect=record.effect,
        version=record.version,
        reversible=record.reversible,
        reversal=record.reversal,
        link=record.link,
        recorded_at=record.recorded_at,
    )


def stop_info(stop: StopRequest, *, created: bool) -> StopInfo:
    return StopInfo(
        task=stop.task_id,
        requested_at=stop.requested_at,
        actor=stop.actor,
        created=created,
        reason=stop.reason,
        queued_cancelled=stop.queued_cancelled,
        dispatched=stop.dispatched,
        duplicates=stop.duplicates,
    )
