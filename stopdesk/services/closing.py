"""When a task is over: Task.closed_at.

"Every item has settled" is not "the task is over": an agent that registers each child just
before it sends it settles its task between two children, many times a second. So a task stays
open, offering Stop, until one of two things closes it:

- its runtime says so (`task_close`, from every door: the in-process runtime, the HTTP API, both
  clients), when it knows no more work will come;
- it stayed idle past STOPDESK["TASK_IDLE_CLOSE_MINUTES"]: settled that long ago, or registered
  nothing that long after it was created (`tasks_close_idle`, a periodic sweep, so the close is a
  recorded event with its time, not a rule each reader computes).

A closed task takes no new work: a registration is refused (TaskClosed) and writes nothing.
Closing takes the task's gate exclusive, as Stop does (`transitions.gate`); a registration holds
it shared while it checks and inserts, so a registration either commits before the close or sees
it. Stop stays possible on a closed task and is recorded like any other: it changes nothing that
could still start, and a person's Stop is never dropped.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.services.errors import TaskClosed
from stopdesk.services.events import event_record
from stopdesk.services.sql import ClockNow
from stopdesk.services.transitions import task_gate_exclusive, task_gate_shared

IDLE_ACTOR = "system:idle-close"
IDLE_BATCH = 500


def task_close(*, task_id: int, actor: str, reason: str = "") -> tuple[Task, bool]:
    """Close the task. Idempotent: returns the task and whether this call closed it."""
    with transaction.atomic():
        task_gate_exclusive(task_id)
        closed = Task.objects.filter(pk=task_id, closed_at__isnull=True).update(closed_at=ClockNow())
        if closed:
            event_record(kind="task_closed", actor=actor, task=task_id, message=reason or "Closed by its runtime.")
        return Task.objects.get(pk=task_id), bool(closed)


def task_open_check(*, task_id: int) -> None:
    """Refuse new work on a closed task. Call it inside the registering transaction, holding the
    task's gate shared (taken first here): a close then waits for this registration to commit, and
    a registration after the close reads it (a statement of its own, so a fresh snapshot)."""
    task_gate_shared(task_id)
    if Task.objects.filter(pk=task_id, closed_at__isnull=False).exists():
        raise TaskClosed(task_id)


def idle_close_after() -> timedelta:
    return timedelta(minutes=settings.STOPDESK["TASK_IDLE_CLOSE_MINUTES"])


def _idle(cutoff: datetime) -> Q:
    no_items = ~Exists(WorkItem.objects.filter(task_id=OuterRef("pk")))
    return Q(settled_at__lt=cutoff) | (Q(settled_at__isnull=True, created_at__lt=cutoff) & Q(no_items))


def tasks_close_idle(*, now: datetime | None = None, batch: int = IDLE_BATCH) -> list[int]:
    """Close open tasks idle past the timeout: settled before the cutoff (new work clears
    settled_at), or without any item since before it. Each close is checked again under the gate,
    so a registration that reopened the task meanwhile keeps it open. Bounded per run; the next
    run carries on."""
    after = idle_close_after()
    cutoff = (now or timezone.now()) - after
    candidates = list(
        Task.objects.filter(closed_at__isnull=True)
        .filter(_idle(cutoff))
        .order_by("settled_at", "pk")
        .values_list("pk", flat=True)[:batch]
    )
    minutes = round(after.total_seconds() / 60)
    message = f"Closed after {minutes} minute{'s' if minutes != 1 else ''} with no new work."
    closed = []
    for task_id in candidates:
        with transaction.atomic():
            task_gate_exclusive(task_id)
            if (
                Task.objects.filter(pk=task_id, closed_at__isnull=True)
                .filter(_idle(cutoff))
                .update(closed_at=ClockNow())
            ):
                event_record(kind="task_closed", actor=IDLE_ACTOR, task=task_id, message=message)
                closed.append(task_id)
    return closed
