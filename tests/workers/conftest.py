"""Real Celery worker processes on Redis, sharing the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, name: str, env: dict[str, str], log: Path, pool: str = "prefork") -> None:
        self.name = name
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "stopdesk",
                "worker",
                f"--pool={pool}",
                "-c",
                "2",
                "-n",
                name,
                "--without-mingle",
                "--without-gossip",
                "-I",
                "tests.workers.agent_tasks",
                "-l",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.log.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the main process and its pool children: no cleanup of any kind runs."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


@pytest.fixture
def broker() -> Iterator[str]:
    url = settings.CELERY_BROKER_URL
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


@pytest.fixture
def start_worker(pg_dsn: str, broker: str, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    workers: list[Worker] = []

    def start(
        name: str = "w1@test",
        lease_seconds: int = 3,
        ready: bool = True,
        extra_env: dict[str, str] | None = None,
        pool: str = "prefork",
    ) -> Worker:
        env = {
            **os.environ,
            "DATABASE_URL": pg_dsn,
            "CELERY_BROKER_URL": broker,
            "STOPDESK_HEARTBEAT_SECONDS": "1",
            "STOPDESK_LEASE_SECONDS": str(lease_seconds),
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        env.pop("STOPDESK_TESTING", None)
        worker = Worker(name, env, tmp_path / f"{name.replace('@', '_')}-{len(workers)}.log", pool)
        workers.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate, timeout: float = 20, interval: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")
