"""Real processes for the fault tests: Celery workers (killed with SIGKILL), a Redis server of
the test's own (restarted mid-stop; never the machine's Redis on 6379), the drill sandbox, and
a live HTTP server for the runtime API."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stopdesk.celery import app
from stopdrill.drills.core import DrillContext, drill_settings
from stopdrill.drills.sandbox import DrillSandbox, start_drill_sandbox
from tests.broker_pools import forget_broker_connections
from tests.workers.conftest import ROOT
from tests.workers.conftest import Worker as _Worker


class Worker(_Worker):
    """The worker tests' process wrapper, running the drills' agent code instead of theirs."""

    def __init__(self, name: str, env: dict[str, str], log: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "stopdesk", "worker", "--pool=prefork", "-c", "2", "-n", name,
             "--without-mingle", "--without-gossip", "-I", "stopdrill.drills.agent", "-l", "info", *extra_args],
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


@pytest.fixture(scope="module")
def drill_sandbox() -> Iterator[DrillSandbox]:
    sandbox = start_drill_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def short_deadlines() -> Iterator[None]:
    with drill_settings():
        yield


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server of our own on a free port, so restarting it disturbs nobody."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    # This process's Celery app (dispatch, revoke) talks to the same broker as the worker.
    before = app.conf.broker_url
    app.conf.broker_url = server.url
    _forget_connections()
    yield server
    server.stop()
    app.conf.broker_url = before
    _forget_connections()


def _forget_connections() -> None:
    forget_broker_connections(app)


@pytest.fixture
def worker_on(pg_dsn: str, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    workers: list[Worker] = []

    def start(
        broker: str, name: str = "fault@test", extra_env: dict[str, str] | None = None, beat: bool = False
    ) -> Worker:
        env = {
            **os.environ,
            "DATABASE_URL": pg_dsn,
            "CELERY_BROKER_URL": broker,
            "STOPDESK_HEARTBEAT_SECONDS": "1",
            "STOPDESK_LEASE_SECONDS": "2",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        env.pop("STOPDESK_TESTING", None)
        # With beat embedded, the worker also runs the periodic jobs (the sweep every 5 s).
        extra = ("-B", "--schedule", str(tmp_path / f"beat-{len(workers)}")) if beat else ()
        worker = Worker(name, env, tmp_path / f"{name.replace('@', '_')}-{len(workers)}.log", extra)
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.stop()


def fault_context(sandbox: DrillSandbox, mechanism: str, name: str) -> DrillContext:
    sandbox.reset()
    ctx = DrillContext(sandbox, mechanism, name)
    ctx.new_task()
    return ctx
