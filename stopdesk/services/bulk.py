"""Set-based state moves: one UPDATE and its audit events, whatever the number of rows.

On PostgreSQL the UPDATE and the INSERT of its events are one statement (a data-modifying CTE),
so the statement count does not grow with the item count and no row is moved without its event.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from stopdesk.models import Event, WorkItem
from stopdesk.services.sql import is_postgres
from stopdesk.states import TERMINAL, can_move

NOW = object()  # marks a column to be set to the database clock


def items_move(
    *,
    where: Q,
    from_states: tuple[str, ...],
    to_state: str | None,
    actor: str,
    kind: str,
    message: str,
    sets: dict[str, Any] | None = None,
    return_ids: bool = False,
) -> list[int] | int:
    """Move every item matching `where` and in one of `from_states` to `to_state` (None keeps the
    state and only sets columns). Returns the count, or the ids when asked."""
    # One from-state per move, so each event can name it (RETURNING cannot see old values).
    if to_state is not None and (len(from_states) != 1 or not can_move(from_states[0], to_state)):
        raise ValueError(f"{from_states} -> {to_state} is not one allowed move")
    columns = dict(sets or {})
    if to_state is not None:
        columns["state"] = to_state
        if to_state in TERMINAL:
            columns.setdefault("finished_at", NOW)
    columns["updated_at"] = NOW
    selection = WorkItem.objects.filter(where, state__in=from_states).values("id")
    if is_postgres():
        return _move_postgres(selection, from_states, to_state, columns, actor, kind, message, return_ids)
    return _move_portable(selection, to_state, columns, actor, kind, message, return_ids)


def _move_postgres(selection, from_states, to_state, columns, actor, kind, message, return_ids):  # type: ignore[no-untyped-def]
    # The filter is applied to the updated table itself. As `id IN (subquery)`, a stale row
    # estimate let the planner pick a nested loop that was quadratic in the item count.
    where_sql, where_params = selection.query.get_compiler(connection=connection).compile(selection.query.where)
    assignments, params = [], []
    for name, value in columns.items():
        if value is NOW:
            assignments.append(f"{name} = clock_timestamp()")
        else:
            assignments.append(f"{name} = %s")
            params.append(value)
    sql = f"""
        WITH moved AS (
            UPDATE stopdesk_workitem SET {", ".join(assignments)}
            WHERE {where_sql}
            RETURNING id, task_id, state, updated_at
        ),
        events AS (
            INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
            SELECT updated_at, task_id, id, %s, %s, COALESCE(%s::text, state), state, %s, '{{}}'::jsonb FROM moved
        )
        SELECT {"id" if return_ids else "count(*)"} FROM moved
    """
    from_state = from_states[0] if to_state is not None else None
    all_params = [*params, *where_params, kind, actor, from_state, message]
    with connection.cursor() as cursor:
        cursor.execute(sql, all_params)
        rows = cursor.fetchall()
    return [r[0] for r in rows] if return_ids else rows[0][0]


def _move_portable(selection, to_state, columns, actor, kind, message, return_ids):  # type: ignore[no-untyped-def]
    now = timezone.now()
    values = {k: (now if v is NOW else v) for k, v in columns.items()}
    with transaction.atomic():
        rows = list(selection.values_list("id", "task_id", "state"))
        ids = [r[0] for r in rows]
        for start in range(0, len(ids), 500):
            WorkItem.objects.filter(id__in=ids[start : start + 500]).update(**values)
        Event.objects.bulk_create(
            [
                Event(
                    at=now,
                    task_id=task_id,
                    item_id=item_id,
                    kind=kind,
                    actor=actor,
                    from_state=state,
                    to_state=to_state or state,
                    message=message,
                )
                for item_id, task_id, state in rows
            ],
            batch_size=500,
        )
    return ids if return_ids else len(ids)
