"""When a task's work has settled: Task.settled_at.

A task is settled when none of its items is queued, running or awaiting reconciliation (uncertain
counts as settled, as everywhere: it has a deadline and a place in the review queue). settled_at is
the moment the last item got there. It is written once; a late result arriving afterwards flags
the item for review (needs_review) and leaves settled_at as it was, because no work resumed. Only
new work (an item registered on a settled task that was not stopped) clears it, and it is written
again when that work settles.

The check runs after the moving transaction commits, as one conditional UPDATE (with its audit
events in the same statement on PostgreSQL): two transactions settling a task's last two items
cannot both miss it (the later commit's check sees the earlier commit), only one of them writes
it, and no task-row lock is taken while item rows are locked, so it cannot deadlock with a
registration (which locks the task row first, then writes its item). It takes no gate
(`transitions.gate`), so it never waits for Stop or the starts. A registration that held the
task row while the UPDATE waited for it is seen by a second look with a fresh snapshot
(`stopdesk_task_busy`, below).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from stopdesk.models import Event, Task, WorkItem
from stopdesk.services.events import event_record
from stopdesk.services.sql import is_postgres
from stopdesk.states import SETTLED, ItemState

if TYPE_CHECKING:
    import psycopg

S = ItemState
UNSETTLED = (S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION)
ACTOR = "system:ledger"
MESSAGE = "Every item has settled."

_SETTLE_SQL = """
    UPDATE stopdesk_task SET settled_at = %s
    WHERE settled_at IS NULL AND id IN ({tasks})
      AND EXISTS (SELECT 1 FROM stopdesk_workitem w WHERE w.task_id = stopdesk_task.id)
      AND {unsettled_none}
    RETURNING id, settled_at
"""
_OPEN_ITEMS = "SELECT 1 FROM stopdesk_workitem w WHERE w.task_id = stopdesk_task.id AND w.state IN (%s, %s, %s)"
# The statement's snapshot is taken before it waits for a task row, and a registration holds that
# row until it commits its new item, which an open-items check in the statement cannot see: the task would
# read settled with new work running. `stopdesk_task_busy` (migration 0017) takes the row, then
# looks again with a fresh snapshot, which includes every registration that held the row; a
# registration after it waits for the row and reopens the task. It looks without the lock first,
# so only a task whose items all look settled is locked.
_UNSETTLED_NONE = {
    "postgresql": "NOT stopdesk_task_busy(stopdesk_task.id, %s)",
    "sqlite": f"NOT EXISTS ({_OPEN_ITEMS})",
}


def tasks_settle(*, task_ids: Iterable[int] | None = None, items_where: Q | None = None) -> list[int]:
    """Write settled_at on each task (given by id, or as the tasks of the items matching
    `items_where`) whose items have all settled. Returns the tasks written."""
    if items_where is not None:
        tasks_sql, tasks_params = WorkItem.objects.filter(items_where).values("task_id").query.sql_with_params()
    else:
        ids = sorted(set(task_ids or ()))
        if not ids:
            return []
        tasks_sql, tasks_params = Task.objects.filter(pk__in=ids).values("pk").query.sql_with_params()
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute(*_settle_statement(tasks_sql, list(tasks_params)))
            return [row[0] for row in cursor.fetchall()]
    update = _SETTLE_SQL.format(tasks=tasks_sql, unsettled_none=_UNSETTLED_NONE[connection.vendor])
    params = [timezone.now(), *tasks_params, *UNSETTLED]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(update, params)
        written = cursor.fetchall()
        Event.objects.bulk_create(
            [
                Event(at=at, task_id=task_id, kind="task_settled", actor=ACTOR, message=MESSAGE)
                for task_id, at in written
            ]
        )
    return [row[0] for row in written]


def _settle_statement(tasks_sql: str, tasks_params: list[Any]) -> tuple[str, list[Any]]:
    """PostgreSQL's check: the UPDATE and its events in one statement, as the set-based moves do."""
    update = _SETTLE_SQL.format(tasks=tasks_sql, unsettled_none=_UNSETTLED_NONE["postgresql"])
    statement = f"""WITH settled AS ({update})
        INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
        SELECT settled_at, id, NULL, 'task_settled', %s, '', '', %s, '{{}}'::jsonb FROM settled
        ORDER BY id  -- ids in task order, as the moves write theirs
        RETURNING task_id"""
    return statement, [timezone.now(), *tasks_params, list(UNSETTLED), ACTOR, MESSAGE]


async def tasks_settle_async(conn: psycopg.AsyncConnection[Any], task_ids: Iterable[int]) -> list[int]:
    """`tasks_settle` of the given tasks on an asyncio caller's own connection (autocommit), once
    the caller's move has committed (the agent door's results): PostgreSQL's same statement."""
    ids = sorted(set(task_ids))
    if not ids:
        return []
    statement, params = _settle_statement("SELECT unnest(%s::bigint[])", [ids])
    async with conn.cursor() as cursor:
        await cursor.execute(statement, params)
        return [row[0] for row in await cursor.fetchall()]


def tasks_settle_sweep(*, after: int = 0, scan: int = 2000) -> tuple[list[int], int]:
    """The safety net for the settle checks that run after a commit: a process that died between
    its commit and its check, or two writers that each saw the other's item still open (a result
    under a run's open item while someone else settles the run). Looks at the next `scan` tasks
    not settled yet with an id above `after` (an index of their own, so neither the history nor
    the number of live tasks makes a run longer), and writes settled_at on those whose items have
    all settled. Returns the tasks written and the `after` for the next run (0 once it reached the
    end: the next run starts again from the first)."""
    window = list(
        Task.objects.filter(settled_at__isnull=True, pk__gt=after).order_by("pk").values_list("pk", flat=True)[:scan]
    )
    if not window:
        return [], 0
    candidates = (
        Task.objects.filter(pk__in=window)
        .filter(Exists(WorkItem.objects.filter(task_id=OuterRef("pk"))))
        .exclude(Exists(WorkItem.objects.filter(task_id=OuterRef("pk"), state__in=UNSETTLED)))
        .values_list("pk", flat=True)
    )
    return tasks_settle(task_ids=list(candidates)), (window[-1] if len(window) == scan else 0)


def task_settle_after_commit(*, task_id: int) -> None:
    transaction.on_commit(lambda: tasks_settle(task_ids=[task_id]), robust=True)


def tasks_settle_after_move(*, where: Q, to_state: str | None, ids: Iterable[int] | None = None) -> None:
    """After a set-based move into a settled state (call it after the move, not before: outside a
    transaction on_commit runs at once): the tasks it touched may have settled."""
    if to_state not in SETTLED:
        return
    items = Q(pk__in=list(ids)) if ids is not None else where
    transaction.on_commit(lambda: tasks_settle(items_where=items & Q(state=to_state)), robust=True)


def task_reopen(*, task_id: int, actor: str) -> None:
    """New work on a settled task that was not stopped: it is no longer settled."""
    if Task.objects.filter(pk=task_id, settled_at__isnull=False).update(settled_at=None):
        event_record(kind="task_reopened", actor=actor, task=task_id, message="New work was registered.")
