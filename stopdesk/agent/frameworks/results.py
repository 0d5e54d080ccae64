"""Results sent while a tool body runs, together.

Over HTTP (`stopdesk.client.AsyncClient`) each ledger call is a request the server answers with a
transaction of its own. A step of a run is a model request then a tool call, and the caller waits
on two of those requests in turn (the draft's registration goes out with the model request, the
tool call's registration before its body). A result (a tool call's, a draft's) is written off the
caller's path; sent at once, it would be one more request in that same window, competing with the
ones the caller waits for. In-process (`LocalRuntime`) a result is a transaction on one of the
run's threads, which shares the process's interpreter lock with the model request under way.
So `ResultOutbox` holds it until the next tool body starts (the caller then waits on the body,
not on the ledger) and sends every result waiting in one call (`write_results`: one request, one
transaction). No tool body within `ride_s`: they go then. Once Stop is known, or the run is
ending, nothing waits: a result goes at once; a run that ends normally sends the results still
waiting with its own end, in one call (`StopdeskRun._end_with_results`).

What the ledger says meanwhile: the item is running until its result is written, never settled
before. Every result is written before the run ends (the writer's await is one of the run's
writes, which `StopdeskRun.flush` waits for), with the same durability as a result sent alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

RIDE_S = 0.2


@dataclass
class Pending:
    item_id: int
    status: str
    detail: str
    written: asyncio.Future[None]


class ResultOutbox:
    def __init__(
        self,
        send_one: Callable[[int, str, str], Awaitable[None]],
        send_many: Callable[[list[Pending]], Awaitable[None]],
        later: Callable[[Awaitable[Any], str], Any],
        *,
        ride_s: float | None = None,
    ) -> None:
        self._send_one = send_one  # one result in a request of its own
        self._send_many = send_many  # several in one request (one transaction: all or none)
        self._later = later  # a write off the caller's path that the run's end waits for
        self.ride_s = RIDE_S if ride_s is None else ride_s
        self._pending: list[Pending] = []
        self.hurry = False  # Stop is known or the run is ending: no result waits

    def __len__(self) -> int:
        return len(self._pending)

    async def write(self, item_id: int, status: str, detail: str) -> None:
        """Returns once the result is written: with the others when a tool body starts, or after
        `ride_s`."""
        pending = Pending(item_id, status, detail, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        if self.hurry:
            self.send_all()
        try:
            await asyncio.wait_for(asyncio.shield(pending.written), self.ride_s)
            return
        except TimeoutError:
            pass
        self.send_all()  # still waiting (or already on its way: waited for below)
        await pending.written

    def take(self) -> list[Pending]:
        """Every result waiting, for the caller to send with a write of its own (`settle`)."""
        taken, self._pending = self._pending, []
        return taken

    def settle(self, taken: list[Pending], error: BaseException | None = None) -> None:
        """How the caller's write of `taken` ended: written, or not (`error`: each is then sent
        as `send_all` sends them, a result written twice changing nothing)."""
        if error is not None:
            self._pending[:0] = taken
            self.send_all()
            return
        for pending in taken:
            if not pending.written.done():
                pending.written.set_result(None)

    def send_all(self) -> None:
        """Send every result waiting, in one request."""
        taken, self._pending = self._pending, []
        if len(taken) == 1:
            self._later(self._alone(taken[0]), "result")
        elif taken:
            self._later(self._together(taken), "results")

    async def _together(self, taken: list[Pending]) -> None:
        try:
            await self._send_many(taken)
        except Exception:
            # Refused whole (one of them unknown) or its answer lost: each alone, so one cannot
            # hold the others back (a result written twice changes nothing).
            for pending in taken:
                self._later(self._alone(pending), "result")
            return
        except BaseException:
            for pending in taken:
                pending.written.cancel()
            raise
        for pending in taken:
            if not pending.written.done():
                pending.written.set_result(None)

    async def _alone(self, pending: Pending) -> None:
        try:
            await self._send_one(pending.item_id, pending.status, pending.detail)
        except BaseException as exc:
            # Raised to the result's writer, whose await is a write of the run (logged there, once).
            if pending.written.done():
                pass
            elif isinstance(exc, asyncio.CancelledError):
                pending.written.cancel()
            else:
                pending.written.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not pending.written.done():
                pending.written.set_result(None)
