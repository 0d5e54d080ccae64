"""Set-based state moves: one UPDATE and its audit events, whatever the number of rows.
Part of `stopdesk.services.transitions`, the one place that writes an item's state.

On PostgreSQL the UPDATE and the INSERT of its events are one statement (a data-modifying CTE),
so the statement count does not grow with the item count and no row is moved without its event.
A move may also carry values of each item's own (`rows`): columns that differ by item, keys merged
into its evidence, and its event's data; they travel as arrays in the same statement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Field, OuterRef, Q, Subquery
from django.utils import timezone

from stopdesk.models import Event, Task, WorkItem
from stopdesk.notify.outbox import MovedItem, notify_for_events
from stopdesk.services.sql import is_postgres
from stopdesk.services.transitions.settled import tasks_settle_after_move
from stopdesk.services.transitions.single import STOP_MET_MESSAGE, check_fields
from stopdesk.states import IN_FLIGHT, SETTLED, TERMINAL, can_move

NOW = object()  # marks a column to be set to the database clock
STOP_AT = object()  # marks a column to be set to the item's task's stop_requested_at


@dataclass(frozen=True)
class Row:
    """One item's own values in a set-based move: columns that differ by item (every row of a
    move sets the same ones), keys merged into its evidence at the top level (as item_transition
    merges), and the data of its event."""

    sets: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


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
    rows: Mapping[int, Row] | None = None,
) -> list[int] | int:
    """Move every item matching `where` and in one of `from_states` to `to_state` (None keeps the
    state and only sets columns). With `rows`, only those items, each with its own values.
    Returns the count, or the ids when asked."""
    # One from-state per move, so each event can name it (RETURNING cannot see old values).
    if to_state is not None and (len(from_states) != 1 or not can_move(from_states[0], to_state)):
        raise ValueError(f"{from_states} -> {to_state} is not one allowed move")
    check_fields(set(sets or {}) | {name for row in (rows or {}).values() for name in row.sets})
    columns = dict(sets or {})
    if to_state is not None:
        columns["state"] = to_state
        if to_state in TERMINAL:
            columns.setdefault("finished_at", NOW)
    columns["updated_at"] = NOW
    if rows is not None:
        if not rows:
            return [] if return_ids else 0
        per_row = {name for row in rows.values() for name in row.sets}
        if (
            any(set(row.sets) != per_row for row in rows.values())
            or per_row & set(columns)
            or "evidence" in per_row | set(columns)
        ):
            raise ValueError("every row must set the same columns, none of them shared, and not `evidence`")
    selection = WorkItem.objects.filter(where, state__in=from_states).values("id")
    move = _move_postgres if is_postgres() else _move_portable
    # A move that notifies (items becoming uncertain, stopdesk/notify) writes its outbox rows in
    # the same transaction, and needs the ids for them; any other move stays one statement.
    notifies = MovedItem.notifies(kind=kind, from_state=from_states[0], to_state=to_state)
    stamps = _settles_in_flight(from_states, to_state, columns, rows)
    with transaction.atomic(savepoint=False) if notifies or stamps else contextlib.nullcontext():
        if stamps:
            _stamp_stop_met(where=where, from_state=from_states[0], actor=actor, rows=rows)
        moved = move(selection, from_states, to_state, columns, actor, kind, message, return_ids or notifies, rows)
        if notifies:
            notify_for_events(MovedItem.many(moved, kind=kind, from_state=from_states[0], to_state=to_state))
    tasks_settle_after_move(where=where, to_state=to_state, ids=list(rows) if rows is not None else None)
    return len(moved) if notifies and not return_ids else moved


def _settles_in_flight(from_states, to_state, columns, rows) -> bool:  # type: ignore[no-untyped-def]
    """Whether this move settles in-flight items without setting Stop's stamp itself."""
    given = set(columns) | {name for row in (rows or {}).values() for name in row.sets}
    return from_states[0] in IN_FLIGHT and to_state in SETTLED and "cancel_requested_at" not in given


def _stamp_stop_met(*, where: Q, from_state: str, actor: str, rows: Mapping[int, Row] | None) -> None:
    """Items of a stopped task that this move settles from in flight, and that Stop's fan-out has
    not stamped yet, get the stamp (the stop's own time) and its event first, in the same
    transaction: the stamp is part of the settle, whoever gets there first (as in
    `item_transition`). A statement of its own, so it sees a stop committed before it started."""
    unstamped = where & Q(
        cancel_requested_at__isnull=True,
        task_id__in=Task.objects.filter(stop_requested_at__isnull=False).values("pk"),
    )
    if rows is not None:
        unstamped &= Q(pk__in=list(rows))
    items_move(
        where=unstamped,
        from_states=(from_state,),
        to_state=None,
        actor=actor,
        kind="cancel_requested",
        message=STOP_MET_MESSAGE,
        sets={"cancel_requested_at": STOP_AT},
    )


def _move_postgres(selection, from_states, to_state, columns, actor, kind, message, return_ids, rows):  # type: ignore[no-untyped-def]
    # The filter is applied to the updated table itself. As `id IN (subquery)`, a stale row
    # estimate let the planner pick a nested loop that was quadratic in the item count.
    where_sql, where_params = selection.query.get_compiler(connection=connection).compile(selection.query.where)
    assignments, params = [], []
    for name, value in columns.items():
        if value is NOW:
            assignments.append(f"{name} = clock_timestamp()")
        elif value is STOP_AT:
            assignments.append(
                f"{name} = (SELECT t.stop_requested_at FROM stopdesk_task t WHERE t.id = stopdesk_workitem.task_id)"
            )
        else:
            assignments.append(f"{name} = %s")
            params.append(value)
    values_sql, values_params, data_sql = "", [], "'{}'::jsonb"
    if rows is not None:
        # Each item's values as parallel arrays joined on id: one statement for any number of
        # rows, and few parameters. Array columns are prefixed, so no name is ambiguous.
        ids = list(rows)
        names = sorted(next(iter(rows.values())).sets)
        arrays = ["%s::bigint[]"]
        values_params.append(ids)
        for name in names:
            model_field = WorkItem._meta.get_field(name)
            assert isinstance(model_field, Field), name
            arrays.append(f"%s::{model_field.db_type(connection)}[]")
            values_params.append([model_field.get_db_prep_save(rows[i].sets[name], connection) for i in ids])
            assignments.append(f"{name} = v.v_{name}")
        json_field = WorkItem._meta.get_field("evidence")
        arrays += ["%s::jsonb[]", "%s::jsonb[]"]
        values_params.append([json_field.get_db_prep_save(rows[i].evidence, connection) for i in ids])
        values_params.append([json_field.get_db_prep_save(rows[i].data, connection) for i in ids])
        assignments.append("evidence = stopdesk_workitem.evidence || v.v_evidence")
        columns_sql = ", ".join(["v_id", *(f"v_{n}" for n in names), "v_evidence", "v_data"])
        values_sql = f"v AS (SELECT * FROM unnest({', '.join(arrays)}) AS v({columns_sql})),"
        where_sql = f"stopdesk_workitem.id = v.v_id AND {where_sql}"
        data_sql = "v_data"
    sql = f"""
        WITH {values_sql} moved AS (
            UPDATE stopdesk_workitem SET {", ".join(assignments)}
            {"FROM v" if rows is not None else ""}
            WHERE {where_sql}
            RETURNING stopdesk_workitem.id, task_id, state, updated_at{", v.v_data" if rows is not None else ""}
        ),
        events AS (
            INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
            SELECT updated_at, task_id, id, %s, %s, COALESCE(%s::text, state), state, %s, {data_sql} FROM moved
            -- By task: a task's events get consecutive ids, the order the audit sealer chains them in.
            ORDER BY task_id, id
        )
        SELECT {"id" if return_ids else "count(*)"} FROM moved
    """
    from_state = from_states[0] if to_state is not None else None
    all_params = [*values_params, *params, *where_params, kind, actor, from_state, message]
    with connection.cursor() as cursor:
        cursor.execute(sql, all_params)
        result = cursor.fetchall()
    return [r[0] for r in result] if return_ids else result[0][0]


def _move_portable(selection, from_states, to_state, columns, actor, kind, message, return_ids, rows):  # type: ignore[no-untyped-def]
    now = timezone.now()
    stop_at = Subquery(Task.objects.filter(pk=OuterRef("task_id")).values("stop_requested_at")[:1])
    values = {k: (now if v is NOW else stop_at if v is STOP_AT else v) for k, v in columns.items()}
    if rows is not None:
        selection = selection.filter(pk__in=list(rows))
    with transaction.atomic():
        found = list(selection.values_list("id", "task_id", "state", "evidence"))
        ids = [r[0] for r in found]
        if rows is None:
            for start in range(0, len(ids), 500):
                WorkItem.objects.filter(id__in=ids[start : start + 500]).update(**values)
        else:
            for item_id, _, _, evidence in found:
                row = rows[item_id]
                WorkItem.objects.filter(id=item_id).update(**values, **row.sets, evidence={**evidence, **row.evidence})
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
                    data=rows[item_id].data if rows is not None else {},
                )
                for item_id, task_id, state, _ in found
            ],
            batch_size=500,
        )
    return ids if return_ids else len(ids)


@dataclass(frozen=True)
class Schedule:
    """When to look at an item next, and the reconciler's progress to keep in its evidence, written
    only while the item is still in `state` (None: whatever its state)."""

    state: str | None
    next_check_at: datetime | None
    progress: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None  # merged into the item's evidence (what a look found)


_SCHEDULE_SQL = """
UPDATE stopdesk_workitem w
SET next_check_at = v.next_check_at,
    evidence = w.evidence || COALESCE(v.extra, '{}'::jsonb)
               || CASE WHEN v.progress IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('reconcile', v.progress) END
FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::jsonb[], %s::jsonb[])
     AS v(id, state, next_check_at, progress, extra)
WHERE w.id = v.id AND (v.state IS NULL OR w.state = v.state)
RETURNING w.id
"""


def items_schedule(plans: Mapping[int, Schedule]) -> set[int]:
    """Set each item's next check (and progress), where its state is still the one decided on.
    Not a state change, so no event: the cancellation attempt is the record. Returns the ids
    written; an item whose state moved meanwhile is left to whoever moved it."""
    ids = sorted(plans)
    if not ids:
        return set()
    if is_postgres():
        evidence_field = WorkItem._meta.get_field("evidence")
        params: list[Any] = [
            ids,
            [plans[i].state for i in ids],
            [plans[i].next_check_at for i in ids],
            [
                None if plans[i].progress is None else evidence_field.get_db_prep_save(plans[i].progress, connection)
                for i in ids
            ],
            [
                None if not plans[i].evidence else evidence_field.get_db_prep_save(plans[i].evidence, connection)
                for i in ids
            ],
        ]
        with connection.cursor() as cursor:
            cursor.execute(_SCHEDULE_SQL, params)
            return {row[0] for row in cursor.fetchall()}
    written = set()
    with transaction.atomic():
        for item_id in ids:
            plan = plans[item_id]
            item = WorkItem.objects.select_for_update().only("state", "evidence").get(pk=item_id)
            if plan.state is not None and item.state != plan.state:
                continue
            values: dict[str, Any] = {"next_check_at": plan.next_check_at}
            if plan.progress is not None or plan.evidence:
                values["evidence"] = {**item.evidence, **(plan.evidence or {})}
                if plan.progress is not None:
                    values["evidence"]["reconcile"] = plan.progress
            WorkItem.objects.filter(pk=item_id).update(**values)
            written.add(item_id)
    return written
