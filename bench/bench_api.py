"""api.start_per_s: boundary starts per second through the HTTP API from 4 concurrent clients,
against the same starts through the in-process LocalRuntime from 4 threads.

Both paths do the same work per start: the runtime's scoping check, the boundary statement, and
reading the item back for the answer. The HTTP path adds what a remote runtime pays for: the HTTP
request, the bearer-token lookup, one transaction per request, and the Idempotency-Key the client
sends with every write (its replay row is written in the same transaction) so that a retry is safe.

The server is gunicorn (gthread) in its own processes on a free loopback port, with DEBUG off; the
clients are `stopdesk.client.Client` instances, one per thread.

    target: HTTP >= 40% of in-process
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from bench.harness import Figure

CLIENTS = 4
STARTS = int(os.environ.get("BENCH_API_STARTS", "600"))  # per client, per path
WORKERS = int(os.environ.get("BENCH_API_WORKERS", str(max(2, os.cpu_count() or 2))))


def run() -> list[Figure]:
    from django.db import connections
    from django.test.utils import override_settings

    from stopdesk.agent.runtime import LocalRuntime
    from stopdesk.client import Client
    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-{os.getpid()}-{time.time_ns()}", actor="bench")
    connections.close_all()

    with override_settings(DEBUG=False):
        local_items = _queued_items(runtime, CLIENTS * STARTS)

        def local_worker(ids: list[int]) -> None:
            sd = LocalRuntime(runtime=runtime, worker="bench")
            try:
                for item_id in ids:
                    sd.start(item_id)
            finally:
                connections["default"].close()

        _concurrently(local_worker, _queued_items(runtime, CLIENTS * 20))  # warm connections and code
        local_per_s = len(local_items) / _concurrently(local_worker, local_items)

        http_items = _queued_items(runtime, CLIENTS * STARTS)
        with _server() as url:

            def http_worker(ids: list[int]) -> None:
                with Client(url, token, worker="bench") as sd:
                    for item_id in ids:
                        sd.start(item_id)

            _concurrently(http_worker, _queued_items(runtime, CLIENTS * 20))
            http_per_s = len(http_items) / _concurrently(http_worker, http_items)

    _check_all_running(local_items + http_items)
    ratio = http_per_s / local_per_s
    return [
        Figure("api.start_per_s", http_per_s, "starts/s", target=0.4 * local_per_s, higher_is_better=True),
        Figure("api.start_per_s.in_process", local_per_s, "starts/s"),
        Figure("api.start_http_to_in_process", ratio, "ratio", target=0.4, higher_is_better=True),
    ]


def _queued_items(runtime: object, n: int) -> list[int]:
    from django.db import connection

    from stopdesk.models import WorkItem
    from stopdesk.services.items import task_create

    task = task_create(title="bench", actor="bench", runtime=runtime)
    WorkItem.objects.bulk_create(WorkItem(task=task, kind="local_worker", noun="draft") for _ in range(n))
    ids = list(WorkItem.objects.filter(task=task).order_by("id").values_list("id", flat=True))
    connection.close()
    return ids


def _concurrently(work: Callable[[list[int]], None], ids: list[int]) -> float:
    chunks = [ids[i::CLIENTS] for i in range(CLIENTS)]
    errors: list[BaseException] = []

    def guarded(chunk: list[int]) -> None:
        try:
            work(chunk)
        except BaseException as exc:  # surfaced below; a silent thread would flatter the figure
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(chunk,)) for chunk in chunks]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def _check_all_running(ids: list[int]) -> None:
    from stopdesk.models import WorkItem

    running = WorkItem.objects.filter(pk__in=ids, state="running").count()
    if running != len(ids):
        raise AssertionError(f"only {running} of {len(ids)} benchmark items are running")


class _server:
    def __enter__(self) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "DEBUG": "0", "LOG_LEVEL": "ERROR", "DJANGO_SETTINGS_MODULE": "stopdesk.settings"}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "stopdesk.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--worker-class",
                "gthread",
                "--workers",
                str(WORKERS),
                "--threads",
                str(CLIENTS),
                "--keep-alive",
                "30",
                "--log-level",
                "warning",
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
                    raise RuntimeError("gunicorn exited at start") from None
                time.sleep(0.1)
        raise RuntimeError("gunicorn did not listen within 30 s")

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
