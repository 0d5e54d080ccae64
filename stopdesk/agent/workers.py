"""Agent code written as Celery tasks.

    @app.task(base=LedgerTask, bind=True)
    def draft_invoice(self, invoice_id, *, item_id):
        for step in steps:
            self.raise_if_stopped()
            ...

    dispatch(draft_invoice, task=task, noun="draft", args=[42])

The boundary is passed inside the task body, against the database: a `task_prerun` receiver cannot
veto a task, and Celery's revoked ids live only in worker memory (lost on restart, redelivered
messages run anyway). A message for an item that already started or finished does nothing.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from typing import Any

from celery import Task as CeleryTask
from django.conf import settings
from django.db import close_old_connections, connection, transaction

from stopdesk.models import Task, WorkItem
from stopdesk.protocol.errors import StopRequested
from stopdesk.push.hub import stop_hub
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import (
    item_finish,
    item_heartbeat,
    item_register,
    item_report_stopped,
    item_task_id,
    stop_requested,
)
from stopdesk.services.transitions import item_start
from stopdesk.states import Kind

log = logging.getLogger(__name__)


class _Heartbeat(threading.Thread):
    """Keeps the item's lease alive and notices a stop, on its own database connection."""

    def __init__(self, item_id: int, interval: float) -> None:
        super().__init__(name=f"stopdesk-heartbeat-{item_id}", daemon=True)
        self.item_id = item_id
        self.interval = interval
        self.stopped = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.wait(self.interval):
                try:
                    if item_heartbeat(item_id=self.item_id):
                        self.stopped.set()
                except Exception:  # a missed beat is not fatal; the lease covers several
                    log.exception("heartbeat failed for item %s", self.item_id)
        finally:
            connection.close()


class LedgerTask(CeleryTask):  # type: ignore[misc]
    """Base class: claim the item at the boundary, heartbeat, record the result.

    Celery keeps one task object per process and runs several bodies on it at once under the
    threads pool, so nothing of a run is kept on `self`: its heartbeat lives on `self.request`,
    which Celery keeps per run (per thread, per greenlet)."""

    abstract = True

    def __call__(self, *args: Any, item_id: int, **kwargs: Any) -> Any:
        close_old_connections()
        actor = f"celery:{self.name}"
        worker = self.request.hostname or socket.gethostname()
        try:
            item_start(item_id=item_id, actor=actor, worker=worker)
        except StopRequested:
            log.info("item %s not started: its task was stopped", item_id)
            return None
        except IllegalTransition as exc:
            # A redelivered or duplicated message: the ledger already has this item elsewhere.
            log.warning("item %s not started: %s", item_id, exc)
            return None
        beat = _Heartbeat(item_id, settings.STOPDESK["HEARTBEAT_SECONDS"])
        self.request.stopdesk_beat = beat
        # Stop is pushed into the run's flag the moment it commits (one listener per process);
        # the heartbeat's own answer remains a fallback.
        unwatch = stop_hub().watch_checked(item_task_id(item_id=item_id), lambda *_: beat.stopped.set())
        beat.start()
        try:
            result = self.run(*args, item_id=item_id, **kwargs)
        except StopRequested:
            # Every door raises this one class: raise_if_stopped, LocalRuntime, the HTTP client,
            # and the boundary (TaskStopped) when a child of this run was refused after Stop.
            item_report_stopped(item_id=item_id, actor=actor)
            return None
        except Exception as exc:
            item_finish(item_id=item_id, succeeded=False, actor=actor, outcome=f"{type(exc).__name__}: {exc}"[:200])
            raise
        finally:
            unwatch()
            beat.done.set()
            beat.join(timeout=5)
            self.request.stopdesk_beat = None
        item_finish(item_id=item_id, succeeded=True, actor=actor, outcome="completed")
        return result

    def _beat(self) -> _Heartbeat | None:
        return getattr(self.request, "stopdesk_beat", None)

    def stop_requested(self) -> bool:
        """Free between steps: a flag set by push the moment Stop commits (or by the heartbeat's
        answer); one indexed read only when called outside a run."""
        beat = self._beat()
        if beat is not None:
            return beat.stopped.is_set()
        item_id = self.request.kwargs.get("item_id") if self.request.kwargs else None
        if item_id is None:
            return False
        return stop_requested(item_id=item_id)

    def raise_if_stopped(self) -> None:
        if self.stop_requested():
            item_id = self.request.kwargs.get("item_id") if self.request.kwargs else None
            raise StopRequested("Stop was requested; this run stops between steps.", item=item_id)


def dispatch(
    celery_task: CeleryTask,
    *,
    task: Task | int,
    noun: str,
    actor: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    kind: str = Kind.LOCAL_WORKER,
    label: str = "",
    parent: WorkItem | int | None = None,
) -> WorkItem:
    """Register the item first, then queue the message after commit, with the item's id and the
    Celery id stored as its handle (so a revoke can be sent as an optimisation)."""
    celery_id = str(uuid.uuid4())
    with transaction.atomic():
        item = item_register(
            task=task,
            kind=kind,
            noun=noun,
            actor=actor,
            mechanism="celery",
            handle=celery_id,
            label=label,
            parent=parent,
        )
        message_kwargs = {**(kwargs or {}), "item_id": item.pk}
        transaction.on_commit(
            lambda: celery_task.apply_async(args=args or [], kwargs=message_kwargs, task_id=celery_id)
        )
    return item
