"""`GET /metrics` in the Prometheus text format.

Not public: it answers only a bearer token equal to STOPDESK_METRICS_TOKEN (and 404 when none
is set). A scrape runs a constant number of bounded queries, whatever the ledger's size: the
heartbeat rows (which carry the background tally, stopdesk/notify/tally.py), one aggregate
over the uncertain items and the compensations awaiting a decision, and one over the audit events
not sealed yet (capped), each on indexes (stopdesk/notify/selectors.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from stopdesk.api.errors import error_response
from stopdesk.notify.models import Heartbeat
from stopdesk.notify.selectors import UNSEALED_CAP, age_seconds, audit_backlog, review_queue_facts
from stopdesk.notify.tally import SETTLE_BUCKETS, TALLY
from stopdesk.protocol.errors import Unauthorized
from stopdesk.services.runtimes import bearer_token

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HEARTBEATS = ("beat", "worker", "reconcile_sweep", TALLY)


class LedgerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        beats = {name: (at, detail) for name, at, detail in Heartbeat.objects.filter(name__in=HEARTBEATS).values_list(
            "name", "at", "detail"
        )}  # fmt: skip
        queue = review_queue_facts(now=now)
        backlog = audit_backlog(now=now)
        tally: dict[str, Any] = beats.get(TALLY, (None, {}))[1] or {}

        ages = GaugeMetricFamily(
            "stopdesk_heartbeat_age_seconds",
            "Seconds since the process kind or periodic job last showed life (-1: never).",
            labels=["name"],
        )
        for name in HEARTBEATS:
            ages.add_metric([name], age_seconds(now, beats[name][0]) if name in beats else -1.0)
        yield ages

        items = GaugeMetricFamily("stopdesk_items", "Work items by state and mechanism.", labels=["state", "mechanism"])
        for state, mechanism, n in tally.get("items", []):
            items.add_metric([state, mechanism], n)
        yield items

        yield GaugeMetricFamily("stopdesk_uncertain_items", "Items in the uncertain state.", value=queue.uncertain)
        yield GaugeMetricFamily(
            "stopdesk_uncertain_past_investigate_by",
            "Uncertain items past their investigate-by deadline.",
            value=queue.past_deadline,
        )
        yield GaugeMetricFamily(
            "stopdesk_review_queue_length",
            "Entries in the review queue: uncertain items, compensations awaiting a decision, late results.",
            value=queue.uncertain + queue.waiting_compensations + int(tally.get("needs_review", 0)),
        )
        yield GaugeMetricFamily(
            "stopdesk_review_queue_oldest_age_seconds",
            "Age of the oldest uncertain item or undecided compensation.",
            value=queue.oldest_age_seconds,
        )

        yield GaugeMetricFamily(
            "stopdesk_audit_unsealed_events",
            f"Audit events written but not yet sealed into their task's hash chain (counted up to {UNSEALED_CAP}).",
            value=backlog.unsealed,
        )
        yield GaugeMetricFamily(
            "stopdesk_audit_unsealed_oldest_age_seconds",
            "Age of the oldest audit event not yet sealed (0: none).",
            value=backlog.oldest_age_seconds,
        )

        settle = tally.get("settle") or {"counts": [0] * (len(SETTLE_BUCKETS) + 1), "sum": 0.0}
        buckets, running = [], 0
        for bound, n in zip([*map(str, SETTLE_BUCKETS), "+Inf"], settle["counts"], strict=True):
            running += n
            buckets.append((bound, running))
        yield HistogramMetricFamily(
            "stopdesk_stop_settle_seconds",
            "Seconds from a stop request until its task settled.",
            buckets=buckets,
            sum_value=settle["sum"],
        )

        events = tally.get("events", {})
        for name, kind, text in (
            ("stopdesk_boundary_refusals", "boundary_refused", "Items refused at the boundary after a stop."),
            ("stopdesk_late_results", "late_result", "Late results that contradicted a recorded outcome."),
            (
                "stopdesk_compensation_version_escalations",
                "compensation_stale",
                "Compensations escalated because the record's version had changed.",
            ),
            ("stopdesk_stops", "stop_requested", "Stop requests."),
        ):
            yield CounterMetricFamily(name, text, value=int(events.get(kind, 0)))

        attempts = CounterMetricFamily(
            "stopdesk_cancel_attempts", "Cancel and inspect calls by mechanism and outcome.", labels=[
                "mechanism", "action", "outcome"
            ]
        )  # fmt: skip
        for mechanism, action, outcome, n in tally.get("cancel_attempts", []):
            attempts.add_metric([mechanism, action, outcome], n)
        yield attempts

        deliveries = GaugeMetricFamily(
            "stopdesk_notification_deliveries", "Notification deliveries by channel and state.", labels=[
                "channel", "state"
            ]
        )  # fmt: skip
        for channel, state, n in tally.get("deliveries", []):
            deliveries.add_metric([channel, state], n)
        yield deliveries


def metrics_text() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector())
    return generate_latest(registry)


def _authorised(request: HttpRequest) -> bool:
    token = settings.STOPDESK_METRICS_TOKEN
    given = bearer_token(request.headers.get("Authorization", ""))
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.STOPDESK_METRICS_TOKEN:
        return HttpResponse("metrics are off: set STOPDESK_METRICS_TOKEN\n", status=404, content_type="text/plain")
    if not _authorised(request):
        # The runtime API's refusal, in its shape (stopdesk.api.errors), with this realm.
        response = error_response(Unauthorized("Send the metrics token as 'Authorization: Bearer <token>'."))
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)
