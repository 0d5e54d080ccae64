"""Counts and pages that cost the same at a thousand rows and at ten million.

A list counts at most `cap` + 1 rows: below the cap the count is exact; beyond it the count is
`CappedCount(cap)`, which prints as "1,000+" wherever a template shows it, and the pages stop
at the cap (filters and search reach the rest). An OFFSET within the cap stays an index walk of
at most `cap` rows.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet

ADMIN_CAP = 10_000
PAGE_CAP = 1_000
QUEUE_CAP = 1_000


class CappedCount(int):
    """A count that stopped at its cap: at least this many."""

    capped = True

    def __str__(self) -> str:
        return f"{int(self):,}+"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec)


def capped_count(queryset: QuerySet[Any], cap: int) -> int:
    """COUNT(*) over at most cap + 1 rows (a LIMIT inside the count), exact below the cap."""
    return capped(queryset.order_by()[: cap + 1].count(), cap)


def capped(found: int, cap: int) -> int:
    """A count of at most cap + 1 rows as shown: exact up to the cap, `CappedCount` beyond it."""
    return CappedCount(cap) if found > cap else found


class CappedPaginator(Paginator):
    cap = PAGE_CAP

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        if isinstance(self.object_list, QuerySet):
            return capped_count(self.object_list, self.cap)
        return len(self.object_list)


class AdminPaginator(CappedPaginator):
    cap = ADMIN_CAP


class TimelinePaginator(CappedPaginator):
    """One task's events: bounded by the task's size, counted through its (task, at) index, and
    every page of a large task's history stays reachable."""

    cap = 100_000
