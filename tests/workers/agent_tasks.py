"""Agent code written as Celery tasks, for the worker tests. Each body leaves a mark on disk, so
the test can tell from outside whether the body ran."""

import time
from pathlib import Path

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
