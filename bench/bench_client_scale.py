"""A client scales to a thousand runs: one `AsyncClient`, BENCH_SCALE_RUNS (1,000) framework runs
at once, each watching its task's Stop, against the production shape on loopback (bench/deployed.py:
gunicorn 2 x 8 threads told where the watch server is, and the watch server). The client is given
only the web door's address, as the framework examples are.

A run is the core every framework integration shares (`stopdesk.agent.frameworks.core.StopdeskRun`),
driven by a scripted agent in the bench process instead of a framework and a model server, which
this 2-CPU machine could not run a thousand of beside the servers: the "model" thinks
BENCH_SCALE_THINK_S (10 s; the runs begin spread across one such interval) and calls one tool, whose body sleeps 50 ms;
each tool call passes the boundary (`register_started`, one request) and writes its result off the
caller's path (`finish_fast`), as under a framework.

scale.get_task_ms.<phase> p50/p99   `get_task` on the same client: with no watches, with N bare
    `watch_stop`s waiting (no runs), and while the N runs run (their watches waiting too)
scale.boundary_pass_ms p50/p99      a tool call's registration and boundary, before its body runs,
    over a STEADY_S (20 s) window of the N runs
scale.stop_to_cancelled_ms.paced p50/p99    from a stop request's recorded time (the database's
    clock, in its transaction) to that run's agent receiving CancelledError: BENCH_SCALE_PACED_STOPS
    (100) tasks stopped one at a time, 100 ms apart, by another process, while the rest run on
scale.stop_to_cancelled_ms.at_once p50/p99  the same for all the other runs, stopped as fast as 4
    processes can: the client's loop then hears hundreds of Stops at once and settles each run
scale.stop_to_watch_answered_ms.<phase>     of that, until the run's watch answer was read here (its
    `on_stop`, which starts the run's cancel)
scale.runs_cancelled                        runs whose agent received CancelledError (of N)
scale.stop_span_s.at_once, scale.stops_per_s.at_once    how long the stopping processes took to
    stop the runs at once, and how many Stops a second that is

BENCH_SCALE_PROFILE=<file> writes a cProfile of this process while the runs hear Stop at once.

    targets: Stop -> CancelledError p99 <= 100 ms; get_task while watching p99 <= 200 ms
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.bench_watch_door import _held
from bench.deployed import Deployed, deployed, p50_p99
from bench.harness import Figure

RUNS = int(os.environ.get("BENCH_SCALE_RUNS", "1000"))
THINK_S = float(os.environ.get("BENCH_SCALE_THINK_S", "10"))
STEADY_S = float(os.environ.get("BENCH_SCALE_STEADY_S", "20"))
STOPS = int(os.environ.get("BENCH_SCALE_PACED_STOPS", "100"))
PACE_S = 0.1
STOPPERS = 4
TOOL_S = 0.05
GET_TASK_SAMPLES = 30
STOP_TARGET_MS = 100.0
GET_TASK_TARGET_MS = 200.0


def run() -> list[Figure]:
    from django.db import connections

    from stopdesk.services.items import task_create
    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-scale-{os.getpid()}-{time.time_ns()}", actor="bench")
    tasks = [task_create(title=f"run {n}", actor="bench", runtime=runtime).pk for n in range(RUNS)]
    spare = task_create(title="looked at", actor="bench", runtime=runtime).pk
    connections.close_all()
    with deployed() as servers:
        bench = _Scale(servers, token, tasks, spare)
        asyncio.run(bench.main())
    connections.close_all()
    stopped_at = _stop_requested_at(tasks)

    def heard(share: list[int]) -> list[float]:
        return [(bench.cancelled_at[t] - stopped_at[t]) * 1000 for t in share if t in bench.cancelled_at]

    def answered(share: list[int]) -> list[float]:
        return [(bench.answered_at[t] - stopped_at[t]) * 1000 for t in share if t in bench.answered_at]

    return [
        *p50_p99("scale.get_task_ms.no_watches", bench.get_task["none"]),
        *p50_p99(f"scale.get_task_ms.{RUNS}_watches", bench.get_task["watches"], target_p99=GET_TASK_TARGET_MS),
        *p50_p99(f"scale.get_task_ms.{RUNS}_runs", bench.get_task["runs"], target_p99=GET_TASK_TARGET_MS),
        *p50_p99("scale.boundary_pass_ms", bench.boundary),
        *p50_p99("scale.stop_to_cancelled_ms.paced", heard(tasks[:STOPS]), target_p99=STOP_TARGET_MS),
        *p50_p99("scale.stop_to_cancelled_ms.at_once", heard(tasks[STOPS:]), target_p99=STOP_TARGET_MS),
        *p50_p99("scale.stop_to_watch_answered_ms.paced", answered(tasks[:STOPS])),
        *p50_p99("scale.stop_to_watch_answered_ms.at_once", answered(tasks[STOPS:])),
        Figure("scale.runs_cancelled", len(heard(tasks)), f"of {RUNS}", target=RUNS, higher_is_better=True),
        *_stop_rate(stopped_at, tasks[STOPS:]),
    ]


def _stop_rate(stopped_at: dict[int, float], share: list[int]) -> list[Figure]:
    """How fast the stopping processes stopped the runs "at once": Stops a second, over the span
    of their recorded times."""
    times = sorted(stopped_at[t] for t in share if t in stopped_at)
    if len(times) < 2 or times[-1] <= times[0]:
        return []
    span = times[-1] - times[0]
    return [
        Figure("scale.stop_span_s.at_once", span, "s"),
        Figure("scale.stops_per_s.at_once", (len(times) - 1) / span, "/s", higher_is_better=True),
    ]


class _Scale:
    def __init__(self, servers: Deployed, token: str, tasks: list[int], spare: int) -> None:
        self.servers, self.token, self.tasks, self.spare = servers, token, tasks, spare
        self.get_task: dict[str, list[float]] = {}
        self.boundary: list[float] = []
        self.measuring = False
        self.cancelled_at: dict[int, float] = {}
        self.answered_at: dict[int, float] = {}  # when each run's watch answered "stopped", here

    async def main(self) -> None:
        from stopdesk.client import AsyncClient

        answered_at = self.answered_at

        class Timed(AsyncClient):
            """The client, noting when each watch's answer is read (the runs watch through it as
            they would through the client itself)."""

            async def watch_stop(self, task_id: int, *, poll_s: float = 25.0, on_stop: Any = None) -> Any:
                def heard(info: Any) -> None:
                    answered_at[task_id] = time.time()
                    if on_stop is not None:
                        on_stop(info)

                return await super().watch_stop(task_id, poll_s=poll_s, on_stop=heard)

        async with Timed(self.servers.web_url, self.token, timeout=60) as sd:
            self.get_task["none"] = await self._get_task(sd)
            bare = [asyncio.create_task(sd.watch_stop(t, poll_s=50)) for t in self.tasks]
            await self._until_watching(sd, len(bare))
            self.get_task["watches"] = await self._get_task(sd)
            for watch in bare:
                watch.cancel()
            await asyncio.gather(*bare, return_exceptions=True)
            await asyncio.sleep(1.0)  # their connections closed before the runs' are counted
            runs = [asyncio.create_task(self._run(sd, t)) for t in self.tasks]
            await self._until_watching(sd, len(runs))
            self.measuring = True
            steady = asyncio.create_task(asyncio.sleep(STEADY_S))
            self.get_task["runs"] = await self._get_task(sd, spread_s=STEADY_S * 0.8)
            await steady
            self.measuring = False
            paced, at_once = self.tasks[:STOPS], self.tasks[STOPS:]
            # The stopping processes start (Python, Django, a connection) before the runs are
            # measured, as a dashboard's processes are running before anyone presses Stop.
            pacer = await asyncio.to_thread(_Stoppers, [paced], PACE_S)
            rushers = await asyncio.to_thread(_Stoppers, [at_once[n::STOPPERS] for n in range(STOPPERS)], 0.0)
            await asyncio.to_thread(pacer.go)
            profile = _profiling()
            await asyncio.to_thread(rushers.go)
            await asyncio.wait(runs, timeout=120)
            _profiled(profile)

    async def _get_task(self, sd: Any, spread_s: float = 0.0) -> list[float]:
        took = []
        for _ in range(GET_TASK_SAMPLES):
            started = time.perf_counter()
            await sd.get_task(self.spare)
            took.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(spread_s / GET_TASK_SAMPLES)
        return took

    async def _until_watching(self, sd: Any, count: int) -> None:
        """Until the watch server holds the client's one poll of `count` tasks (or, from an older
        server, `count` long polls plus the client's other connections)."""
        deadline = time.monotonic() + 120
        while True:
            held = await asyncio.to_thread(_held, self.servers.watch_url)
            if (sd._watches.offered and sd._watches.polling >= count and held) or held >= count:
                break
            print(f"# {held} connections held, {sd._watches.polling} of {count} tasks in one poll", flush=True)
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {held} of {count} watches reached the watch server")
            await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)  # the poll's first reads done, its tasks watched there

    async def _run(self, sd: Any, task_id: int) -> None:
        from stopdesk.agent.frameworks.core import RunStopped, StopdeskRun

        await asyncio.sleep(random.uniform(0, THINK_S))

        async with StopdeskRun(sd, task_id, framework="bench", agent="scale") as run:
            with contextlib.suppress(RunStopped):
                await run.run(self._agent(run, task_id))

    async def _agent(self, run: Any, task_id: int) -> None:
        """The scripted model: think, call the tool, again, until Stop cancels it."""
        try:
            await asyncio.sleep(random.uniform(0, THINK_S))
            for step in itertools.count():
                await asyncio.sleep(THINK_S)
                called = time.perf_counter()
                await run.tool_call(
                    call_id=f"call-{step}", name="work", arguments={"step": step}, body=self._body(called)
                )
        except asyncio.CancelledError:
            self.cancelled_at[task_id] = time.time()  # beside the database's clock
            raise

    def _body(self, called: float) -> Callable[[], Any]:
        async def body() -> str:
            if self.measuring:
                self.boundary.append((time.perf_counter() - called) * 1000)
            await asyncio.sleep(TOOL_S)
            return "done"

        return body


def _profiling() -> Any:
    """cProfile of the bench process while the runs hear Stop at once, when BENCH_SCALE_PROFILE names a file."""
    if not os.environ.get("BENCH_SCALE_PROFILE"):
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _profiled(profile: Any) -> None:
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.environ["BENCH_SCALE_PROFILE"])


def _stop_requested_at(tasks: list[int]) -> dict[int, float]:
    """When each task's stop request was recorded (the database's clock, in its transaction)."""
    from django.db import connection

    from stopdesk.models import Task

    try:
        found = Task.objects.filter(pk__in=tasks).values_list("pk", "stop_requested_at")
        return {pk: at.timestamp() for pk, at in found if at is not None}
    finally:
        connection.close()


# Stop is pressed from processes of their own (as the dashboard's would be), so the bench
# process's event loop, where the runs live, shares its interpreter with nothing else. Each is
# ready (imports, Django, its connection) before it is handed its tasks on its standard input.
STOPPER = """
import sys, time, django
django.setup()
from django.db import connection
from stopdesk.services.stop import task_request_stop
connection.ensure_connection()
print("ready", flush=True)
pace, *tasks = sys.stdin.readline().split()
for task_id in tasks:
    task_request_stop(task_id=int(task_id), actor="user:bench", dispatch=lambda ids: None)
    time.sleep(float(pace))
"""


class _Stoppers:
    """One stopping process per share of tasks, started and ready; `go` hands each its share (its
    tasks stopped `pace_s` apart, all shares at once) and waits until all are stopped."""

    def __init__(self, shares: list[list[int]], pace_s: float) -> None:
        self.shares, self.pace_s = shares, pace_s
        self.processes = [
            subprocess.Popen([sys.executable, "-c", STOPPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in shares
        ]
        for process in self.processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                self.kill()
                raise RuntimeError("a stopping process did not start")

    def go(self) -> None:
        for process, share in zip(self.processes, self.shares, strict=True):
            assert process.stdin is not None
            process.stdin.write(" ".join(map(str, [self.pace_s, *share])) + "\n")
            process.stdin.flush()
        for process in self.processes:
            if process.wait(300) != 0:
                self.kill()
                raise RuntimeError("a stopping process failed")

    def kill(self) -> None:
        for process in self.processes:
            process.kill()
