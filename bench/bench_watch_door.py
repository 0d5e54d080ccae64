"""Watchers never slow Stop: the dashboard with 1,000 agents watching, beside none, in one run.

The production shape on loopback (bench/deployed.py): gunicorn (2 x 8 threads) told where the
watch server is, and the watch server. Each agent is an `AsyncClient` of its own given only the web
door's address, as the framework examples are, watching its own task: its `watch_stop` is sent to
the watch server by the web door's 307 and its one `POST /watch` poll stays there. (One client puts
all its watches on one poll, so a thousand watches on one client would be one watcher to the
servers, not a thousand.)

door.task_page_ms.<n>_watchers p50/p99   a signed-in person's GET of a task page
door.stop_post_ms.<n>_watchers p50/p99   the dashboard's Stop POST (a form post, answered 302)
    with n = 0, then n = BENCH_DOOR_WATCHERS (1,000) watchers waiting; BENCH_DOOR_SAMPLES of each (100),
    after 10 page loads to warm both web processes. With
    watchers, the stopped tasks are watched ones.
door.stop_heard_ms p99                   from the Stop POST being sent to that task's watcher
    returning (what an agent waits for)
door.watchers_waiting                    the connections the watch server held open once every
    client's poll was in flight (measuring starts only then)

    targets: task page and Stop POST p99 <= 200 ms with the watchers attached

    BENCH=watch_door python -m bench
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
    """WATCHERS agents, each its own `AsyncClient` watching its own task, in one loop of their own,
    until exit. One agent process has one client, and a client puts all its watches on one poll, so
    a thousand agents are a thousand clients: each follows the web door's 307 itself and holds its
    own `POST /watch` at the watch server. Only the httpx pools under them are shared, PER_POOL
    clients a pool (as one client's WatchPools would hold them), because making a thousand pools
    costs this process tens of seconds of CPU; the servers see the same thousand connections."""

    def __init__(self, servers: Deployed, token: str, tasks: list[int]) -> None:
        self.servers, self.token, self.tasks = servers, token, tasks
        self.returned: dict[int, float] = {}
        self.waiting = 0
        self._ready = threading.Event()
        self._done = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="bench-door-watchers")

    def __enter__(self) -> _Watchers:
        self._thread.start()
        if not self._ready.wait(240) or self._failed is not None:
            self._done.set()
            self._thread.join(60)
            raise RuntimeError(f"the watchers did not all start waiting in time: {self._failed}")
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

    def _loop(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # the waiting thread reports it instead of timing out blind
            self._failed = exc
            self._ready.set()

    async def _main(self) -> None:
        import httpx

        from stopdesk.client import AsyncClient
        from stopdesk.client.transport import WATCH_LIMITS
        from stopdesk.client.watch import WatchPools

        per_pool = WatchPools.PER_POOL
        pools = [httpx.AsyncClient(timeout=60, limits=WATCH_LIMITS) for _ in range(0, len(self.tasks), per_pool)]
        calls = httpx.AsyncClient(timeout=60)  # the clients' other calls: none are made here
        agents = [
            AsyncClient(self.servers.web_url, self.token, timeout=60, http=calls, watch_http=pools[n // per_pool])
            for n in range(len(self.tasks))
        ]

        async def watch(agent: AsyncClient, task_id: int) -> None:
            await agent.watch_stop(task_id, poll_s=POLL_S)
            self.returned[task_id] = time.perf_counter()

        watchers = [asyncio.create_task(watch(a, t)) for a, t in zip(agents, self.tasks, strict=True)]
        try:
            deadline = time.monotonic() + 180
            while True:
                # Attached: every client has its poll in flight, and the watch server holds them.
                polling = sum(agent._watches.polling for agent in agents)
                waiting = await asyncio.to_thread(_held, self.servers.watch_url)
                if polling == len(self.tasks) and waiting >= len(self.tasks):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{polling} of {len(self.tasks)} watchers polling, {waiting} at the watch server, after 180 s"
                    )
                await asyncio.sleep(0.2)
            self.waiting = waiting
            self._ready.set()
            while not self._done.is_set():
                await asyncio.sleep(0.05)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            for http in (calls, *pools):
                await http.aclose()


def _held(url: str) -> int:
    """Connections the server at `url` holds open (its long polls, seen from the socket table)."""
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=False
    )
    return len(out.stdout.splitlines())
