"""`python -m stopdesk watch`: the stop watch under uvicorn. Many watchers at once cost the server
neither a thread nor a database connection each, and the one whose task stops is answered at once."""

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

from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from stopdrill.launcher import free_port
from tests.run.helpers import PYTHON, ROOT, clean_env

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
WATCHERS = 200


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _connections(dbname: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [dbname])
        return int(cursor.fetchone()[0])


def test_many_watchers_cost_the_server_no_thread_or_connection_each(pg_dsn, tmp_path: Path):
    runtime, token = runtime_create(name="watching", actor="test")
    tasks = [task_create(title=f"t{n}", actor="test", runtime=runtime).pk for n in range(WATCHERS)]
    # Counted as the server's: connections to the test database beyond those already open (an
    # earlier test's thread may still hold one), counted the same way as during the watches.
    before = asyncio.run(asyncio.to_thread(_connections_closing, connection.settings_dict["NAME"]))
    port = free_port()
    env = clean_env(tmp_path, DATABASE_URL=pg_dsn, WATCH_PORT=str(port), STOPDESK_BIND_HOST="127.0.0.1")
    server = subprocess.Popen(
        [PYTHON, "-m", "stopdesk", "watch", "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    dbname = connection.settings_dict["NAME"]
    try:
        base = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/tasks/{tasks[0]}/stop/watch", params={"timeout": 0}, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "the watch server did not start"
                time.sleep(0.2)
        # `python -m stopdesk watch` execs uvicorn: the server is this process.
        idle_threads = _threads(server.pid)

        async def main() -> tuple[int, int, float, list[bool]]:
            limits = httpx.Limits(max_connections=WATCHERS + 10)
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=30) as http:
                watches = [
                    asyncio.create_task(http.get(f"/tasks/{t}/stop/watch", params={"timeout": 20})) for t in tasks
                ]
                await asyncio.sleep(3.0)  # every watch read its task and waits
                threads = _threads(server.pid)
                connections = await asyncio.to_thread(_connections_closing, dbname)
                asked = time.monotonic()
                await asyncio.to_thread(_stop_closing, tasks[0])
                first = await asyncio.wait_for(watches[0], 10)
                answered = time.monotonic() - asked
                pending = [not w.done() for w in watches[1:]]
                for w in watches[1:]:
                    w.cancel()
                await asyncio.gather(*watches[1:], return_exceptions=True)
                assert first.json()["stopped"] is True
                return threads, connections, answered, pending

        threads, connections, answered, pending = asyncio.run(main())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    # A few threads (the listener, 4 for first reads) and connections, not one per watcher.
    assert threads <= idle_threads + 6, (idle_threads, threads)
    assert connections - before <= 10, (before, connections)
    assert answered < 2.0 and all(pending)


def _connections_closing(dbname: str) -> int:
    try:
        return _connections(dbname)
    finally:
        connection.close()


def _stop_closing(task_id: int) -> None:
    try:
        task_request_stop(task_id=task_id, actor="test", dispatch=lambda ids: None)
    finally:
        connection.close()
