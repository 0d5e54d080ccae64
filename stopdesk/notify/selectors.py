"""Reads for the pages and /metrics: the review queue's size and age, the audit events not sealed
yet, and recent deliveries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from stopdesk.notify.models import Delivery
from stopdesk.paging import capped
from stopdesk.states import ItemState

# Uncertain items (partial indexes item_uncertain_deadline and item_uncertain_since) and
# compensations waiting for a person (index on state, proposed_at): counted and dated in one
# statement. /metrics counts exactly (an index-only scan of the uncertain items); the pages count
# at most `cap` + 1 rows, so their cost does not grow with the queue.
QUEUE_SQL = """
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM stopdesk_workitem WHERE state = %(uncertain)s LIMIT %(cap)s) u),
  (SELECT count(*) FROM (
      SELECT 1 FROM stopdesk_workitem WHERE state = %(uncertain)s AND investigate_by < %(now)s LIMIT %(cap)s) p),
  (SELECT min(updated_at) FROM stopdesk_workitem WHERE state = %(uncertain)s),
  (SELECT count(*) FROM (
      SELECT 1 FROM reconcile_compensation WHERE state IN ('proposed', 'escalated') LIMIT %(cap)s) c),
  (SELECT min(proposed_at) FROM reconcile_compensation WHERE state IN ('proposed', 'escalated'))
"""


@dataclass(frozen=True)
class QueueFacts:
    uncertain: int
    past_deadline: int
    waiting_compensations: int
    oldest_at: datetime | None
    now: datetime

    @property
    def oldest_age_seconds(self) -> float:
        return age_seconds(self.now, self.oldest_at)


def review_queue_facts(*, now: datetime | None = None, cap: int | None = None) -> QueueFacts:
    """The queue's size and age. With `cap`, each count stops there (`CappedCount`, "10,000+")."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        # The state is a parameter (named in states.py only); Django binds it on the client, so the
        # planner still sees the partial index's literal.
        limit = 2**62 if cap is None else cap + 1
        cursor.execute(QUEUE_SQL, {"uncertain": ItemState.UNCERTAIN.value, "now": now, "cap": limit})
        uncertain, past, oldest_item, waiting, oldest_compensation = cursor.fetchone()
    found = (_as_datetime(t) for t in (oldest_item, oldest_compensation) if t is not None)
    oldest = min(found, default=None)
    counts = [n if cap is None else capped(n, cap) for n in (uncertain, past, waiting)]
    return QueueFacts(counts[0], counts[1], counts[2], oldest, now)


# Events written but not sealed into their chains yet (the partial index event_unsealed, on id
# where seq = 0, in every monthly partition): counted up to a cap, so a sealer that has fallen far
# behind costs a scrape no more than this many index entries, and dated by the first in id order (a
# few events commit out of id order; the sealer takes them in id order too).
UNSEALED_CAP = 10_000
UNSEALED_SQL = """
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM stopdesk_event WHERE seq = 0 LIMIT %(cap)s) AS backlog),
  (SELECT at FROM stopdesk_event WHERE seq = 0 ORDER BY id LIMIT 1)
"""


@dataclass(frozen=True)
class AuditBacklog:
    unsealed: int  # at most the cap
    oldest_at: datetime | None
    now: datetime

    @property
    def oldest_age_seconds(self) -> float:
        return age_seconds(self.now, self.oldest_at)


def audit_backlog(*, now: datetime | None = None, cap: int = UNSEALED_CAP) -> AuditBacklog:
    """The audit events the sealer has not sealed yet: how many (up to `cap`), and since when."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(UNSEALED_SQL, {"cap": cap})
        unsealed, oldest = cursor.fetchone()
    return AuditBacklog(unsealed, _as_datetime(oldest) if oldest is not None else None, now)


def age_seconds(now: datetime, then: datetime | None) -> float:
    """Seconds from `then` to `now`, never negative; 0 when there is no `then`."""
    return max(0.0, (now - then).total_seconds()) if then else 0.0


def _as_datetime(value: datetime | str) -> datetime:
    """PostgreSQL returns datetimes; SQLite returns raw SQL aggregates as text, and a raw column
    as a naive datetime (both UTC)."""
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    parsed = parse_datetime(value)
    if parsed is None:
        raise ValueError(f"not a timestamp: {value!r}")
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


def deliveries_recent() -> QuerySet[Delivery]:
    return Delivery.objects.select_related("notification", "endpoint").order_by("-created_at", "-id")
