"""Every page and admin list at ten million items. Off by
default: `BENCH=scale make bench`.

Seeds STOPDESK_BENCH_SCALE_ITEMS work items (default 10,000,000; 100 per task, 10% uncertain,
a tenth of the rest reversible effects) and three events per item, spread over a year, with
set-based SQL in the scratch database, then prints each page's server time (median of warm runs
through Django's full stack in-process) and its query count. The counts must not depend on the
table sizes: compare a run at 1,000,000 with one at 10,000,000.

Seeding writes rows directly with the audit triggers off: it is set-up, not history, and its events
carry no hash chain. Set STOPDESK_BENCH_DB to a database name and STOPDESK_BENCH_KEEP_DB=1 to keep
the seeded database between runs (a second run skips the seeding).
"""

from __future__ import annotations

import os
import statistics
import time

from bench.harness import Figure

ITEMS = int(os.environ.get("STOPDESK_BENCH_SCALE_ITEMS", "10000000"))
PER_TASK = 100
CHUNK = 1_000_000
RUNS = 5
TARGET_MS = 150.0


def _exec(sql: str, params: list | None = None) -> None:  # type: ignore[type-arg]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def _scalar(sql: str, params: list | None = None):  # type: ignore[no-untyped-def, type-arg]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def _seed(items: int, reviewer_id: int) -> float:
    """Returns the seconds it took. Ids are generated here so every table can be filled by one
    INSERT ... SELECT per chunk; sequences are moved past them at the end."""
    started = time.perf_counter()
    tasks = items // PER_TASK
    _exec(
        """
        INSERT INTO stopdesk_task (id, title, created_at, stop_requested_at, settled_at)
        SELECT g, 'scale task ' || g, now() - ((%s - g) * interval '5 minutes'),
               CASE WHEN g %% 3 = 0 THEN now() - ((%s - g) * interval '5 minutes') + interval '1 minute' END,
               NULL
        FROM generate_series(1, %s) g
        """,
        [tasks, tasks, tasks],
    )
    # A partition for every month the seeded events fall in (the daily job only makes months ahead).
    _exec(
        """
        SELECT stopdesk_event_partition(m::date) FROM generate_series(
            date_trunc('month', now() - (%s * interval '5 minutes')), date_trunc('month', now()), interval '1 month') m
        """,
        [tasks],
    )
    for low in range(1, items + 1, CHUNK):
        high = min(items, low + CHUNK - 1)
        # state by position: 10% uncertain, 2% running, 1% queued, 2% awaiting, rest settled.
        _exec(
            """
            INSERT INTO stopdesk_workitem (id, task_id, kind, mechanism, handle, idempotency_key, noun,
                noun_plural, label, state, created_at, updated_at, started_at, finished_at, worker,
                check_count, outcome, evidence, needs_review, detail, investigate_by, lease_until,
                next_check_at)
            SELECT g, (g - 1) / %(per)s + 1,
                   CASE WHEN g %% 10 = 5 THEN 'external_operation' ELSE 'model_request' END,
                   CASE WHEN g %% 10 = 5 THEN 'http' ELSE 'openai' END,
                   'h-' || g, '', 'draft', '', '', s.state,
                   t.created_at, t.created_at + interval '2 minutes', t.created_at, t.created_at + interval '2 minutes',
                   '', 0, '', '{}'::jsonb, g %% 997 = 0, '{}'::jsonb,
                   CASE WHEN s.state = 'uncertain' THEN now() + ((g %% 2000) - 1000) * interval '1 minute' END,
                   CASE WHEN s.state = 'running' THEN now() + (CASE WHEN g %% 7 = 0 THEN -1 ELSE 1 END) * interval '1 day' END,
                   CASE WHEN s.state IN ('uncertain', 'awaiting_reconciliation') THEN now() + interval '5 minutes' END
            FROM generate_series(%(low)s, %(high)s) g
            JOIN stopdesk_task t ON t.id = (g - 1) / %(per)s + 1
            CROSS JOIN LATERAL (SELECT CASE
                WHEN g %% 10 = 0 THEN 'uncertain'
                WHEN g %% 50 = 1 THEN 'running'
                WHEN g %% 100 = 3 THEN 'queued'
                WHEN g %% 50 = 7 THEN 'awaiting_reconciliation'
                WHEN g %% 10 = 9 THEN 'cancelled'
                WHEN g %% 20 = 8 THEN 'failed'
                ELSE 'completed' END AS state) s
            """,
            {"per": PER_TASK, "low": low, "high": high},
        )
        # Three events per item: registered, started, and its last move.
        _exec(
            """
            INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data,
                seq, hash)
            SELECT i.created_at + k * interval '1 minute', i.task_id, i.id,
                   (ARRAY['item_registered', 'item_started', 'item_moved'])[k + 1], 'runtime:scale',
                   (ARRAY['', 'queued', 'running'])[k + 1], (ARRAY['queued', 'running', i.state])[k + 1],
                   '', '{}'::jsonb, ((i.id - 1) %% %(per)s) * 3 + k + 1, ''
            FROM stopdesk_workitem i CROSS JOIN generate_series(0, 2) k
            WHERE i.id BETWEEN %(low)s AND %(high)s
            """,
            {"per": PER_TASK, "low": low, "high": high},
        )
        print(f"# seeded {high:,} items and {3 * high:,} events in {time.perf_counter() - started:.0f} s", flush=True)
    _exec(
        """
        INSERT INTO stopdesk_externalrecord (item_id, system, record_id, version, effect, reversible, reversal,
            link, recorded_at)
        SELECT id, 'crm', 'crm-' || id, '1', 'created', true, 'archive', '', finished_at
        FROM stopdesk_workitem WHERE kind = 'external_operation' AND state = 'completed'
        """
    )
    _exec(
        """
        INSERT INTO reconcile_compensation (external_record_id, action, expected_version, note, state,
            proposed_by_id, proposed_at, observed_version, result, reason, error)
        SELECT id, 'archive', '1', '', CASE WHEN id %% 4 = 0 THEN 'proposed' ELSE 'done' END, %s,
               recorded_at, '', '{}'::jsonb, '', ''
        FROM stopdesk_externalrecord WHERE id %% 20 = 0
        """,
        [reviewer_id],
    )
    _exec(
        """
        INSERT INTO stopdesk_cancellationattempt (item_id, mechanism, action, sent_at, answered_at, ok,
            observed_status, detail)
        SELECT id, mechanism, 'cancel', updated_at, updated_at, false, 'running', '{}'::jsonb
        FROM stopdesk_workitem WHERE state IN ('running', 'awaiting_reconciliation', 'uncertain')
        """
    )
    _exec(
        """
        INSERT INTO stopdesk_stoprequest (task_id, requested_at, actor, reason, queued_cancelled, dispatched,
            duplicates)
        SELECT id, stop_requested_at, 'user:scale', '', 0, 0, 0 FROM stopdesk_task WHERE stop_requested_at IS NOT NULL
        """
    )
    for table in ("stopdesk_task", "stopdesk_workitem", "stopdesk_event", "stopdesk_externalrecord"):
        _exec(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    # As autovacuum would have by then: statistics, and the visibility map that lets a capped
    # count read an index alone.
    _exec("VACUUM ANALYZE")
    return time.perf_counter() - started


def _measure(client, url: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    timings = []
    for _ in range(RUNS):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings), len(queries.captured_queries)


def _sweeps() -> list[Figure]:
    """Each periodic sweep, twice (the second run finds what the first left): its time must not
    grow with the settled history. The first runs move rows and write their events."""
    from reconcile.services.compensation import compensations_sweep
    from reconcile.services.reconcile import items_claim_due, items_flag_overdue
    from stopdesk.services.reaper import items_reap_stale
    from stopdesk.services.transitions import tasks_settle_sweep

    sweeps = {
        "claim_due": lambda: len(items_claim_due(limit=200)),
        "reap_stale": items_reap_stale,
        "flag_overdue": items_flag_overdue,
        "compensations": lambda: sum(map(len, compensations_sweep(enqueue=lambda _id: None).values())),
        "settle_tasks": lambda: len(tasks_settle_sweep()[0]),
    }
    figures = []
    for name, sweep in sweeps.items():
        for attempt in (1, 2):
            started = time.perf_counter()
            rows = sweep()
            ms = (time.perf_counter() - started) * 1000
            # No target: a run writes up to its batch with events; what matters is that the time
            # is the same at 1,000,000 items and at 10,000,000.
            figures.append(Figure(f"scale.sweep_{name}_run{attempt}_ms", ms, f"ms ({rows} rows)"))
    return figures


def pages(task_id: int, item_id: int, compensation_id: int) -> dict[str, str]:
    return {
        "task_list": "/tasks/",
        "task_list_review": "/tasks/?status=review",
        "task_page": f"/tasks/{task_id}/",
        "task_items": f"/tasks/{task_id}/items/?state=completed",
        "queue": "/queue/",
        "queue_uncertain_page_3": "/queue/?uncertain=3",
        "compensation": f"/compensations/{compensation_id}/",
        "admin_tasks": "/admin/stopdesk/task/",
        "admin_items": "/admin/stopdesk/workitem/",
        "admin_items_queued": "/admin/stopdesk/workitem/?state__exact=queued",
        "admin_items_search": f"/admin/stopdesk/workitem/?q={item_id}",
        "admin_records": "/admin/stopdesk/externalrecord/",
        "admin_events": "/admin/stopdesk/event/",
        "admin_events_kind": "/admin/stopdesk/event/?kind=item_started",
        "admin_events_task": f"/admin/stopdesk/event/?q={task_id}",
        "admin_attempts": "/admin/stopdesk/cancellationattempt/",
        "admin_stops": "/admin/stopdesk/stoprequest/",
        "admin_compensations": "/admin/reconcile/compensation/",
        "admin_compensations_proposed": "/admin/reconcile/compensation/?state__exact=proposed",
        "admin_timeline": f"/admin/stopdesk/task/{task_id}/timeline/",
    }


def run() -> list[Figure]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from stopdesk.permissions import roles_ensure

    roles_ensure()
    users = get_user_model()
    admin, _ = users.objects.get_or_create(
        username="scale-admin", defaults={"is_staff": True, "is_superuser": True, "email": "a@example.test"}
    )
    figures = []
    if not _scalar("SELECT EXISTS (SELECT 1 FROM stopdesk_task WHERE title = 'scale task 1')"):
        _exec("ALTER TABLE stopdesk_event DISABLE TRIGGER USER")
        try:
            seconds = _seed(ITEMS, admin.pk)
        finally:
            _exec("ALTER TABLE stopdesk_event ENABLE TRIGGER USER")
        figures.append(Figure("scale.seed_s", seconds, "s"))
    items = _scalar("SELECT reltuples::bigint FROM pg_class WHERE relname = 'stopdesk_workitem'")
    # A partitioned table has no estimate of its own: sum its partitions'.
    events = _scalar(
        "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'stopdesk_event'::regclass"
    )
    print(f"# about {items:,} items and {events:,} events", flush=True)
    client = Client()
    client.force_login(admin)
    middle = ITEMS // PER_TASK // 2
    compensation_id = _scalar("SELECT max(id) FROM reconcile_compensation")
    for name, url in pages(middle, middle * PER_TASK, compensation_id).items():
        ms, queries = _measure(client, url)
        figures.append(Figure(f"scale.{name}_ms", ms, "ms", target=TARGET_MS))
        figures.append(Figure(f"scale.{name}_queries", queries, "queries"))
    figures += _sweeps()
    return figures
