"""/metrics on a big ledger.

metrics.scrape_ms       one GET /metrics (median of 20), at 10,000 and at 1,000,000 items
metrics.scrape_queries  SQL statements per scrape, at both sizes: must not grow
metrics.tally_ms        the background job that feeds it (beat, every 30 s), at both sizes

The ledger is seeded with set-based SQL (generate_series): 1 % uncertain with deadlines around
now, the rest completed or cancelled, over five mechanisms. STOPDESK_BENCH_METRICS_ITEMS sets the
big size (default 1,000,000).
"""

from __future__ import annotations

import os
import statistics
import time

from bench.harness import Figure

SMALL = 10_000
BIG = int(os.environ.get("STOPDESK_BENCH_METRICS_ITEMS", "1000000"))
SCRAPES = 20


def _seed(upto: int, already: int) -> None:
    """Add items `already+1 .. upto`, 1,000 per task, in two statements."""
    from django.db import connection

    from stopdesk.models import WorkItem

    fixed = {
        "task_id": "t.first + (g - 1) / 1000 - %(task_offset)s",
        "kind": "'model_request'",
        "mechanism": "(ARRAY['openai','mcp','celery','http','asyncio'])[1 + g %% 5]",
        "noun": "'draft'",
        "state": "CASE WHEN g %% 100 = 0 THEN 'uncertain' WHEN g %% 7 = 0 THEN 'cancelled' ELSE 'completed' END",
        "created_at": "now()",
        "updated_at": "now() - (g %% 1000) * interval '1 second'",
        "investigate_by": "CASE WHEN g %% 100 = 0 THEN now() + (g %% 48 - 24) * interval '1 hour' END",
    }
    columns, values, params = [], [], {"task_offset": already // 1000, "a": already + 1, "b": upto}
    for f in WorkItem._meta.concrete_fields:
        if f.primary_key:
            continue
        columns.append(f.column)
        if f.column in fixed:
            values.append(fixed[f.column])
        elif f.null:
            values.append("NULL")
        else:
            # Any other column gets its model default, so a new column does not break the seed.
            params[f.column] = f.get_db_prep_save(f.get_default(), connection)
            values.append(f"%({f.column})s")
    tasks = (upto - already + 999) // 1000
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO stopdesk_task (title, created_at) SELECT 'bench ' || g, now() FROM generate_series(1, %s) g"
            " RETURNING id",
            [tasks],
        )
        first = min(r[0] for r in cursor.fetchall())
        params["first"] = first
        cursor.execute(
            f"INSERT INTO stopdesk_workitem ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} FROM generate_series(%(a)s, %(b)s) g, (SELECT %(first)s::bigint AS first) t",
            params,
        )
        cursor.execute("ANALYZE stopdesk_workitem")
        cursor.execute("ANALYZE stopdesk_task")


def _measure(size: int) -> tuple[float, int, float]:
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from stopdesk.notify.tally import metrics_tally

    started = time.perf_counter()
    metrics_tally()
    tally_ms = (time.perf_counter() - started) * 1000
    settings.STOPDESK_METRICS_TOKEN = "bench"
    client = Client()
    times, queries = [], 0
    for _ in range(SCRAPES):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get("/metrics", headers={"Authorization": "Bearer bench"})
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
        queries = len(captured)
    body = response.content.decode()
    uncertain = next(
        float(line.split()[-1]) for line in body.splitlines() if line.startswith("stopdesk_uncertain_items ")
    )
    assert uncertain == size // 100, (uncertain, size)
    return statistics.median(times), queries, tally_ms


def run() -> list[Figure]:
    figures = []
    seeded = 0
    for size in (SMALL, BIG):
        _seed(size, seeded)
        seeded = size
        scrape_ms, queries, tally_ms = _measure(size)
        label = f"@{size:,}".replace(",", "_")
        figures += [
            Figure(f"metrics.scrape_ms{label}", scrape_ms, "ms", target=100),
            Figure(f"metrics.scrape_queries{label}", queries, "statements"),
            Figure(f"metrics.tally_ms{label}", tally_ms, "ms"),
        ]
    return figures
