"""The background half of /metrics: figures whose exact value needs a scan (items by state and
mechanism, cancel attempts, deliveries, the Stop -> settled histogram) are computed here by a
periodic job and stored in one heartbeat row; counters of audit events are advanced
incrementally over the append-only log from a cursor, a bounded id range per run. The scrape
then reads one row instead of scanning the ledger."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, Max
from django.utils import timezone

from stopdesk.models import CancellationAttempt, Event, Task, WorkItem
from stopdesk.notify.heartbeat import heartbeat_record
from stopdesk.notify.models import Delivery, Heartbeat
from stopdesk.states import ItemState

TALLY = "metrics_tally"
# Audit event kinds counted for /metrics (each a counter).
COUNTED_KINDS = ("boundary_refused", "late_result", "compensation_stale", "stop_requested")
SETTLE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
EVENT_CHUNK = 500_000


def _settle_histogram() -> dict[str, Any]:
    """Seconds from a stop request to its task settling (Task.settled_at), bucketed in SQL."""
    if connection.vendor == "postgresql":
        sql = (
            "SELECT width_bucket(EXTRACT(EPOCH FROM settled_at - stop_requested_at), %s::float8[]), count(*), "
            "COALESCE(sum(EXTRACT(EPOCH FROM settled_at - stop_requested_at)), 0) FROM stopdesk_task "
            "WHERE stop_requested_at IS NOT NULL AND settled_at IS NOT NULL GROUP BY 1"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(SETTLE_BUCKETS)])
            found = cursor.fetchall()
        counts = [0] * (len(SETTLE_BUCKETS) + 1)
        total = 0.0
        for bucket, n, seconds in found:
            # width_bucket: 0 below the first bound, i means [bound(i-1), bound(i)); a value equal
            # to a bound belongs to the next bucket, close enough for alerting.
            counts[min(int(bucket), len(SETTLE_BUCKETS))] += n
            total += float(seconds)
    else:
        counts = [0] * (len(SETTLE_BUCKETS) + 1)
        total = 0.0
        rows = Task.objects.filter(stop_requested_at__isnull=False, settled_at__isnull=False)
        pairs: Any = rows.values_list("stop_requested_at", "settled_at").iterator()
        for requested, settled in pairs:
            seconds = (settled - requested).total_seconds()
            total += seconds
            counts[sum(1 for b in SETTLE_BUCKETS if seconds >= b)] += 1
    return {"counts": counts, "sum": total}


def metrics_tally() -> dict[str, Any]:
    previous = Heartbeat.objects.filter(name=TALLY).values_list("detail", flat=True).first() or {}
    counters: dict[str, int] = dict(previous.get("events", {}))
    cursor = int(previous.get("event_cursor", 0))
    # A bounded id range per run; a backlog (a first run over a big log) catches up run by run.
    top = Event.objects.aggregate(top=Max("id"))["top"] or 0
    upto = min(top, cursor + EVENT_CHUNK)
    if upto > cursor:
        for kind, n in (
            Event.objects.filter(id__gt=cursor, id__lte=upto, kind__in=COUNTED_KINDS)
            .values_list("kind")
            .annotate(n=Count("id"))
            .order_by()
        ):
            counters[kind] = counters.get(kind, 0) + n
    detail = {
        "items": [
            [state, mechanism, n]
            for state, mechanism, n in WorkItem.objects.values_list("state", "mechanism")
            .annotate(n=Count("id"))
            .order_by()
        ],
        "needs_review": WorkItem.objects.filter(needs_review=True).exclude(state=ItemState.UNCERTAIN).count(),
        "cancel_attempts": [
            [mechanism, action, "unanswered" if ok is None else ("ok" if ok else "failed"), n]
            for mechanism, action, ok, n in CancellationAttempt.objects.values_list("mechanism", "action", "ok")
            .annotate(n=Count("id"))
            .order_by()
        ],
        "deliveries": [
            [channel, state, n]
            for channel, state, n in Delivery.objects.values_list("channel", "state").annotate(n=Count("id")).order_by()
        ],
        "settle": _settle_histogram(),
        "events": counters,
        "event_cursor": upto,
        "computed_at": timezone.now().isoformat(),
    }
    heartbeat_record(TALLY, detail=detail)
    return detail
