"""Stop as a recorded lifecycle: commit the request, cancel what never started, then dispatch one
cancellation job per item that had crossed the boundary."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from stopdesk import ports
from stopdesk.models import Event, StopRequest, Task
from stopdesk.notify.stop_hook import stop_hook_wanted, stop_requested_notify
from stopdesk.services.events import event_record
from stopdesk.services.sql import ClockNow, is_postgres
from stopdesk.services.stop_notify import CHANNEL, NOTIFY_PAYLOAD
from stopdesk.services.transitions import NOW, items_move, task_gate_exclusive
from stopdesk.states import IN_FLIGHT, SETTLED, ItemState
from stopdesk.tracing import tracer

S = ItemState
log = logging.getLogger(__name__)
STOP_MESSAGE = "Stop requested."  # the stop's event, when no reason was given


@dataclass(frozen=True)
class StopOutcome:
    stop_request: StopRequest
    created: bool
    dispatched: tuple[int, ...] = ()
    # The stop committed but its fan-out did not (the database went away between the two): new
    # work is already refused at the boundary, and the beat's resumer finishes the fan-out.
    fanout_pending: bool = False


def task_request_stop(
    *,
    task_id: int,
    actor: str,
    by: Any = None,
    reason: str = "",
    dispatch: Callable[[list[int]], None] | None = None,
) -> StopOutcome:
    """Idempotent. The first call commits the stop request in its own transaction before anything
    else happens; every later or concurrent call gets the same StopRequest and an audit event."""
    # One span for every door to Stop (the dashboard, the runtime API, the in-process runtime);
    # the cancellation jobs it queues are its children.
    with tracer.start_as_current_span(
        "stopdesk.stop", attributes={"stopdesk.task.id": task_id, "stopdesk.actor": actor}
    ):
        stop_request, created = _commit_stop_request(task_id=task_id, actor=actor, by=by, reason=reason)
        if not created:
            return StopOutcome(stop_request, created=False)
        try:
            ids = stop_fanout(stop_request_id=stop_request.pk, actor=actor, dispatch=dispatch)
        except DatabaseError:
            if connection.in_atomic_block:
                raise  # the caller's transaction holds the stop too: it did not commit
            # The stop is committed and in force; telling the person it failed would be untrue.
            log.exception("stop %s committed; its fan-out failed and is left to the resumer", stop_request.pk)
            connection.close_if_unusable_or_obsolete()
            return StopOutcome(stop_request, created=True, fanout_pending=True)
        stop_request.refresh_from_db()
        return StopOutcome(stop_request, created=True, dispatched=tuple(ids))


def _commit_stop_request(*, task_id: int, actor: str, by: Any, reason: str) -> tuple[StopRequest, bool]:
    # A committed stop is never taken back, so a later Stop that sees one need not queue at the gate.
    if not Task.objects.filter(pk=task_id, stop_requested_at__isnull=False).exists():
        won = _commit_stop_first(task_id=task_id, actor=actor, by=by, reason=reason)
        if won is not None:
            return won, True
    return _count_duplicate_stop(task_id=task_id, actor=actor, reason=reason), False


def _commit_stop_first(*, task_id: int, actor: str, by: Any, reason: str) -> StopRequest | None:
    """The stop request, if this call is the first; None if a stop had already committed.

    Between the clock's read and the commit every waiting watcher, every start queued at the gate
    and every run under way waits on this transaction, so only what must follow the clock is
    there: on PostgreSQL one statement (the task's stop time, the stop request, its event and the
    notification) and the commit. Whether anyone takes the stop hook is read before, and the
    task's row comes with its lock."""
    hook_wanted = stop_hook_wanted()
    with transaction.atomic():
        # The task's gate first, exclusive: it waits for the starts holding it (shared) to commit,
        # and new starts queue behind it (transitions.gate). Then the task row, FOR NO KEY UPDATE,
        # which leaves foreign-key checks (KEY SHARE) from other transactions free, so a
        # concurrent fan-out's event inserts cannot deadlock. Only then is the clock read, so
        # every item that started has started_at < stop_requested_at, and every start after this
        # commits sees the stop. A concurrent second Stop waits at the gate for the first to
        # commit, then finds the stop time set and lets go of both before counting itself as a
        # duplicate.
        task_gate_exclusive(task_id)
        task = Task.objects.select_for_update(no_key=True).filter(pk=task_id).first()
        if task is None:
            raise Task.DoesNotExist(f"Task {task_id} does not exist.")
        if task.stop_requested_at is not None:  # the row is locked: nobody sets it meanwhile
            return None
        written = (_stop_written if is_postgres() else _stop_written_sqlite)(task, actor=actor, by=by, reason=reason)
        if written is None:
            return None
        stop_request, event_id = written
        task.stop_requested_at = stop_request.requested_at
        # The credential hook's outbox row, with the tools in flight as the gate holds them
        # still; its delivery is queued after commit (and found by the sweep if the broker lost it).
        stop_requested_notify(
            task=task,
            stop_request_id=stop_request.pk,
            event_id=event_id,
            requested_at=stop_request.requested_at,
            actor=actor,
            reason=reason,
            wanted=hook_wanted,
        )
        return stop_request


# PostgreSQL: the task's stop time from the database's clock, read as the row is written, its stop
# request, its event (at that time) and the notification, which PostgreSQL delivers when the
# transaction commits, and only then.
STOP_WRITE = f"""
WITH stopped AS (
    UPDATE "{Task._meta.db_table}" SET stop_requested_at = {ClockNow.template}
    WHERE id = %(task)s AND stop_requested_at IS NULL
    RETURNING id, stop_requested_at AS at
), request AS (
    INSERT INTO "{StopRequest._meta.db_table}"
        (task_id, requested_at, requested_by_id, actor, reason, queued_cancelled, dispatched, duplicates)
    SELECT id, at, %(by)s, %(actor)s, %(reason)s, 0, 0, 0 FROM stopped
    RETURNING id
), event AS (
    INSERT INTO "{Event._meta.db_table}" (at, task_id, kind, actor, from_state, to_state, message, data)
    SELECT at, id, 'stop_requested', %(actor)s, '', '', %(message)s, '{{}}'::jsonb FROM stopped
    RETURNING id
)
SELECT request.id, stopped.at, event.id, pg_notify(%(channel)s, {NOTIFY_PAYLOAD.format(task="stopped.id", at="stopped.at")})
FROM stopped, request, event
"""


def _stop_written(task: Task, *, actor: str, by: Any, reason: str) -> tuple[StopRequest, int] | None:
    """The stop's rows in one statement (STOP_WRITE); None if a stop had already set the time."""
    params = {
        "task": task.pk,
        "by": by.pk if by is not None else None,
        "actor": actor,
        "reason": reason,
        "message": reason or STOP_MESSAGE,
        "channel": CHANNEL,
    }
    with connection.cursor() as cursor:
        cursor.execute(STOP_WRITE, params)
        row = cursor.fetchone()
    if row is None:
        return None
    request_id, requested_at, event_id, _ = row
    stop_request = StopRequest(
        pk=request_id, task=task, requested_at=requested_at, requested_by=by, actor=actor, reason=reason
    )
    stop_request._state.adding, stop_request._state.db = False, connection.alias
    return stop_request, event_id


def _stop_written_sqlite(task: Task, *, actor: str, by: Any, reason: str) -> tuple[StopRequest, int] | None:
    """SQLite (which serialises writers, and has no notification): the same rows, one by one."""
    if not Task.objects.filter(pk=task.pk, stop_requested_at__isnull=True).update(stop_requested_at=ClockNow()):
        return None
    requested_at = Task.objects.values_list("stop_requested_at", flat=True).get(pk=task.pk)
    assert requested_at is not None  # set just now, by this transaction
    stop_request = StopRequest.objects.create(
        task=task, requested_at=requested_at, requested_by=by, actor=actor, reason=reason
    )
    event = event_record(kind="stop_requested", actor=actor, task=task, message=reason or STOP_MESSAGE, at=requested_at)
    return stop_request, event.pk


def _count_duplicate_stop(*, task_id: int, actor: str, reason: str) -> StopRequest:
    """A stop after the first, in a transaction of its own holding neither the gate nor the task
    row: the count waits for the stop request's row, which the first stop's fan-out holds while
    it moves the items, and a result being written for one of them may be waiting for the task
    row. Holding the task row here closed that circle (a deadlock)."""
    with transaction.atomic():
        StopRequest.objects.filter(task_id=task_id).update(duplicates=F("duplicates") + 1)
        event_record(kind="stop_duplicate", actor=actor, task=task_id, message=reason or "Stop requested again.")
        return StopRequest.objects.get(task_id=task_id)


def stop_fanout(*, stop_request_id: int, actor: str, dispatch: Callable[[list[int]], None] | None = None) -> list[int]:
    """Cancel queued items set-based, mark in-flight items cancel-requested, and queue their jobs
    after commit. Safe to re-run (the sweeper does, if a process died between the two steps)."""
    with transaction.atomic():
        stop_request = StopRequest.objects.select_for_update().get(pk=stop_request_id)
        if stop_request.fanout_done_at is not None:
            return []
        task_id = stop_request.task_id
        cancelled = items_move(
            where=Q(task_id=task_id),
            from_states=(S.QUEUED,),
            to_state=S.CANCELLED,
            actor=actor,
            kind="stop_cancelled",
            message="Cancelled by Stop before it started.",
            sets={"outcome": "cancelled before it started"},
        )
        in_flight = items_move(
            where=Q(task_id=task_id, cancel_requested_at__isnull=True),
            from_states=tuple(sorted(IN_FLIGHT)),
            to_state=None,
            actor=actor,
            kind="cancel_requested",
            message="Crossed the boundary before Stop; cancelling through its mechanism.",
            sets={"cancel_requested_at": NOW, "next_check_at": NOW},
            return_ids=True,
        )
        assert isinstance(in_flight, list)
        # Work that was in flight when Stop committed but settled before this fan-out reached it
        # (an integration that heard the pushed Stop and ended its run, a result that landed in
        # between) is what Stop met in flight all the same: it carries the stamp whichever got
        # there first. A new statement, so it sees what committed while the one above waited.
        items_move(
            where=Q(task_id=task_id, cancel_requested_at__isnull=True, finished_at__gte=stop_request.requested_at)
            & (Q(started_at__isnull=False) | Q(submitted_at__isnull=False)),
            from_states=tuple(sorted(SETTLED)),
            to_state=None,
            actor=actor,
            kind="cancel_requested",
            message="Was in flight when Stop committed and settled before Stop's fan-out reached it.",
            sets={"cancel_requested_at": stop_request.requested_at},
        )
        StopRequest.objects.filter(pk=stop_request.pk).update(
            queued_cancelled=cancelled, dispatched=len(in_flight), fanout_done_at=timezone.now()
        )
        send = dispatch or dispatch_cancellations
        # robust: the stop has committed whatever happens to the broker. If queuing fails, the
        # items keep cancel_requested_at and a due next_check_at, and the reconcile sweep finds
        # them; the caller must not be told the stop failed.
        transaction.on_commit(lambda: send(in_flight), robust=True)
    return in_flight


def dispatch_cancellations(item_ids: list[int]) -> None:
    """Queue the cancellation of these in-flight items through reconcile's port (`stopdesk.ports`):
    the ledger does not import the reconcile app's tasks (imports go one way)."""
    if item_ids:
        ports.cancellations_dispatch(item_ids)


def stops_resume_fanout(
    *,
    older_than_seconds: int = 30,
    actor: str = "system:stop-resumer",
    dispatch: Callable[[list[int]], None] | None = None,
) -> list[int]:
    """Finish the fan-out of stop requests whose process died between committing the request and
    cancelling the queued items. The request itself already holds the boundary; this only makes
    sure the queued items are recorded cancelled and the in-flight ones get their jobs."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    pending = StopRequest.objects.filter(fanout_done_at__isnull=True, requested_at__lt=cutoff).values_list(
        "pk", flat=True
    )
    resumed = []
    for stop_request_id in pending:
        stop_fanout(stop_request_id=stop_request_id, actor=actor, dispatch=dispatch)
        resumed.append(stop_request_id)
    # Items registered while the stop was committing can miss both the fan-out and the check at
    # registration; they can never start, so they are settled here.
    stopped = Task.objects.filter(stop_requested_at__lt=cutoff).values("pk")
    items_move(
        where=Q(task_id__in=stopped, created_at__lt=cutoff),
        from_states=(S.QUEUED,),
        to_state=S.CANCELLED,
        actor=actor,
        kind="stop_cancelled",
        message="Registered as Stop committed; cancelled before it started.",
        sets={"outcome": "cancelled before it started"},
    )
    return resumed
