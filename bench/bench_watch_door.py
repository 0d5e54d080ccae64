"""Watchers never slow Stop: the dashboard with 1,000 agents watching, beside none, in one run.

The production shape on loopback (bench/deployed.py): gunicorn (2 x 8 threads) told where the
watch server is, and the watch server. The agents are one `AsyncClient` given only the web door's
address, as the framework examples are: each `watch_stop` is sent to the watch server by the web
door's 307 and stays there.

door.task_page_ms.<n>_watchers p50/p99   a signed-in person's GET of a task page
door.stop_post_ms.<n>_watchers p50/p99   the dashboard's Stop POST (a form post, answered 302)
    with n = 0, then n = BENCH_DOOR_WATCHERS (1,000) watchers waiting; BENCH_DOOR_SAMPLES of each (100),
    after 10 page loads to warm both web processes. With
    watchers, the stopped tasks are watched ones.
door.stop_heard_ms p99                   from the Stop POST being sent to that task's watcher
    returning (what an agent waits for)
door.watchers_waiting                    the long polls the watch server held while measuring

    targets: task page and Stop POST p99 <= 200 ms with the watchers attached
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from typing import Any

from bench.deployed import Deployed, deployed, operator_create, p50_p99, signed_in, timed_ms
from bench.harness import Figure

WATCHERS = int(os.environ.get("BENCH_DOOR_WATCHERS", "1000"))
SAMPLES = int(os.environ.get("BENCH_DOOR_SAMPLES", "100"))
WARM_UP = 10  # page loads before measuring: both web processes have compiled the templates
TARGET_MS = 200.0
POLL_S = 50  # longer than the measurement: every watcher holds one long poll throughout


def run() -> list[Figure]:
    from django.db import connections

    from stopdesk.services.items import task_create
    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-door-{os.getpid()}-{time.time_ns()}", actor="bench")
    quiet = [task_create(title=f"quiet {n}", actor="bench").pk for n in range(SAMPLES)]
    watched = [task_create(title=f"watched {n}", actor="bench", runtime=runtime).pk for n in range(WATCHERS)]
    username = operator_create()
    connections.close_all()
    figures: list[Figure] = []
    with deployed() as servers, contextlib.closing(signed_in(servers.web_url, username)) as browser:
        for _ in range(WARM_UP):
            timed_ms(lambda: browser.get(f"/tasks/{quiet[0]}/"), 200)
        pages, posts, _ = _sample(browser, quiet, {})
        figures += p50_p99("door.task_page_ms.0_watchers", pages)
        figures += p50_p99("door.stop_post_ms.0_watchers", posts)
        with _Watchers(servers, token, watched) as watchers:
            pages, posts, sent = _sample(browser, watched[:SAMPLES], watchers.returned)
            heard = watchers.heard(sent)
        figures += p50_p99(f"door.task_page_ms.{WATCHERS}_watchers", pages, target_p99=TARGET_MS)
        figures += p50_p99(f"door.stop_post_ms.{WATCHERS}_watchers", posts, target_p99=TARGET_MS)
        figures += p50_p99("door.stop_heard_ms", heard)
        figures.append(Figure("door.watchers_waiting", watchers.waiting, "long polls"))
    connections.close_all()
    return figures


def _sample(browser: Any, tasks: list[int], returned: dict[int, float]) -> tuple[list[float], list[float], dict]:
    """Open each task's page, then press its Stop; the times, and when each Stop was sent."""
    pages, posts, sent = [], [], {}
    for task_id in tasks:
        pages.append(timed_ms(lambda t=task_id: browser.get(f"/tasks/{t}/"), 200))
        headers = {"X-CSRFToken": browser.cookies["csrftoken"], "Referer": f"{browser.base_url}tasks/{task_id}/"}
        sent[task_id] = time.perf_counter()
        posts.append(timed_ms(lambda t=task_id, h=headers: browser.post(f"/tasks/{t}/stop/", headers=h), 302))
    return pages, posts, sent


class _Watchers:
    """WATCHERS `watch_stop`s on one AsyncClient, in a loop of their own, until exit."""

    def __init__(self, servers: Deployed, token: str, tasks: list[int]) -> None:
        self.servers, self.token, self.tasks = servers, token, tasks
        self.returned: dict[int, float] = {}
        self.waiting = 0
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="bench-door-watchers")

    def __enter__(self) -> _Watchers:
        self._thread.start()
        if not self._ready.wait(180):
            self._done.set()
            raise RuntimeError("the watchers did not all start waiting in time")
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(60)

    def heard(self, sent: dict[int, float]) -> list[float]:
        deadline = time.monotonic() + 10
        while not all(t in self.returned for t in sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        missing = [t for t in sent if t not in self.returned]
        if missing:
            raise RuntimeError(f"{len(missing)} stopped tasks' watchers never returned")
        return [(self.returned[t] - sent[t]) * 1000 for t in sent]

    async def _main(self) -> None:
        from stopdesk.client import AsyncClient

        async with AsyncClient(self.servers.web_url, self.token, timeout=60) as sd:

            async def watch(task_id: int) -> None:
                await sd.watch_stop(task_id, poll_s=POLL_S)
                self.returned[task_id] = time.perf_counter()

            watchers = [asyncio.create_task(watch(t)) for t in self.tasks]
            deadline = time.monotonic() + 120
            while (waiting := await asyncio.to_thread(_held, self.servers.watch_url)) < len(self.tasks):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {waiting} of {len(self.tasks)} watchers reached the watch server")
                await asyncio.sleep(0.2)
            self.waiting = waiting
            self._ready.set()
            while not self._done.is_set():
                await asyncio.sleep(0.05)
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)


def _held(url: str) -> int:
    """Connections the server at `url` holds open (its long polls, seen from the socket table)."""
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=False
    )
    return len(out.stdout.splitlines())
