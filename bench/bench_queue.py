"""The review queue on a bad day, on PostgreSQL.

queue.grouped_ms / queue.grouped_queries  the grouped queue with 10,000 uncertain items in 60
                                          groups (and 100 in 3): the query count must not grow
queue.bulk_resolve_ms                     one decision on a group of 1,000 items: one transaction,
                                          1,000 events
queue.bulk_resolve_queries                the statements that decision ran (the same for 10 items)

Server time is the request through Django's full stack in-process, the median of several warm
runs; the network is not in it.
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench.harness import Figure, page_timing

TOOLS = ("payments.refund", "crm.create_record", "erp.update_vendor")


def _seed(n: int, groups: int) -> list[int]:
    """n uncertain items spread over `groups` groups (a task per three tools). Seeding writes rows
    directly: set-up, not a state change."""
    from django.utils import timezone

    from stopdesk.models import Task, WorkItem
    from stopdesk.states import ItemState as S
    from stopdesk.states import Kind

    now = timezone.now()
    tasks = Task.objects.bulk_create([Task(title=f"bench queue run {k}") for k in range(-(-groups // len(TOOLS)))])
    rows = []
    for k in range(n):
        g = k % groups
        tool = TOOLS[g % len(TOOLS)]
        rows.append(
            WorkItem(
                task=tasks[g // len(TOOLS)],
                kind=Kind.EXTERNAL_OPERATION,
                noun="record",
                mechanism="http",
                state=S.UNCERTAIN,
                idempotency_key=f"{tool}-{k}",
                investigate_by=now + timedelta(minutes=k % 500 - 100),
                detail={"tool": {"name": tool}, "http": {"system": tool.split(".")[0]}},
                evidence={"uncertain_because": f"{tool.split('.')[0]} answered 503 to every lookup."},
            )
        )
    return [i.pk for i in WorkItem.objects.bulk_create(rows, batch_size=2000)]


def _resolve(ids: list[int], reviewer) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from reconcile.services.review_sets import items_resolve
    from stopdesk.states import ItemState as S

    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        decided = items_resolve(item_ids=ids, outcome=S.FAILED, note="bench", evidence="bench", by=reviewer)
        ms = (time.perf_counter() - started) * 1000
    assert len(decided.done) == len(ids), (len(decided.done), len(ids))
    return ms, len(queries.captured_queries)


def run() -> list[Figure]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from stopdesk.models import WorkItem
    from stopdesk.permissions import roles_ensure
    from stopdesk.states import ItemState as S

    roles_ensure()
    reviewer = get_user_model().objects.create_user("bench-queue-reviewer")
    reviewer.groups.add(Group.objects.get(name="reviewers"))
    client = Client()
    client.force_login(reviewer)

    small = _seed(100, 3)
    small_ms, small_queries = page_timing(client, "/queue/")
    WorkItem.objects.filter(pk__in=small).update(state=S.CANCELLED)  # bench data, set-up only
    _seed(10_000, 60)
    big_ms, big_queries = page_timing(client, "/queue/")

    group = list(WorkItem.objects.filter(state=S.UNCERTAIN).order_by("id").values_list("id", flat=True)[:1010])
    few_ms, few_queries = _resolve(group[:10], reviewer)
    bulk_ms, bulk_queries = _resolve(group[10:], reviewer)
    return [
        Figure("queue.grouped_ms_at_100", small_ms, "ms"),
        Figure("queue.grouped_ms", big_ms, "ms", 500.0),
        Figure("queue.grouped_queries_at_100", small_queries, "queries"),
        Figure("queue.grouped_queries", big_queries, "queries", small_queries),
        Figure("queue.bulk_resolve_ms_at_10", few_ms, "ms"),
        Figure("queue.bulk_resolve_ms", bulk_ms, "ms", 2000.0),
        Figure("queue.bulk_resolve_queries", bulk_queries, "queries", few_queries),
    ]
