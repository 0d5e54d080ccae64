"""The retry gate: a call identical to one whose outcome the client never learned is not forwarded.

MCP has no request idempotency, and on 2026-07-28 HTTP a dropped stream is the same as a
cancel: the client re-issues the call as a new request. Sending it again could do the work twice
(a second email, a second issue). Identical means the same task (the session), upstream, tool
and arguments hash. The earlier call decides:

- its outcome is still unknown (*uncertain*, or the reconciler is still looking): the retry is
  held until a status check or a reviewer settles it;
- it is still in flight (*queued* or *running*) and its tool is not read-only by the upstream's
  annotations: the retry is held too. A client that gives up on a call sends its retry at once,
  before the gateway has recorded the give-up (the cancel and the retry race each other); the
  earlier call may still land, and a second copy must not be sent beside it;
- it went through *uncertain* or awaiting reconciliation and was then found to have taken effect
  (*completed*: its status check showed it, or a reviewer resolved it done): the retry is refused,
  since the work is done; the client never got that answer, so its retry is not a new intent;
- it was found not to have taken effect (*failed*, *cancelled*): the retry passes.

A call that completed with its answer passed to the client was never uncertain, so an agent may
repeat it (the same read twice) as often as it likes. Tools the server's configuration declares
`idempotent` always pass."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.urls import reverse

from stopdesk.models import UNSETTLED_STATES, Event, WorkItem
from stopdesk.services.sql import is_postgres, server_side_cursor
from stopdesk.states import ItemState

UNSETTLED = UNSETTLED_STATES  # the partial indexes' states (stopdesk.models)
IN_FLIGHT = (ItemState.QUEUED, ItemState.RUNNING)
CANDIDATES = 50  # identical calls read at most; a task has few at once


def gate_passed(*, task_id: int, upstream: str, tool: str, arguments_sha256: str) -> WorkItem | None:
    """The gate's lock taken (`gate_lock`), then the earlier call that holds or refuses this one
    read (`earlier_blocking`), in the caller's transaction. The read runs once the lock is held,
    with a snapshot of its own (read committed) that sees every identical call registered before.
    (Sent together as a psycopg pipeline, the two took longer: 0.38 ms against 0.29.)"""
    identical = (task_id, upstream, tool, arguments_sha256)
    if is_postgres():  # SQLite serialises writers: no lock to take
        gate_lock(*identical)
    return earlier_blocking(*identical)


def gate_lock(task_id: int, upstream: str, tool: str, arguments_sha256: str) -> None:
    """Identical calls of a task pass the gate one at a time: each checks and registers under this
    lock (a transaction-level advisory lock; PostgreSQL only), so two copies sent at once cannot
    both find no earlier call. Call it inside the transaction."""
    key = f"retry-gate\0{task_id}\0{upstream}\0{tool}\0{arguments_sha256}"
    digest = hashlib.sha256(key.encode()).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)])


def earlier_blocking(task_id: int, upstream: str, tool: str, arguments_sha256: str) -> WorkItem | None:
    """The first identical call of the task that holds or refuses this one, if any: one still in
    flight (not read-only), one whose outcome is not known yet, or one that was unknown and was
    found to have taken effect. One statement reads them all: an earlier call moving from running
    to uncertain meanwhile is seen in one state or the other, never missed between two reads.

    On PostgreSQL it reads only identical calls at work or not known yet, and the task's items
    that were ever unsettled (two partial indexes): an agent that reads the same thing a thousand
    times has a thousand identical calls, and a session's history grows with every call; a read
    of all of them made each call slower than the one before."""
    if is_postgres():
        return _earlier_blocking_sql(task_id, upstream, tool, arguments_sha256)
    # SQLite (the embedded default): the same read through the ORM, by the task's items.
    were_unsettled = Event.objects.filter(task_id=task_id, to_state__in=UNSETTLED, item__isnull=False)
    candidates = (
        WorkItem.objects.filter(task_id=task_id, mechanism="mcp", detail__gateway__arguments_sha256=arguments_sha256)
        .filter(
            Q(state__in=(*UNSETTLED, *IN_FLIGHT))
            | Q(state=ItemState.COMPLETED, pk__in=were_unsettled.values("item_id"))
        )
        .filter(detail__gateway__upstream=upstream, detail__gateway__tool=tool)
        .order_by("pk")[:CANDIDATES]
    )
    for item in candidates:
        if item.state in IN_FLIGHT and _read_only(item):
            continue  # a read running beside its twin does no harm
        return item
    return None


def _listed(states: tuple[ItemState, ...]) -> str:
    return ", ".join(f"'{state.value}'" for state in states)


# The same read in SQL written once and prepared by the connection (the ORM spent longer compiling
# it than PostgreSQL did running it). Two parts in one statement, so one snapshot: the identical
# calls still at work or not known yet, by their partial index (`item_gateway_retry_held`; the
# states are written out, so the planner sees the index's own condition), and the completed ones
# among the task's items that were ever unsettled, by the events' partial index
# (`event_task_unsettled`), read first and each looked up by its id (a lateral join kept apart by
# OFFSET 0, so the planner cannot start from the session's completed calls instead, as it did while
# the statistics were a fresh table's). Neither reads the session's other calls or its history.
_EARLIER_SQL = f"""
SELECT w.id, w.state, COALESCE((w.detail #> '{{mcp,annotations,readOnlyHint}}') = 'true'::jsonb, false)
FROM stopdesk_workitem w
WHERE w.task_id = %(task)s AND w.mechanism = 'mcp' AND (w.detail #>> '{{gateway,arguments_sha256}}') = %(hash)s
  AND w.state IN ({_listed((*IN_FLIGHT, *UNSETTLED))})
  AND (w.detail #>> '{{gateway,upstream}}') = %(upstream)s AND (w.detail #>> '{{gateway,tool}}') = %(tool)s
UNION ALL
SELECT w.id, w.state, false
FROM (SELECT DISTINCT e.item_id FROM stopdesk_event e
      WHERE e.task_id = %(task)s AND e.to_state IN ({_listed(UNSETTLED)}) AND e.item_id IS NOT NULL) AS u,
     LATERAL (SELECT * FROM stopdesk_workitem WHERE id = u.item_id OFFSET 0) AS w
WHERE w.state = '{ItemState.COMPLETED.value}' AND w.mechanism = 'mcp'
  AND (w.detail #>> '{{gateway,arguments_sha256}}') = %(hash)s
  AND (w.detail #>> '{{gateway,upstream}}') = %(upstream)s AND (w.detail #>> '{{gateway,tool}}') = %(tool)s
ORDER BY 1
LIMIT %(limit)s
"""


def _earlier_blocking_sql(task_id: int, upstream: str, tool: str, arguments_sha256: str) -> WorkItem | None:
    params = {
        "task": task_id,
        "hash": arguments_sha256,
        "upstream": upstream,
        "tool": tool,
        "limit": CANDIDATES,
    }
    with server_side_cursor() as cursor:
        cursor.execute(_EARLIER_SQL, params)
        rows = cursor.fetchall()
    for item_id, state, read_only in rows:
        if state in IN_FLIGHT and read_only:
            continue  # a read running beside its twin does no harm
        return WorkItem.objects.get(pk=item_id)
    return None


def _read_only(item: WorkItem) -> bool:
    annotations = ((item.detail or {}).get("mcp") or {}).get("annotations") or {}
    return annotations.get("readOnlyHint") is True


def refused_words(earlier: WorkItem) -> str:
    """What the client is told: which call it repeats, what is known of it, and where to look."""
    link = review_link(earlier.pk)
    if earlier.state == ItemState.COMPLETED:
        return (
            f"not forwarded: an identical call (item {earlier.pk}) already took effect "
            f"({earlier.outcome or 'completed'}); see {link}"
        )
    return (
        f"not forwarded: an identical call (item {earlier.pk}, {earlier.state}) may already have taken "
        f"effect; review it at {link} and call again once it is settled"
    )


def review_link(item_id: int) -> str:
    base = str(settings.STOPDESK_NOTIFY["BASE_URL"]).rstrip("/")
    return base + reverse("item-detail", args=[item_id])
