"""Whether a gateway session's task settled, asked once its calls pause.

A task settles when none of its items is still at work (`transitions.settled`). A framework run
has a run item open for its whole run; a gateway session has only its calls. Asked after each
call, an agent calling tools back to back settled its task after every call and reopened it at
the next one: two audit events a call ("Every item has settled." / "New work was registered."),
and the check's statement and its task-row lock sat in the way of the next call's registration,
which takes the same row.

So the check waits until the task's calls have been quiet for `QUIET_S`: each answer pushes it
back, and it runs once the last one is that old. It then sees every call that ended before it
(their answers committed before they pushed it), and a call still at work keeps the task open, as
before; that call's own answer asks again. The task's `settled_at` is written up to `QUIET_S`
after the last call ended. A process that ends first runs its checks as it stops; one that dies
leaves them to the settle sweep, as a check that failed would.
"""

from __future__ import annotations

import asyncio
import logging

from stopdesk.agent.aio import LedgerThreads, in_thread, ledger_threads
from stopdesk.services.transitions import task_settle_check

log = logging.getLogger(__name__)
QUIET_S = 0.5


class SettleChecks:
    """One gateway's pending settle checks, by task, on its event loop."""

    def __init__(self, ledger: LedgerThreads, quiet_s: float = QUIET_S) -> None:
        self.ledger = ledger
        self.quiet_s = quiet_s
        self._due: dict[int, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Future[None]] = set()  # kept until done, so none is collected half-way

    def after_answer(self, task_id: int) -> None:
        """A call of the task ended and its answer committed: check the task once its calls are quiet."""
        if (due := self._due.pop(task_id, None)) is not None:
            due.cancel()
        self._due[task_id] = asyncio.get_running_loop().call_later(self.quiet_s, self._start, task_id)

    async def flush(self) -> None:
        """Run every pending check now, and wait for those running (the gateway is stopping)."""
        for task_id, due in list(self._due.items()):
            due.cancel()
            self._start(task_id)
        await asyncio.gather(*self._running, return_exceptions=True)

    def _start(self, task_id: int) -> None:
        del self._due[task_id]  # a call ending from now on asks again: this check may not see it
        check = asyncio.ensure_future(self._check(task_id))
        self._running.add(check)
        check.add_done_callback(self._running.discard)

    async def _check(self, task_id: int) -> None:
        try:
            with ledger_threads(self.ledger):
                await in_thread(task_settle_check, task_id=task_id)
        except Exception:  # the sweep does it later
            log.exception("could not check whether task %s settled", task_id)
