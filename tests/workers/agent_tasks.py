"""Agent code written as Celery tasks, for the worker tests. Each body leaves a mark on disk, so
the test can tell from outside whether the body ran."""

import time
from pathlib import Path

from stopdesk.agent.runtime import LocalRuntime
from stopdesk.agent.workers import LedgerTask
from stopdesk.celery import app


@app.task(base=LedgerTask, bind=True, name="tests.mark")
def mark(self, folder: str, *, item_id: int) -> None:
    Path(folder, f"ran-{item_id}").touch()


@app.task(base=LedgerTask, bind=True, name="tests.slow")
def slow(self, folder: str, seconds: float, *, item_id: int) -> None:
    Path(folder, f"started-{item_id}").touch()
    time.sleep(seconds)
    Path(folder, f"finished-{item_id}").touch()


@app.task(base=LedgerTask, bind=True, name="tests.steps")
def steps(self, folder: str, count: int, *, item_id: int) -> None:
    for step in range(count):
        self.raise_if_stopped()
        Path(folder, f"step-{item_id}-{step}").touch()
        time.sleep(0.2)


@app.task(base=LedgerTask, bind=True, name="tests.runtime_steps")
def runtime_steps(self, folder: str, count: int, *, item_id: int) -> None:
    sd = LocalRuntime(actor="agent")
    for step in range(count):
        sd.heartbeat(item_id)  # raises StopRequested after a Stop
        Path(folder, f"rstep-{item_id}-{step}").touch()
        time.sleep(0.2)


@app.task(base=LedgerTask, bind=True, name="tests.steps_with_cleanup")
def steps_with_cleanup(self, folder: str, count: int, *, item_id: int) -> None:
    """Steps; on Stop, a cleanup that takes a while before it reports (as real agents have)."""
    for step in range(count):
        if self.stop_requested():
            Path(folder, f"cleanup-{item_id}").touch()
            time.sleep(3)
            self.raise_if_stopped()
        Path(folder, f"step-{item_id}-{step}").touch()
        time.sleep(0.2)
