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
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.urls import reverse

from stopdesk.models import OUTCOME_UNKNOWN_STATES, Event, WorkItem
from stopdesk.services.sql import is_postgres
from stopdesk.services.transitions.boundary import Hold
from stopdesk.states import ItemState

OUTCOME_UNKNOWN = OUTCOME_UNKNOWN_STATES  # the partial indexes' states (stopdesk.models)
IN_FLIGHT = (ItemState.QUEUED, ItemState.RUNNING)
CANDIDATES = 50  # identical calls read at most; a task has few at once


def gate_passed(*, task_id: int, upstream: str, tool: str, arguments_sha256: str) -> int | None:
    """The gate's lock taken, then the earlier call that holds or refuses this one read (its id),
    in the caller's transaction: on PostgreSQL one statement (`stopdesk_retry_gate`, migration
    0025), whose read takes its snapshot once the lock is held, so it sees every identical call
    registered before. The one-statement registration takes the same gate (`retry_hold`)."""
    identical = (task_id, upstream, tool, arguments_sha256)
    if not is_postgres():  # SQLite serialises writers: no lock to take
        return earlier_blocking(*identical)
    with connection.cursor() as cursor:
        cursor.execute("SELECT stopdesk_retry_gate(%s, %s, %s, %s, %s)", [gate_key(*identical), *identical])
        (earlier,) = cursor.fetchone()
    return earlier


def retry_hold(*, task_id: int, upstream: str, tool: str, arguments_sha256: str) -> Hold:
    """The gate as the registration's hold (`item_register_started(hold=)`): taken first in the
    registration's own statement on PostgreSQL, so the gate, the item and the boundary are one
    round trip; `gate_passed` in the registration's transaction elsewhere."""
    identical = (task_id, upstream, tool, arguments_sha256)
    return Hold(
        sql=(
            "stopdesk_retry_gate(%(hold_key)s::bigint, %(hold_task)s::bigint, %(hold_upstream)s::text,"
            " %(hold_tool)s::text, %(hold_hash)s::text)"
        ),
        params={
            "hold_key": gate_key(*identical),
            "hold_task": task_id,
            "hold_upstream": upstream,
            "hold_tool": tool,
            "hold_hash": arguments_sha256,
        },
        check=lambda: gate_passed(task_id=task_id, upstream=upstream, tool=tool, arguments_sha256=arguments_sha256),
    )


def gate_key(task_id: int, upstream: str, tool: str, arguments_sha256: str) -> int:
    """The transaction-level advisory lock under which identical calls of a task pass the gate one
    at a time (PostgreSQL only), so two copies sent at once cannot both find no earlier call."""
    key = f"retry-gate\0{task_id}\0{upstream}\0{tool}\0{arguments_sha256}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def earlier_blocking(task_id: int, upstream: str, tool: str, arguments_sha256: str) -> int | None:
    """The first identical call of the task that holds or refuses this one (its id), if any: one still in
    flight (not read-only), one whose outcome is not known yet, or one that was unknown and was
    found to have taken effect. One query reads them all: an earlier call moving from running
    to uncertain meanwhile is seen in one state or the other, never missed between two reads.

    On PostgreSQL (`stopdesk_retry_gate_earlier`, migration 0025) it reads only identical calls at
    work or not known yet, and the task's items that were ever unsettled (two partial indexes): an
    agent that reads the same thing a thousand times has a thousand identical calls, and a
    session's history grows with every call; a read of all of them made each call slower than the
    one before."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT stopdesk_retry_gate_earlier(%s, %s, %s, %s)", [task_id, upstream, tool, arguments_sha256]
            )
            (earlier,) = cursor.fetchone()
        return earlier
    # SQLite (the embedded default): the same read through the ORM, by the task's items.
    were_unsettled = Event.objects.filter(task_id=task_id, to_state__in=OUTCOME_UNKNOWN, item__isnull=False)
    candidates = (
        WorkItem.objects.filter(task_id=task_id, mechanism="mcp", detail__gateway__arguments_sha256=arguments_sha256)
        .filter(
            Q(state__in=(*OUTCOME_UNKNOWN, *IN_FLIGHT))
            | Q(state=ItemState.COMPLETED, pk__in=were_unsettled.values("item_id"))
        )
        .filter(detail__gateway__upstream=upstream, detail__gateway__tool=tool)
        .order_by("pk")[:CANDIDATES]
    )
    for item in candidates:
        if item.state in IN_FLIGHT and _read_only(item):
            continue  # a read running beside its twin does no harm
        return item.pk
    return None


def answer_may_follow_reply(mcp_facts: dict[str, Any], *, idempotent: bool) -> bool:
    """Whether the client may hear a call's answer before the ledger records it: when no identical
    call's gate can be decided by this one while it is still running: a read-only call (a running
    read's twin passes) or a call of a tool declared idempotent (its calls take no gate). A call
    that may write is recorded first: its repeat, sent the moment the answer arrives, must find it
    completed (and pass), not running (and be held)."""
    return idempotent or _read_only_hint(mcp_facts)


def _read_only(item: WorkItem) -> bool:
    return _read_only_hint((item.detail or {}).get("mcp") or {})


def _read_only_hint(mcp_facts: dict[str, Any]) -> bool:
    """Whether the upstream's annotations call the tool read-only (as the gate's SQL reads them)."""
    return (mcp_facts.get("annotations") or {}).get("readOnlyHint") is True


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
