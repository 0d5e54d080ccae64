"""The admin's event export at a million rows.

export.csv_rows / export.jsonl_rows            rows in the export (every event, no filter)
export.csv_rows_per_s / export.jsonl_rows_per_s  rows per second through Django's full stack
export.csv_cpu_us_per_row / export.jsonl_cpu_us_per_row  the exporting process's CPU time per row
export.csv_peak_rss_mb / export.jsonl_peak_rss_mb  the exporting process's peak RSS
export.csv_rss_growth_mb / export.jsonl_rss_growth_mb  that peak less its RSS before the export

Off by default (it seeds a million rows): `BENCH=export make bench`.

Seeds STOPDESK_BENCH_EXPORT_ROWS events (default 1,000,000) with one INSERT ... SELECT, the audit
triggers off (set-up, not history), then runs each export in a fresh Python process: signed in
as an admin through Django's test client, it reads the streamed body to the end and throws it
away, so the process's peak RSS is what the export costs. Growth must not depend on the row
count: the rows go through a server-side cursor, 2,000 at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.harness import Figure

ROWS = int(os.environ.get("STOPDESK_BENCH_EXPORT_ROWS", "1000000"))
GROWTH_TARGET_MB = 64.0

_CHILD = r"""
import json, os, resource, sys, time
import django
django.setup()
from django.test import Client
from django.urls import reverse
from django.contrib.auth import get_user_model

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

fmt = sys.argv[1]
client = Client()
client.force_login(get_user_model().objects.get(username="export-admin"))
url = reverse("admin:stopdesk_event_export", args=[fmt])
# Warm up: every import and template the export touches, on one row.
for _ in client.get(url, {"kind": "bench_warm_up"}).streaming_content:
    pass
before = rss_mb()
cpu = resource.getrusage(resource.RUSAGE_SELF)
cpu_before = cpu.ru_utime + cpu.ru_stime
started = time.perf_counter()
lines = size = 0
for chunk in client.get(url).streaming_content:
    lines += chunk.count(b"\n")
    size += len(chunk)
seconds = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_s = usage.ru_utime + usage.ru_stime - cpu_before
peak = usage.ru_maxrss / 1024
rows = lines - 1 if fmt == "csv" else lines
print(json.dumps({"rows": rows, "seconds": seconds, "cpu_s": cpu_s, "bytes": size, "before_mb": before, "peak_mb": peak}))
"""


def _exec(sql: str, params: list | None = None) -> None:  # type: ignore[type-arg]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def _seed(rows: int) -> None:
    """Events spread over the last 30 days, ten per task, with the text an export has to quote."""
    _exec(
        """SELECT stopdesk_event_partition(m::date) FROM generate_series(
               date_trunc('month', now() - interval '30 days'), date_trunc('month', now()), interval '1 month') m"""
    )
    _exec("ALTER TABLE stopdesk_event DISABLE TRIGGER USER")
    try:
        _exec(
            """
            INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data,
                seq, hash)
            SELECT now() - (g * interval '30 days') / %(rows)s, g / 10 + 1, g,
                   (ARRAY['item_registered', 'item_started', 'item_moved'])[g %% 3 + 1], 'runtime:bench',
                   'queued', 'running', 'Moved, "as asked", by the runtime', '{"attempt": 1}'::jsonb, g %% 10 + 1,
                   md5(g::text) || md5(g::text)
            FROM generate_series(1, %(rows)s) g
            """,
            {"rows": rows},
        )
    finally:
        _exec("ALTER TABLE stopdesk_event ENABLE TRIGGER USER")
    _exec("ANALYZE stopdesk_event")


def _export(fmt: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, fmt], capture_output=True, text=True, check=True, env=dict(os.environ)
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run() -> list[Figure]:
    from django.contrib.auth import get_user_model

    get_user_model().objects.get_or_create(
        username="export-admin", defaults={"is_staff": True, "is_superuser": True, "email": "e@example.test"}
    )
    _seed(ROWS)
    figures = []
    for fmt in ("csv", "jsonl"):
        result = _export(fmt)
        figures += [
            Figure(f"export.{fmt}_rows", result["rows"], "rows", target=ROWS, higher_is_better=True),
            Figure(f"export.{fmt}_rows_per_s", result["rows"] / result["seconds"], "rows/s"),
            # The web process's own CPU per row: what the rate would be on an idle machine.
            Figure(f"export.{fmt}_cpu_us_per_row", result["cpu_s"] / result["rows"] * 1e6, "us/row"),
            Figure(f"export.{fmt}_mb", result["bytes"] / 2**20, "MB"),
            Figure(f"export.{fmt}_peak_rss_mb", result["peak_mb"], "MB"),
            Figure(f"export.{fmt}_rss_growth_mb", result["peak_mb"] - result["before_mb"], "MB", GROWTH_TARGET_MB),
        ]
    return figures
