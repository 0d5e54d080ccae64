"""The watch server (`python -m stopdesk watch`) SIGKILLed under 200 watching agents: while it is
down, half their tasks are stopped and the pushes go nowhere; the agents' watches retry (with
backoff, at most 5 s apart) and re-attach to the restarted server, which reads each task's stop
from the database first. No agent misses its Stop, and the other half still hear theirs by push."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from stopdesk.client import AsyncClient
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from stopdrill.launcher import free_port
from tests.run.helpers import PYTHON, ROOT, clean_env

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WATCHERS = 200
BOUND_S = 30.0


class WatchServer:
    def __init__(self, env: dict[str, str], port: int) -> None:
        self.env, self.port = env, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it and wait until it answers; returns when it did (monotonic)."""
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "stopdesk", "watch", "--log-level", "warning"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/api/v1/tasks/0/stop/watch", timeout=2)
                return time.monotonic()
            except httpx.TransportError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "the watch server did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)


def stop_tasks(task_ids: list[int]) -> None:
    try:
        for task_id in task_ids:
            task_request_stop(task_id=task_id, actor="user:operator", dispatch=lambda ids: None)
    finally:
        connection.close()


def test_the_watch_server_killed_under_200_watchers_loses_no_stop(pg_dsn, tmp_path: Path):
    runtime, token = runtime_create(name="watching", actor="test")
    tasks = [task_create(title=f"t{n}", actor="test", runtime=runtime).pk for n in range(WATCHERS)]
    stopped_while_down, stopped_after = tasks[: WATCHERS // 2], tasks[WATCHERS // 2 :]
    port = free_port()
    env = clean_env(tmp_path, DATABASE_URL=pg_dsn, WATCH_PORT=str(port), STOPDESK_BIND_HOST="127.0.0.1")
    server = WatchServer(env, port)
    server.start()
    url = f"http://127.0.0.1:{port}"

    async def main() -> dict[str, float]:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=WATCHERS + 10))
        async with AsyncClient(url, token, http=http, watch_url=url) as client:
            watches = {t: asyncio.create_task(client.watch_stop(t, poll_s=20)) for t in tasks}
            await asyncio.sleep(3.0)  # every watch is attached and waiting
            assert not any(w.done() for w in watches.values())

            server.kill()
            await asyncio.to_thread(stop_tasks, stopped_while_down)  # their pushes reach nobody
            back = await asyncio.to_thread(server.start)
            await asyncio.wait_for(asyncio.gather(*(watches[t] for t in stopped_while_down)), BOUND_S)
            reattached = time.monotonic() - back
            assert not any(watches[t].done() for t in stopped_after), "only stopped tasks were answered"

            pressed = time.monotonic()
            await asyncio.to_thread(stop_tasks, stopped_after)
            await asyncio.wait_for(asyncio.gather(*(watches[t] for t in stopped_after)), BOUND_S)
            pushed = time.monotonic() - pressed
            answers = [w.result() for w in watches.values()]
        await http.aclose()
        assert all(a.stopped for a in answers) and sorted(a.task for a in answers) == sorted(tasks)
        return {"reattached": reattached, "pushed": pushed}

    try:
        took = asyncio.run(main())
    finally:
        server.stop()
    print(
        f"fault.watch_server_sigkill watchers={WATCHERS} stopped_while_down={len(stopped_while_down)} "
        f"time_to_known_after_restart_s={took['reattached']:.1f} "
        f"stops_after_restart={len(stopped_after)} all_heard_within_s={took['pushed']:.1f} missed=0"
    )
