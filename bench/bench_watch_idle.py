"""What an idle watcher costs the database: queries per watcher per hour, against the `watch` server.

A remote watcher is a client's `watch_stop()`: long polls of GET /api/v1/tasks/{id}/stop/watch,
each answered after the client's poll (`stopdesk.client.watch.POLL_S`, 25 s) with `stopped: false`
and sent again at once. While a poll waits it is a future on the server's event loop, woken by the
process's one LISTEN connection; each new poll checks the token, reads the task, and first checks
that its thread's connection still works (CONN_HEALTH_CHECKS).

Counted by PostgreSQL itself: the bench database's transactions (pg_stat_database, xact_commit +
xact_rollback). Every statement the watch server sends runs in autocommit, so one transaction is
one query, whichever layer sent it (Django's cursors, or the driver's own health check). Backends
report their counts lazily (an idle one within 10 s), so each window is read after the counts land.

- `watch.idle.queries_per_poll`: over REQUESTS watch requests answered at once (`timeout=0`: the
  same work as a re-poll, without its wait), spread over WATCHERS tasks.
- `watch.idle.queries_per_poll.many_<WATCHERS>_tasks`: over MANY_REQUESTS watches of all WATCHERS
  tasks in one request (POST /api/v1/watch, `timeout=0`): what one re-poll of an `AsyncClient`
  costs, since it watches all its tasks on one poll. The cost is per poll, not per task.
- `watch.idle.queries_per_s_between_polls`: over a window inside the long poll of WATCHERS
  watches (the client's own `AsyncClient.watch_stop`, so one poll of them all), nothing happening.
- `watch.idle.queries_per_watcher_per_hour`: queries per poll x polls per hour (3600 / POLL_S),
  plus what the window between polls showed: a watcher that polls its own task (`Client`, a
  per-task poll); an `AsyncClient` pays this once for all its tasks.

    BENCH=watch_idle python -m bench
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from bench.bench_stop_push import _tasks_with_items, _watch_server
from bench.harness import ADMIN_DSN, Figure

WATCHERS = 200
REQUESTS = 1000
MANY_REQUESTS = 200
LONG_POLL_S = 55.0  # the server's longest: the window between polls fits inside one
SETTLE_S = 11.0  # longer than PostgreSQL's 10 s delay for an idle backend's statistics


def run() -> list[Figure]:
    import httpx
    from django.db import connection

    from stopdesk.client.watch import POLL_S
    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-watch-idle-{time.time_ns()}", actor="bench")
    tasks, _ = _tasks_with_items(runtime, WATCHERS, mechanism="manual")
    name = connection.settings_dict["NAME"]
    connection.close()
    headers = {"Authorization": f"Bearer {token}"}
    with _watch_server() as url, _Transactions(name) as count:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
            for task_id in tasks[:10]:  # warm: the server's threads hold their connections
                http.get(f"/api/v1/tasks/{task_id}/stop/watch", params={"timeout": 0}).raise_for_status()
            before = count()
            for n in range(REQUESTS):
                answer = http.get(f"/api/v1/tasks/{tasks[n % len(tasks)]}/stop/watch", params={"timeout": 0})
                assert answer.status_code == 200 and answer.json()["stopped"] is False, answer.text
            per_poll = (count() - before) / REQUESTS
            before = count()
            for _ in range(MANY_REQUESTS):  # an AsyncClient's one poll of all its tasks
                answer = http.post("/api/v1/watch", json={"tasks": tasks, "timeout": 0})
                assert answer.status_code == 200 and answer.json()["stopped"] == [], answer.text
            per_many_poll = (count() - before) / MANY_REQUESTS
        between = _between_polls(url, token, tasks, count)
    per_hour = per_poll * 3600 / POLL_S + between * 3600 / len(tasks)
    print(f"# {per_poll:.2f} queries per poll; a poll every {POLL_S:g} s; {WATCHERS} watchers idle", flush=True)
    return [
        Figure("watch.idle.queries_per_poll", per_poll, "queries"),
        Figure(f"watch.idle.queries_per_poll.many_{len(tasks)}_tasks", per_many_poll, "queries"),
        Figure("watch.idle.queries_per_s_between_polls", between, "queries/s", target=0.0),
        Figure("watch.idle.queries_per_watcher_per_hour", per_hour, "queries/h"),
    ]


def _between_polls(url: str, token: str, tasks: list[int], count: _Transactions) -> float:
    import httpx

    from stopdesk.client import AsyncClient

    attached = threading.Event()
    done = threading.Event()

    async def main() -> None:
        limits = httpx.Limits(max_connections=len(tasks) + 10, max_keepalive_connections=len(tasks) + 10)
        async with httpx.AsyncClient(limits=limits, timeout=LONG_POLL_S + 10) as http:
            client = AsyncClient(url, token, http=http)
            client.http.headers["Authorization"] = f"Bearer {token}"
            watchers = [asyncio.create_task(client.watch_stop(t, poll_s=LONG_POLL_S)) for t in tasks]
            await asyncio.sleep(1.0)
            attached.set()
            while not done.is_set():
                await asyncio.sleep(0.05)
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    loop = threading.Thread(target=lambda: asyncio.run(main()), name="bench-idle-watchers")
    started = time.monotonic()
    loop.start()
    attached.wait(30)
    before, opened = count(), count.at  # waits SETTLE_S first: the attaching polls' counts have landed
    time.sleep(max(0.0, started + LONG_POLL_S - SETTLE_S - 2.0 - time.monotonic()))
    after = count()  # read before the next polls' counts could land
    done.set()
    loop.join(60)
    return (after - before) / (count.at - opened)


class _Transactions:
    """The bench database's transaction count, read from another database (the probe's own reads
    are not counted), with the time of each read."""

    SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"

    def __init__(self, name: str) -> None:
        self.name = name
        self.at = 0.0

    def __enter__(self) -> _Transactions:
        import psycopg

        self.probe = psycopg.connect(ADMIN_DSN, autocommit=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.probe.close()

    def __call__(self) -> int:
        time.sleep(SETTLE_S)
        row = self.probe.execute(self.SQL, [self.name]).fetchone()
        self.at = time.monotonic()
        return int(row[0]) if row else 0
