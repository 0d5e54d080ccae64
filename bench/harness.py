"""Shared pieces for benchmarks: a scratch PostgreSQL database and the figure format."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

# One database per run, so two benchmark runs on one machine cannot drop each other's.
BENCH_DB = os.environ.get("STOPDESK_BENCH_DB", f"stopdesk_bench_{os.getpid()}")
# Keep the database between runs (a seeded scale database takes minutes to fill).
KEEP_DB = os.environ.get("STOPDESK_BENCH_KEEP_DB") == "1"
ADMIN_DSN = os.environ.get("STOPDESK_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    target: float | None = None
    higher_is_better: bool = False

    @property
    def ratio(self) -> float | None:
        if self.target is None or self.target == 0:
            return None
        return self.value / self.target

    @property
    def met(self) -> bool:
        if self.target is None:
            return True
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def line(self) -> str:
        text = f"{self.name} {self.value:.4g} {self.unit}"
        if self.target is not None:
            sign = ">=" if self.higher_is_better else "<="
            ratio = "" if self.ratio is None else f", ratio {self.ratio:.2f}"
            text += f"  (target {sign} {self.target:g}{ratio}, {'met' if self.met else 'MISSED'})"
        return text


@contextlib.contextmanager
def scratch_database() -> Iterator[None]:
    """Create a fresh database, point Django at it, migrate, and drop it afterwards."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if not (KEEP_DB and exists):
            conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    try:
        yield
    finally:
        from django.db import connections

        from stopdesk.push.hub import stop_hub_close

        stop_hub_close()  # its listening connection ends here, not as an error when the database goes
        connections.close_all()
        if not KEEP_DB:
            with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


def page_timing(client, url: str, runs: int = 7) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """A page's median time in ms over `runs` requests, after one warm-up, and its query count."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm: templates compiled, connection open
    assert response.status_code == 200, response.status_code
    timings = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings), len(queries.captured_queries)
