"""Stop, pushed: how long from a stop request to the agent hearing of it, with 1,000 tasks watched.

- `stop.propagation_ms.in_process` p50/p99: from the start of the stop request's transaction (its
  commit included) to the agent coroutine receiving CancelledError. 1,000 asyncio children, one
  per task, under `supervise()` in one event loop; tasks are stopped one at a time.
- `stop.propagation_ms.http` p50/p99: the same, to a remote client's `watch_stop()` returning:
  1,000 `AsyncClient.watch_stop()` long polls against the `watch` server (uvicorn, ASGI, its own
  process on a free loopback port).
- `stop.propagation_ms.polling_0_5s` p50/p99: the design this replaces, in the same run: each task
  polled every 0.5 s (what the supervisor's and LedgerTask's heartbeats did).
- `stop.watch_idle_queries_per_s`: queries per second against stopdesk's tables while the 1,000
  HTTP watchers and 1,000 in-process watchers wait and nothing happens (PostgreSQL's own count of
  table scans, pg_stat_user_tables), beside the polling design's figure. The window lies inside
  one long poll (50 s): what each new poll costs is bench_watch_idle's figure.

    targets: p99 <= 50 ms in-process, <= 100 ms over HTTP; idle queries 0/s
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import Figure

TASKS = int(os.environ.get("BENCH_PUSH_TASKS", "1000"))
STOPS = int(os.environ.get("BENCH_PUSH_STOPS", "40"))
IDLE_S = 10.0
SETTLE_S = 11.0  # longer than PostgreSQL's 10 s delay for an idle backend's statistics
NO_DISPATCH: dict[str, Any] = {"dispatch": lambda ids: None}


def run() -> list[Figure]:
    from django.db import connections

    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-push-{os.getpid()}-{time.time_ns()}", actor="bench")
    figures: list[Figure] = []

    in_process, idle_hub = _in_process(runtime)
    figures += _percentiles("stop.propagation_ms.in_process", in_process, target_p99=50.0)

    with _watch_server() as url:
        over_http, idle_http = _over_http(runtime, token, url)
    figures += _percentiles("stop.propagation_ms.http", over_http, target_p99=100.0)

    polling, idle_polling = _polling(runtime)
    figures += _percentiles("stop.propagation_ms.polling_0_5s", polling)
    figures += [
        Figure("stop.watch_idle_queries_per_s", idle_http + idle_hub, "queries/s", target=0.0),
        Figure("stop.watch_idle_queries_per_s.in_process", idle_hub, "queries/s"),
        Figure("stop.watch_idle_queries_per_s.http", idle_http, "queries/s"),
        Figure("stop.watch_idle_queries_per_s.polling_0_5s", idle_polling, "queries/s"),
    ]
    from stopdesk.push.hub import stop_hub_close
    from stopdesk.push.watch import close_connections

    stop_hub_close()  # before the scratch database is dropped under its listener
    close_connections()
    connections.close_all()
    return figures


# --- (a) in-process: asyncio children under supervise() ----------------------------------------


def _in_process(runtime: Any) -> tuple[list[float], float]:
    from stopdesk.agent.aio import supervise

    tasks, items = _tasks_with_items(runtime, TASKS, mechanism="asyncio")
    cancelled_at: dict[int, float] = {}
    ready = threading.Event()
    done = threading.Event()

    async def child_body(task_id: int) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled_at[task_id] = time.perf_counter()
            raise

    async def main() -> None:
        # Leases renewed hourly: the figure is about Stop, not heartbeat traffic.
        async with supervise(actor="bench", poll_s=3600, cleanup_s=1.0) as group:
            for task_id, item_id in zip(tasks, items, strict=True):
                group.start(item_id, lambda _child, t=task_id: child_body(t))
            while sum(1 for c in group.children if c.task is not None) < len(items):
                await asyncio.sleep(0.05)
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)
            await group.cancel_all()

    loop_thread = threading.Thread(target=lambda: asyncio.run(main()), name="bench-supervisor")
    loop_thread.start()
    if not ready.wait(300):
        raise RuntimeError("the supervisor did not start its children in time")
    idle = _idle_queries_per_s()
    latencies = _stop_and_time(tasks[:STOPS], lambda task_id: cancelled_at.get(task_id))
    done.set()
    loop_thread.join(60)
    return latencies, idle


# --- (b) over HTTP: AsyncClient.watch_stop() against the watch server ---------------------------


def _over_http(runtime: Any, token: str, url: str) -> tuple[list[float], float]:
    import httpx

    from stopdesk.client import AsyncClient

    tasks, _ = _tasks_with_items(runtime, TASKS, mechanism="manual")
    threads: list[int] = []
    returned_at: dict[int, float] = {}
    ready = threading.Event()
    done = threading.Event()

    async def watch(sd: AsyncClient, task_id: int) -> None:
        await sd.watch_stop(task_id, poll_s=50)
        returned_at[task_id] = time.perf_counter()

    async def main() -> None:
        limits = httpx.Limits(max_connections=TASKS + 50, max_keepalive_connections=TASKS + 50)
        async with httpx.AsyncClient(limits=limits, timeout=60) as http:
            sd = AsyncClient(url, token, http=http)
            sd.http.headers["Authorization"] = f"Bearer {token}"
            watchers = [asyncio.create_task(watch(sd, t)) for t in tasks]
            await asyncio.sleep(2.0)
            await _until(lambda: _server_watching(url) >= len(tasks), 120)
            threads.append(_server_threads(url))
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    loop_thread = threading.Thread(target=lambda: asyncio.run(main()), name="bench-watchers")
    loop_thread.start()
    if not ready.wait(180):
        done.set()
        raise RuntimeError("the watchers did not all start waiting in time")
    idle = _idle_queries_per_s()
    latencies = _stop_and_time(tasks[:STOPS], lambda task_id: returned_at.get(task_id))
    done.set()
    loop_thread.join(60)
    print(f"# watch server: {threads[0]} threads while {len(tasks)} watchers waited", flush=True)
    return latencies, idle


def _server_threads(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-Htlnp", f"( sport = :{port} )"], capture_output=True, text=True).stdout
    pid = out.split("pid=")[1].split(",")[0] if "pid=" in out else ""
    return len(os.listdir(f"/proc/{pid}/task")) if pid else -1


def _server_watching(url: str) -> int:
    # The watch server's long polls show up as idle-in-loop requests; count them from the client
    # side instead: a watcher is waiting once the server holds its request (ESTABLISHED sockets).
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True)
    return len(out.stdout.splitlines())


async def _until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise RuntimeError("condition not met in time")
        await asyncio.sleep(0.2)


# --- the design this replaces: each task polled every 0.5 s --------------------------------------


def _polling(runtime: Any) -> tuple[list[float], float]:
    from django.db import connection

    from stopdesk.models import Task

    tasks, _ = _tasks_with_items(runtime, TASKS, mechanism="manual")
    noticed_at: dict[int, float] = {}
    ready = threading.Event()
    done = threading.Event()
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench-poll")

    def stopped(task_id: int) -> bool:
        return Task.objects.filter(pk=task_id, stop_requested_at__isnull=False).exists()

    async def poller(task_id: int) -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            await asyncio.sleep(0.5)
            if await loop.run_in_executor(pool, stopped, task_id):
                noticed_at[task_id] = time.perf_counter()
                return

    async def main() -> None:
        pollers = [asyncio.create_task(poller(t)) for t in tasks]
        await asyncio.sleep(1.0)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.05)
        for p in pollers:
            p.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)

    loop_thread = threading.Thread(target=lambda: asyncio.run(main()), name="bench-pollers")
    loop_thread.start()
    ready.wait(60)
    idle = _idle_queries_per_s()
    latencies = _stop_and_time(tasks[:STOPS], lambda task_id: noticed_at.get(task_id))
    done.set()
    loop_thread.join(60)
    for _ in range(8):
        pool.submit(connection.close)
    pool.shutdown(wait=True)
    return latencies, idle


# --- shared ----------------------------------------------------------------------------------------


def _tasks_with_items(runtime: Any, n: int, *, mechanism: str) -> tuple[list[int], list[int]]:
    from django.db import connection, transaction

    from stopdesk.models import Task, WorkItem

    with transaction.atomic():
        tasks = Task.objects.bulk_create(Task(title=f"bench {i}", runtime=runtime) for i in range(n))
        items = WorkItem.objects.bulk_create(
            WorkItem(task=t, kind="local_worker", noun="draft", mechanism=mechanism) for t in tasks
        )
    connection.close()
    return [t.pk for t in tasks], [i.pk for i in items]


def _stop_and_time(
    task_ids: list[int], heard_at: Callable[[int], float | None], *, settle_s: float = 0.0
) -> list[float]:
    from stopdesk.services.stop import task_request_stop

    latencies = []
    for task_id in task_ids:
        started = time.perf_counter()
        task_request_stop(task_id=task_id, actor="bench", **NO_DISPATCH)
        deadline = time.monotonic() + 10
        while heard_at(task_id) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"task {task_id}'s stop was not heard within 10 s")
            time.sleep(0.0005)
        latencies.append((heard_at(task_id) or started) - started)
        time.sleep(0.05 + settle_s)
    return [1000 * s for s in latencies]


def _idle_queries_per_s() -> float:
    """Queries per second against stopdesk's tables over IDLE_S while everyone waits: the table
    scans (sequential and index) PostgreSQL counted for them. Autovacuum's work is not a scan, so
    only queries count, whoever sent them.

    Backends report their counts lazily (an idle one within 10 s), so the window opens after the
    setup's counts have landed; the probe itself reads only statistics views."""
    import psycopg
    from django.db import connection

    name = connection.settings_dict["NAME"]
    sql = (
        "SELECT pg_stat_force_next_flush(), COALESCE(SUM(COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0)), 0) "
        "FROM pg_stat_user_tables WHERE relname LIKE 'stopdesk%%' OR relname LIKE 'reconcile%%'"
    )
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True) as probe:

        def scans() -> int:
            row = probe.execute(sql).fetchone()
            return int(row[1]) if row else 0

        time.sleep(SETTLE_S)
        before = scans()
        time.sleep(IDLE_S)
        after = scans()
    return (after - before) / IDLE_S


def _percentiles(name: str, values: list[float], *, target_p99: float | None = None) -> list[Figure]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return [
        Figure(f"{name}.p50", statistics.median(ordered), "ms"),
        Figure(f"{name}.p99", p99, "ms", target=target_p99),
    ]


class _watch_server:
    """`python -m stopdesk watch`'s server: uvicorn on the ASGI app, on a free loopback port."""

    def __enter__(self) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "DEBUG": "0", "LOG_LEVEL": "ERROR", "DJANGO_SETTINGS_MODULE": "stopdesk.settings"}
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "stopdesk.asgi:application", "--host", "127.0.0.1"),
                *("--port", str(port), "--no-access-log", "--log-level", "warning", "--timeout-keep-alive", "75"),
            ],
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return f"http://127.0.0.1:{port}"
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError("uvicorn exited at start") from None
                time.sleep(0.1)
        raise RuntimeError("uvicorn did not listen within 30 s")

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
