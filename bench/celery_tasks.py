"""Tasks for the revoke-versus-boundary benchmark: each body leaves a file, so leaks are counted
from outside the worker."""

from pathlib import Path

from stopdesk.agent.workers import LedgerTask
from stopdesk.celery import app


@app.task(name="bench.plain_mark")
def plain_mark(folder: str, n: int) -> None:
    Path(folder, f"plain-{n}").touch()


@app.task(base=LedgerTask, bind=True, name="bench.ledger_mark")
def ledger_mark(self, folder: str, *, item_id: int) -> None:
    Path(folder, f"ledger-{item_id}").touch()
