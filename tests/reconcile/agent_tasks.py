"""Agent code written as Celery tasks, for the Celery mechanism tests."""

from __future__ import annotations

import time

from stopdesk.agent.workers import LedgerTask
from stopdesk.celery import app


@app.task(base=LedgerTask, bind=True, name="tests.reconcile.steps")
def steps(self, count: int, seconds: float, *, item_id: int) -> str:  # type: ignore[no-untyped-def]
    for _ in range(count):
        self.raise_if_stopped()
        time.sleep(seconds)
    return "done"


@app.task(base=LedgerTask, bind=True, name="tests.reconcile.stubborn")
def stubborn(self, seconds: float, *, item_id: int) -> str:  # type: ignore[no-untyped-def]
    time.sleep(seconds)  # never looks at the ledger: the cancel is ignored
    return "done"
