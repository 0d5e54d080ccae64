"""When a task's work has settled: Task.settled_at.

A task is settled when none of its items is queued, running or awaiting reconciliation (uncertain
counts as settled, as everywhere: it has a deadline and a place in the review queue). settled_at is
the moment the last item got there. It is written once; a late result arriving afterwards flags
the item for review (needs_review) and leaves settled_at as it was, because no work resumed. Only
new work (an item registered on a settled task that was not stopped) clears it, and it is written
again when that work settles.

The check runs after the moving transaction commits, in its own conditional UPDATE: two
transactions settling a task's last two items cannot both miss it (the later commit's check sees
the earlier commit), and no task-row lock is taken while item rows are locked, so it cannot
deadlock with the boundary (which locks the task first, then its item).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from stopdesk.models import Task, WorkItem
from stopdesk.services.events import event_record
from stopdesk.states import SETTLED, ItemState

S = ItemState
UNSETTLED = (S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION)
ACTOR = "system:ledger"


def tasks_settle(*, task_ids: Iterable[int]) -> list[int]:
    """Write settled_at on each of these tasks whose items have all settled. Returns those written."""
    ids = sorted(set(task_ids))
    if not ids:
        return []
    any_item = WorkItem.objects.filter(task=OuterRef("pk"))
    unsettled = any_item.filter(state__in=UNSETTLED)
    written = []
    for task_id in ids:
        with transaction.atomic():
            won = (
                Task.objects.filter(pk=task_id, settled_at__isnull=True)
                .filter(Exists(any_item), ~Exists(unsettled))
                .update(settled_at=Now())
            )
            if won:
                event_record(kind="task_settled", actor=ACTOR, task=task_id, message="Every item has settled.")
                written.append(task_id)
    return written


def task_settle_after_commit(*, task_id: int) -> None:
    transaction.on_commit(lambda: tasks_settle(task_ids=[task_id]), robust=True)


def tasks_settle_after_move(*, where: Q, to_state: str | None) -> None:
    """After a set-based move into a settled state: the tasks it touched may have settled."""
    if to_state not in SETTLED:
        return

    def check() -> None:
        task_ids = WorkItem.objects.filter(where, state=to_state).values_list("task_id", flat=True).distinct()
        tasks_settle(task_ids=list(task_ids))

    transaction.on_commit(check, robust=True)


def task_reopen(*, task_id: int, actor: str) -> None:
    """New work on a settled task that was not stopped: it is no longer settled."""
    if Task.objects.filter(pk=task_id, settled_at__isnull=False).update(settled_at=None):
        event_record(kind="task_reopened", actor=actor, task=task_id, message="New work was registered.")
