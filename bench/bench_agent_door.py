"""The registration before each tool call, at the web door (Django under gunicorn) and at the agent
door (the watch server's event loop, `stopdesk.api.agent_door`), in the production shape on
loopback (bench/deployed.py).

agent_door.register_ms.<door> p50/p99   one `AsyncClient.register_started`, as an agent waits for
    it before a tool's body: one at a time, BENCH_AGENT_DOOR_CALLS of them (500) after 50 to warm
    up, for each door in turn, twice (web, door, web, door), so a drift of the machine shows
agent_door.register_ms.ratio            door p50 / web p50
agent_door.server_cpu_ms.<door>         the serving processes' CPU per registration (gunicorn's
    two workers, or the watch server), from their /proc times before and after
agent_door.registers_per_s.<door>       16 clients registering at once, each one after another

    BENCH=agent_door python -m bench
"""

from __future__ import annotations

import asyncio
import os
import time

from bench.deployed import Deployed, deployed, percentile
from bench.harness import Figure

CALLS = int(os.environ.get("BENCH_AGENT_DOOR_CALLS", "500"))
WARM_UP = 50
AT_ONCE = 16
AT_ONCE_CALLS = 50  # per client
CALL = {"kind": "local_worker", "noun": "lookup call", "label": "lookup"}


def run() -> list[Figure]:
    from django.db import connections

    from stopdesk.services.items import task_create
    from stopdesk.services.runtimes import runtime_create

    runtime, token = runtime_create(name=f"bench-door-{os.getpid()}-{time.time_ns()}", actor="bench")
    tasks = [task_create(title=f"door run {n}", actor="bench", runtime=runtime).pk for n in range(AT_ONCE)]
    connections.close_all()
    figures: list[Figure] = []
    with deployed() as found:
        latency: dict[str, list[float]] = {"web": [], "door": []}
        cpu: dict[str, list[float]] = {"web": [], "door": []}
        for _ in range(2):
            for where in ("web", "door"):
                took, spent = asyncio.run(_one_at_a_time(found, token, tasks[0], where))
                latency[where] += took
                cpu[where].append(spent)
        for where in ("web", "door"):
            figures += [
                Figure(f"agent_door.register_ms.{where}.p50", percentile(latency[where], 0.5), "ms"),
                Figure(f"agent_door.register_ms.{where}.p99", percentile(latency[where], 0.99), "ms"),
                Figure(f"agent_door.server_cpu_ms.{where}", sum(cpu[where]) / len(cpu[where]), "ms"),
            ]
        ratio = percentile(latency["door"], 0.5) / percentile(latency["web"], 0.5)
        figures.append(Figure("agent_door.register_ms.ratio", ratio, "x"))
        for where in ("web", "door"):
            per_s = asyncio.run(_at_once(found, token, tasks, where))
            figures.append(Figure(f"agent_door.registers_per_s.{where}", per_s, "/s", higher_is_better=True))
    return figures


def _client(found: Deployed, token: str, where: str):  # type: ignore[no-untyped-def]
    from stopdesk.client import AsyncClient

    return AsyncClient(found.web_url, token, watch_url=found.watch_url if where == "door" else None)


async def _one_at_a_time(found: Deployed, token: str, task_id: int, where: str) -> tuple[list[float], float]:
    """Each registration's time (ms), and the serving processes' CPU per registration (ms)."""
    took: list[float] = []
    async with _client(found, token, where) as sd:
        for _ in range(WARM_UP):
            await sd.register_started(task_id, **CALL)
        port = int((found.watch_url if where == "door" else found.web_url).rsplit(":", 1)[1])
        before = _cpu_s(port)
        for _ in range(CALLS):
            started = time.perf_counter()
            await sd.register_started(task_id, **CALL)
            took.append((time.perf_counter() - started) * 1000)
        spent = _cpu_s(port) - before
    return took, spent * 1000 / CALLS


async def _at_once(found: Deployed, token: str, tasks: list[int], where: str) -> float:
    async def one(task_id: int) -> None:
        async with _client(found, token, where) as sd:
            for _ in range(AT_ONCE_CALLS):
                await sd.register_started(task_id, **CALL)

    started = time.perf_counter()
    await asyncio.gather(*(one(task_id) for task_id in tasks))
    return AT_ONCE * AT_ONCE_CALLS / (time.perf_counter() - started)


def _cpu_s(port: int) -> float:
    """User and system CPU seconds of the processes listening on `port` and their children."""
    return sum(_proc_cpu_s(pid) for pid in _serving(port))


def _serving(port: int) -> set[int]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(fields[9])
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").removesuffix("]") in inodes:
                    pids.add(int(pid))
                    break
        except OSError:
            continue
    return pids


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
