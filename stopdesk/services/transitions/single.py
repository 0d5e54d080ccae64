"""One item's move: lock, check the from-state, write the allowed fields, append the event."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.events import event_record
from stopdesk.services.sql import HELD_BY_RUNTIME_SQL, TokenHeld, fetchone_async, server_side_cursor
from stopdesk.services.transitions.settled import UNSETTLED, task_settle_after_commit, tasks_settle
from stopdesk.states import IN_FLIGHT, SETTLED, TERMINAL, ItemState, can_move

if TYPE_CHECKING:
    import psycopg

S = ItemState

# The columns a move may set besides state, outcome and evidence (which it always may). Anything
# else (the boundary's timestamps, the handle, the lease) has its own writer: a transition that
# could set them could, say, start an item without passing the boundary.
FIELDS = frozenset({"next_check_at", "investigate_by", "cancel_requested_at", "needs_review", "outcome"})

# The event of an item Stop met in flight, when its own settle (not Stop's fan-out) records that.
STOP_MET_MESSAGE = "Was in flight when Stop committed and settled after it: part of what Stop met."


def check_fields(names: set[str] | frozenset[str]) -> None:
    unknown = set(names) - FIELDS
    if unknown:
        raise ValueError(
            f"A transition may not set {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(FIELDS))}."
        )


def item_transition(
    *,
    item_id: int,
    to_state: str,
    actor: str,
    outcome: str | None = None,
    evidence: dict[str, Any] | None = None,
    message: str = "",
    kind: str = "transition",
    allowed_from: frozenset[str] | None = None,
    **fields: Any,
) -> WorkItem:
    """The one place a single item changes state: lock, check the from-state, write, audit."""
    check_fields(set(fields))
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if not can_move(item.state, to_state) or (allowed_from is not None and item.state not in allowed_from):
            raise IllegalTransition(item.pk, item.state, to_state)
        before = item.state
        stop_met_at = _stop_met_in_flight(item, to_state, fields)
        item.state = to_state
        item.updated_at = timezone.now()
        if to_state in TERMINAL:
            item.finished_at = item.updated_at
        if to_state == S.UNCERTAIN and item.investigate_by is None and "investigate_by" not in fields:
            item.investigate_by = item.updated_at + timedelta(hours=settings.STOPDESK["INVESTIGATE_BY_HOURS"])
        if outcome is not None:
            item.outcome = outcome
        if evidence:
            item.evidence = {**item.evidence, **evidence}
        if to_state == S.UNCERTAIN and not item.evidence.get("uncertain_because"):
            # Every uncertain item says why, whoever put it there.
            item.evidence = {**item.evidence, "uncertain_because": message or outcome or "no reason was given"}
        for name, value in fields.items():
            setattr(item, name, value)
        if stop_met_at is not None:
            item.cancel_requested_at = stop_met_at
        item.save()
        if stop_met_at is not None:
            event_record(
                kind="cancel_requested",
                actor=actor,
                item=item,
                from_state=before,
                to_state=before,
                message=STOP_MET_MESSAGE,
            )
        event_record(
            kind=kind,
            actor=actor,
            item=item,
            from_state=before,
            to_state=to_state,
            message=message or (outcome or ""),
            data={"evidence": evidence} if evidence else {},
        )
        if to_state in SETTLED:
            task_settle_after_commit(task_id=item.task_id)
    return item


def _stop_met_in_flight(item: WorkItem, to_state: str, fields: dict[str, Any]) -> datetime | None:
    """The task's stop time, when this move settles an item that Stop met in flight and that
    carries no stamp yet (else None). The stamp then belongs to the move itself, so the record is
    complete whether the fan-out or the item's own settle (an integration that heard the push, a
    worker, the supervisor, the reconciler) got there first. Read after the item's lock, in a
    statement of its own, so a stop that committed while this waited for the row is seen."""
    if item.cancel_requested_at is not None or "cancel_requested_at" in fields:
        return None
    if item.state not in IN_FLIGHT or to_state not in SETTLED:
        return None
    return Task.objects.filter(pk=item.task_id).values_list("stop_requested_at", flat=True).first()


def item_late_result(
    *, item: WorkItem, reported: str, actor: str, outcome: str, evidence: dict[str, Any] | None = None
) -> WorkItem:
    """A result that contradicts the item's recorded final state: kept as evidence and an event,
    the item flagged for review, its state untouched. The caller holds the item's row lock (it
    read the state it compares against under it). Reporting the recorded state again changes
    nothing."""
    if item.state == reported:
        return item
    item.needs_review = True
    item.evidence = {**item.evidence, "late_result": {"reported": reported, "outcome": outcome, **(evidence or {})}}
    item.save(update_fields=["needs_review", "evidence"])
    event_record(
        kind="late_result",
        actor=actor,
        item=item,
        from_state=item.state,
        to_state=item.state,
        message=f"Reported {reported} after the item was recorded {item.state}; review required.",
        data={"reported": reported, "outcome": outcome, "evidence": evidence or {}},
    )
    return item


def item_late_result_record(
    *, item_id: int, reported: str, actor: str, outcome: str, evidence: dict[str, Any] | None = None
) -> WorkItem:
    """`item_late_result` for a caller that does not hold the lock yet."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        return item_late_result(item=item, reported=reported, actor=actor, outcome=outcome, evidence=evidence)


# A running item's result in one statement (PostgreSQL): the move and its event, under autocommit
# one round trip. Only from running, which may move to either result; anything else (a late result,
# an item Stop already settled, an item of a stopped task still without Stop's stamp, which
# `item_transition` stamps with its event) matches no row and the caller takes the general path. The same
# statement reads whether the item the caller holds open (`open_item`) is still unsettled: then the
# task cannot settle with this result, and the settle check (a second round trip) is skipped.
_CLOSE_RUNNING_SQL = (
    """
WITH u AS (
    UPDATE stopdesk_workitem w SET state = %(to)s::text, updated_at = n.at, finished_at = n.at, outcome = %(outcome)s::text,
        detail = w.detail || %(detail)s::jsonb
    FROM (SELECT clock_timestamp() AS at) n
    WHERE w.id = %(item)s AND w.state = %(running)s::text
      AND (w.cancel_requested_at IS NOT NULL
           OR NOT EXISTS (SELECT 1 FROM stopdesk_task s WHERE s.id = w.task_id AND s.stop_requested_at IS NOT NULL))
      AND (%(runtime)s::bigint IS NULL
           OR EXISTS (SELECT 1 FROM stopdesk_task t WHERE t.id = w.task_id AND t.runtime_id = %(runtime)s::bigint))
      AND """
    + HELD_BY_RUNTIME_SQL
    + """
    RETURNING w.id, w.task_id, w.updated_at
),
e AS (
    INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
    SELECT u.updated_at, u.task_id, u.id, 'transition', %(actor)s::text, %(running)s::text, %(to)s::text,
           %(outcome)s::text, %(data)s::jsonb
    FROM u
)
SELECT u.task_id, EXISTS (
    SELECT 1 FROM stopdesk_workitem h
    WHERE h.id = %(open)s::bigint AND h.id <> u.id AND h.task_id = u.task_id AND h.state = ANY(%(unsettled)s::text[])
) FROM u
"""
)


def item_close_running(
    *,
    item_id: int,
    succeeded: bool,
    actor: str,
    outcome: str = "",
    runtime_id: int | None = None,
    open_item: int | None = None,
    detail: dict[str, Any] | None = None,
    settle: bool = True,
) -> bool:
    """Record the result of a running item (of the runtime `runtime_id`, when given) in one
    statement. Returns False, having written nothing, when the item is not running (or not there),
    or when its task stopped and Stop's stamp is not on it yet: the caller then reports through
    `item_finish`, which knows late results and writes the stamp with its event. PostgreSQL only.

    `open_item`: an item of the same task that the caller holds open and settles itself later
    (through a move that checks whether the task settled), such as a framework's run around its
    tool calls. While it is unsettled the task cannot settle, so this result is one round trip.
    A caller that settles `open_item` while such a result may still be committing checks the
    task afterwards (`task_settle_check`).

    `detail`: facts the caller itself learnt with the result (the gateway: the upstream's id of
    an MCP call), merged into the item's detail key by key in the same statement and kept on its
    event. Never a runtime's words: those go through `item_record_detail`, which checks them.

    `settle=False`: the caller checks whether the task settled itself (`task_settle_check`), once
    it has done what it had to do first (the gateway answers its client); the sweep
    (`tasks_settle_sweep`) does it should the caller die in between."""
    params = _close_running_params(item_id, succeeded, actor, outcome, runtime_id, open_item, detail)
    with server_side_cursor() as cursor:
        cursor.execute(_CLOSE_RUNNING_SQL, params)
        row = cursor.fetchone()
    if row is None:
        return False
    task_id, held_open = row
    if not held_open and settle:
        task_settle_after_commit(task_id=task_id)
    return True


async def item_close_running_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    item_id: int,
    succeeded: bool,
    actor: str,
    outcome: str = "",
    detail: dict[str, Any] | None = None,
) -> bool:
    """`item_close_running` with `settle=False`, on an asyncio caller's own connection (autocommit,
    so the statement is its commit): the MCP gateway's loop, which then waits for no thread. False,
    having written nothing, as there: the caller then reports through `item_finish`."""
    params = _close_running_params(item_id, succeeded, actor, outcome, None, None, detail)
    return await fetchone_async(conn, _CLOSE_RUNNING_SQL, params) is not None


async def item_close_running_of_runtime_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    item_id: int,
    succeeded: bool,
    actor: str,
    outcome: str,
    runtime_id: int,
    open_item: int | None,
    held: TokenHeld | None = None,
) -> tuple[int, bool] | None:
    """`item_close_running` of a runtime's item, on an asyncio caller's own connection inside the
    caller's transaction (the agent door's): its task, and whether `open_item` holds that task open;
    None when it wrote nothing (the caller then rolls its transaction back and reports through
    `item_close_running` in a thread, which knows late results), as when the runtime no longer
    holds the token `held` the caller remembered. A task not held open is checked by the caller
    once its transaction has committed (`tasks_settle_async`)."""
    params = _close_running_params(item_id, succeeded, actor, outcome, runtime_id, open_item, None)
    params.update(TokenHeld.params(held))
    row = await fetchone_async(conn, _CLOSE_RUNNING_SQL, params)
    return None if row is None else (int(row[0]), bool(row[1]))


def _close_running_params(
    item_id: int,
    succeeded: bool,
    actor: str,
    outcome: str,
    runtime_id: int | None,
    open_item: int | None,
    detail: dict[str, Any] | None,
) -> dict[str, Any]:
    to_state = S.COMPLETED if succeeded else S.FAILED
    assert can_move(S.RUNNING, to_state) and to_state in SETTLED
    return {
        "item": item_id,
        "to": to_state.value,
        "outcome": outcome,
        "actor": actor,
        "runtime": runtime_id,
        **TokenHeld.params(None),
        "running": S.RUNNING.value,
        "open": open_item,
        "unsettled": [s.value for s in UNSETTLED],
        "detail": json.dumps(detail or {}),
        "data": json.dumps({"detail": detail} if detail else {}),
    }


def task_settle_check(*, task_id: int) -> bool:
    """Whether the task settled: written now (with its event) if every item has settled."""
    return bool(tasks_settle(task_ids=[task_id]))
