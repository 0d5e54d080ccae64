"""The cancellation boundary: the one check before an item starts and before an external action
is submitted. Part of `stopdesk.services.transitions`, the one place that writes an item's state.

On PostgreSQL it is a single statement. It passes the task's gate (`transitions.gate`): an
advisory lock that starts hold shared and Stop takes exclusive before it reads the clock. So a
start either commits before the stop request is written (its started_at is earlier than
stop_requested_at), or waits for the stop to commit and then sees it: the gate and the stop check
are one volatile function, `stopdesk_gate`, whose check runs with a fresh snapshot, taken after
the wait (the statement's own snapshot, from before the wait, would still read "not stopped").
There is no window in which a start reads "not stopped" and commits after the stop.

The starts of one task overlap, each holding the gate shared until its commit (WAL flush
included). A share lock on the task row would let them overlap too, but row locks have no
queue: share lockers kept joining while a waiting Stop needed the row exclusively, and a burst of
starts kept Stop waiting about a second. The lock manager queues a new shared request behind a
waiting exclusive one, so Stop waits only for the starts already holding the gate.

SQLite (the zero-setup local run) takes its write lock at BEGIN (transaction_mode IMMEDIATE), so a
read-then-write inside one transaction is serialised against Stop the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.protocol.spec import ItemSpec
from stopdesk.services.errors import Held, IllegalTransition, TaskClosed, TaskStopped
from stopdesk.services.events import event_record
from stopdesk.services.sql import HELD_BY_RUNTIME_SQL, TokenHeld, fetchone_async, is_postgres, server_side_cursor
from stopdesk.services.transitions.settled import task_settle_after_commit
from stopdesk.states import ItemState

if TYPE_CHECKING:
    import psycopg

S = ItemState

_BOUNDARY_SQL = """
WITH t AS (
    SELECT id, stopdesk_gate(id) AS stopped
    FROM stopdesk_task
    WHERE id = (SELECT task_id FROM stopdesk_workitem WHERE id = %(item)s)
),
old AS (SELECT id, state FROM stopdesk_workitem WHERE id = %(item)s),
u AS (
    UPDATE stopdesk_workitem w SET
        state = CASE WHEN t.stopped THEN %(cancelled)s ELSE %(running)s END,
        started_at = CASE WHEN t.stopped THEN w.started_at ELSE COALESCE(w.started_at, clock_timestamp()) END,
        submitted_at = CASE WHEN t.stopped OR NOT %(submit)s THEN w.submitted_at ELSE clock_timestamp() END,
        idempotency_key = CASE WHEN %(submit)s AND NOT t.stopped THEN %(key)s ELSE w.idempotency_key END,
        finished_at = CASE WHEN t.stopped THEN clock_timestamp() ELSE NULL END,
        outcome = CASE WHEN t.stopped THEN 'stopped before it started' ELSE w.outcome END,
        heartbeat_at = clock_timestamp(),
        lease_until = clock_timestamp() + make_interval(secs => %(lease)s),
        worker = %(worker)s,
        updated_at = clock_timestamp()
    FROM t, old
    WHERE w.id = %(item)s AND w.task_id = t.id AND old.id = w.id
      AND (w.state = %(queued)s OR (%(submit)s AND w.state = %(running)s AND w.submitted_at IS NULL))
    RETURNING w.id, w.task_id, w.state, w.updated_at, old.state AS old_state
),
e AS (
    INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
    SELECT u.updated_at, u.task_id, u.id,
           CASE WHEN u.state = %(cancelled)s THEN 'boundary_refused' WHEN %(submit)s THEN 'submitted' ELSE 'transition' END,
           %(actor)s, u.old_state, u.state,
           CASE WHEN u.state = %(cancelled)s THEN 'Stop was requested; the item did not start.'
                WHEN %(submit)s THEN 'External action submitted, idempotency key ' || %(key)s ELSE '' END,
           '{}'::jsonb
    FROM u
)
SELECT state FROM u
"""


# Register a child and pass the boundary in one statement (PostgreSQL): the gate passed as above
# (first: Stop takes the gate before the row), then the task row locked FOR NO KEY UPDATE, which
# makes a settle that is writing settled_at finish first, so a settled task is seen and reopened
# (and two registrations do not both reopen it), the item inserted already running (or submitted), its two events appended, and a settled
# task reopened with its event. A stopped task gets nothing here: the caller then takes the
# portable path, which records the item and its refusal. A closed task gets nothing either, and
# is refused (stopdesk.services.closing); its close, committed while this waited for the row, is
# read from the row's newest version, which FOR NO KEY UPDATE returns. A task outside the
# runtime's scope matches no row, nor does any task when the runtime no longer holds the token the
# caller remembered (`TokenHeld`).
_REGISTER_AND_START_SQL = (
    """
WITH h AS (SELECT /*hold*/NULL::bigint AS held_by),
g AS (SELECT CASE WHEN (SELECT held_by FROM h) IS NULL THEN stopdesk_gate(%(task)s::bigint) END AS stopped),
t AS (
    SELECT id, (SELECT stopped FROM g) AS stopped, settled_at IS NOT NULL AS settled, closed_at IS NOT NULL AS closed
    FROM stopdesk_task
    WHERE id = %(task)s AND (%(runtime)s::bigint IS NULL OR runtime_id = %(runtime)s::bigint)
      AND """
    + HELD_BY_RUNTIME_SQL
    + """
      AND (SELECT stopped FROM g) IS NOT NULL
    FOR NO KEY UPDATE
),
n AS (SELECT t.id AS task_id, t.settled, clock_timestamp() AS at FROM t WHERE NOT t.stopped AND NOT t.closed),
i AS (
    INSERT INTO stopdesk_workitem (
        task_id, parent_id, kind, noun, noun_plural, mechanism, handle, label, idempotency_key, detail,
        state, created_at, updated_at, started_at, submitted_at, finished_at, heartbeat_at, lease_until,
        worker, cancel_requested_at, next_check_at, check_count, investigate_by, outcome, evidence, needs_review
    )
    SELECT n.task_id, %(parent)s::bigint, %(kind)s::text, %(noun)s::text, %(noun_plural)s::text, %(mechanism)s::text,
           %(handle)s::text, %(label)s::text, %(key)s::text, %(detail)s::jsonb, %(running)s::text, n.at, n.at, n.at,
           CASE WHEN %(submit)s::boolean THEN n.at END, NULL, n.at, n.at + make_interval(secs => %(lease)s),
           %(worker)s::text, NULL, NULL, 0, NULL, '', '{}'::jsonb, false
    FROM n
    RETURNING id, task_id, created_at
),
r AS (
    UPDATE stopdesk_task SET settled_at = NULL FROM n WHERE stopdesk_task.id = n.task_id AND n.settled
    RETURNING stopdesk_task.id
),
e AS (
    INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
    SELECT x.at, x.task_id, x.item_id, x.kind, %(actor)s::text, x.from_state, x.to_state, x.message, x.data
    FROM (
        SELECT 1 AS ord, i.created_at AS at, i.task_id, i.id AS item_id, 'item_registered' AS kind,
               '' AS from_state, %(queued)s::text AS to_state, '' AS message, %(registered)s::jsonb AS data
        FROM i
        UNION ALL
        SELECT 2, i.created_at, i.task_id, NULL, 'task_reopened', '', '', 'New work was registered.', '{}'::jsonb
        FROM i, r
        UNION ALL
        SELECT 3, i.created_at, i.task_id, i.id, CASE WHEN %(submit)s::boolean THEN 'submitted' ELSE 'transition' END,
               %(queued)s::text, %(running)s::text,
               CASE WHEN %(submit)s::boolean THEN 'External action submitted, idempotency key ' || %(key)s::text
                    ELSE '' END,
               '{}'::jsonb
        FROM i
    ) x
    ORDER BY x.ord  -- the events in the order the portable path writes them
)/*then*/
SELECT (SELECT count(*) FROM t), (SELECT id FROM i), (SELECT closed FROM t), (SELECT held_by FROM h)
"""
)
_NO_HOLD = "/*hold*/NULL::bigint"
_NO_THEN = "/*then*/"


@dataclass(frozen=True)
class Hold:
    """A check that may hold a registration back (the MCP gateway's retry gate): it gives the id of
    the item that holds it, or None, and the registration then writes nothing and raises Held.
    It runs first, before the boundary's gate.
    - `sql`: on PostgreSQL, an SQL expression evaluated first in the one-statement registration,
      with `params` (named `hold_*`); a volatile function, which may take a transaction-level lock
      and then reads with a snapshot of its own, taken after the wait;
    - `check`: the same, called in the registration's transaction on the other paths."""

    sql: str
    params: dict[str, Any]
    check: Callable[[], int | None]


@dataclass(frozen=True)
class Then:
    """A write of the caller's that the one-statement registration makes too, once its item is in
    (the agent door's answer stored under the request's Idempotency-Key), so the registration and
    that write are one statement and, in autocommit, one commit: `sql`, a data-modifying statement
    that reads the new item from `i` (`i.id`, `i.task_id`), with `params` (named `then_*`). It
    writes nothing where the registration wrote no item; should it fail (a unique key taken), the
    whole statement fails, having written nothing."""

    sql: str
    params: dict[str, Any]


class Refused(Exception):
    """`item_register_pass` wrote nothing: the task is stopped (the caller records the refusal)."""


def item_register_pass(
    *,
    task_id: int,
    runtime_id: int | None,
    actor: str,
    spec: ItemSpec,
    worker: str = "",
    lease_seconds: int | None = None,
    submit_key: str = "",
    hold: Hold | None = None,
) -> int | None:
    """Register a child and pass the boundary (start, or submit with `submit_key`) in one statement,
    so one round trip, which under autocommit is also the commit (PostgreSQL only; the caller
    checks the kind, mechanism and readiness first). Returns the item id, None if the task is not
    there (or not the runtime's); raises Held if `hold` holds it, Refused if the task is stopped
    (both having written nothing), and TaskClosed if it is closed."""
    statement, params = _register_statement(task_id, runtime_id, actor, spec, worker, lease_seconds, submit_key, hold)
    with server_side_cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    return _registered(task_id, row)


async def item_register_pass_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    task_id: int,
    actor: str,
    spec: ItemSpec,
    worker: str = "",
    submit_key: str = "",
    hold: Hold | None = None,
    runtime_id: int | None = None,
    lease_seconds: int | None = None,
    held: TokenHeld | None = None,
    then: Then | None = None,
) -> int | None:
    """`item_register_pass` on an asyncio caller's own connection (in autocommit the statement is
    its commit): the MCP gateway's loop and the agent door's (`stopdesk.api.agent_door`), which
    then wait for no thread. The same statement and the same answers. `held`: the token the caller
    remembered for `runtime_id`, checked in the statement, which finds no task (None) when the
    runtime no longer holds it. `then`: a write of the caller's in the same statement."""
    statement, params = _register_statement(
        task_id, runtime_id, actor, spec, worker, lease_seconds, submit_key, hold, held
    )
    if then is not None:
        statement = statement.replace(_NO_THEN, f", then_write AS ({then.sql})")
        params.update(then.params)
    return _registered(task_id, await fetchone_async(conn, statement, params))


def _register_statement(
    task_id: int,
    runtime_id: int | None,
    actor: str,
    spec: ItemSpec,
    worker: str,
    lease_seconds: int | None,
    submit_key: str,
    hold: Hold | None,
    held: TokenHeld | None = None,
) -> tuple[str, dict[str, Any]]:
    lease = lease_seconds or settings.STOPDESK["LEASE_SECONDS"]
    params: dict[str, Any] = {
        **spec.to_json(),
        **TokenHeld.params(held),
        "task": task_id,
        "runtime": runtime_id,
        "actor": actor,
        "worker": worker,
        "lease": lease,
        "submit": bool(submit_key),
        "key": submit_key or spec.idempotency_key,
        "detail": json.dumps(spec.detail or {}),
        "registered": json.dumps({"noun": spec.noun, "kind": spec.kind}),
        "queued": S.QUEUED.value,
        "running": S.RUNNING.value,
    }
    statement = _REGISTER_AND_START_SQL
    if hold is not None:
        statement = statement.replace(_NO_HOLD, hold.sql)
        params.update(hold.params)
    return statement, params


def _registered(task_id: int, row: Any) -> int | None:
    found, item_id, closed, held_by = row
    if held_by is not None:
        raise Held(int(held_by))
    if not found:
        return None
    if closed:
        raise TaskClosed(task_id)
    if item_id is None:
        raise Refused(task_id)
    return int(item_id)


def item_start(*, item_id: int, actor: str, worker: str = "", lease_seconds: int | None = None) -> None:
    """Pass the boundary before starting queued work. Raises TaskStopped (and the item is now
    cancelled) once Stop was requested; IllegalTransition if the item is not queued."""
    _pass(item_id=item_id, actor=actor, worker=worker, lease_seconds=lease_seconds, submit=False, key="")


def item_submit(
    *, item_id: int, idempotency_key: str, actor: str, worker: str = "", lease_seconds: int | None = None
) -> None:
    """Pass the boundary before submitting an external action (from queued, or from running when
    the item has not submitted yet). The idempotency key is recorded before the call goes out, so
    reconciliation can look the action up whatever happens to the call."""
    if not idempotency_key:
        raise ValueError("An external action needs an idempotency key, so its result can be looked up.")
    _pass(item_id=item_id, actor=actor, worker=worker, lease_seconds=lease_seconds, submit=True, key=idempotency_key)


def item_observed_started(*, item_id: int, actor: str, started_at: datetime, message: str = "") -> None:
    """Record that queued work had already started without asking the boundary: work found
    running elsewhere (a tool a model response called on the provider's side, seen in its
    output). Not a pass of the boundary, so a Stop that came meanwhile does not refuse it: it ran.
    `started_at` is when it began, as well as it is known, never the time it was found."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if item.state != S.QUEUED:
            raise IllegalTransition(item.pk, item.state, S.RUNNING)
        item.state = S.RUNNING
        item.started_at = started_at
        item.updated_at = timezone.now()
        item.save(update_fields=["state", "started_at", "updated_at"])
        event_record(
            kind="observed_started",
            actor=actor,
            item=item,
            from_state=S.QUEUED,
            to_state=S.RUNNING,
            message=message or "Found already running outside the boundary.",
            data={"started_at": started_at.isoformat()},
        )


def _pass(*, item_id: int, actor: str, worker: str, lease_seconds: int | None, submit: bool, key: str) -> None:
    lease = lease_seconds or settings.STOPDESK["LEASE_SECONDS"]
    if is_postgres():
        params: dict[str, Any] = {
            "item": item_id,
            "actor": actor,
            "worker": worker,
            "lease": lease,
            "submit": submit,
            "key": key,
            # States are parameters, never literals: they are named in stopdesk.states only.
            "queued": S.QUEUED.value,
            "running": S.RUNNING.value,
            "cancelled": S.CANCELLED.value,
        }
        with server_side_cursor() as cursor:
            # One statement, so one round trip, and atomic on its own under autocommit.
            cursor.execute(_BOUNDARY_SQL, params)
            row = cursor.fetchone()
        state = row[0] if row else None
    else:
        state = _pass_portable(item_id=item_id, actor=actor, worker=worker, lease=lease, submit=submit, key=key)
    if state == S.RUNNING:
        return
    # Refused: either just now by the stop check, or the item was not startable (already started,
    # finished, cancelled by Stop's set-based update, or unknown).
    item = WorkItem.objects.select_related("task").get(pk=item_id)
    if state == S.CANCELLED:
        task_settle_after_commit(task_id=item.task_id)
    if state == S.CANCELLED or (item.state == S.CANCELLED and item.task.stop_requested_at is not None):
        raise TaskStopped(item.task_id, item.pk)
    raise IllegalTransition(item.pk, item.state, "submitted" if submit else S.RUNNING)


def _pass_portable(*, item_id: int, actor: str, worker: str, lease: int, submit: bool, key: str) -> str | None:
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        startable = item.state == S.QUEUED or (submit and item.state == S.RUNNING and item.submitted_at is None)
        if not startable:
            return None
        stopped = Task.objects.filter(pk=item.task_id, stop_requested_at__isnull=False).exists()
        now = timezone.now()
        before = item.state
        item.updated_at = now
        item.heartbeat_at = now
        item.lease_until = now + timedelta(seconds=lease)
        item.worker = worker
        if stopped:
            item.state, item.finished_at, item.outcome = S.CANCELLED, now, "stopped before it started"
            kind, message = "boundary_refused", "Stop was requested; the item did not start."
        else:
            item.state = S.RUNNING
            item.started_at = item.started_at or now
            kind, message = "transition", ""
            if submit:
                item.submitted_at, item.idempotency_key = now, key
                kind, message = "submitted", f"External action submitted, idempotency key {key}"
        item.save()
        event_record(kind=kind, actor=actor, item=item, from_state=before, to_state=item.state, message=message)
        return item.state
