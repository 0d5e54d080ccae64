"""Results that ride on the run's next registration, over a runtime where every call is a request.

Over HTTP (`stopdesk.client.AsyncClient`) each ledger call is a request the server answers with a
transaction of its own, and a request's cost is mostly its own (the door, the token check, the
commit), little its statements. A result (a tool call's, a draft's) is written off the caller's
path; `ResultOutbox` holds it until the run's next registration that is itself off the path (a
model request's draft) goes out, and that one request carries it (`register_started`'s `results`),
so a step of the run costs two requests instead of four. No such registration within `ride_s`:
the result goes alone. Once Stop is known, or the run is ending, nothing waits: a result goes at
once.

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
        send_alone: Callable[[int, str, str], Awaitable[None]],
        later: Callable[[Awaitable[Any], str], Any],
        *,
        ride_s: float | None = None,
    ) -> None:
        self._send_alone = send_alone  # writes one result in a request of its own
        self._later = later  # a write off the caller's path that the run's end waits for
        self.ride_s = RIDE_S if ride_s is None else ride_s
        self._pending: list[Pending] = []
        self.hurry = False  # Stop is known or the run is ending: no result waits for a carrier

    def __len__(self) -> int:
        return len(self._pending)

    async def write(self, item_id: int, status: str, detail: str) -> None:
        """Returns once the result is written: carried by a registration, or alone after `ride_s`."""
        pending = Pending(item_id, status, detail, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        if self.hurry:
            self.send_all()
        try:
            await asyncio.wait_for(asyncio.shield(pending.written), self.ride_s)
            return
        except TimeoutError:
            pass
        self.send_all()  # nobody took it (a carrier that did is still out: waited for below)
        await pending.written

    def take(self) -> list[Pending]:
        """Every result waiting, for a registration to carry; it reports with `written` or
        `not_written`."""
        taken, self._pending = self._pending, []
        return taken

    def written(self, taken: list[Pending]) -> None:
        for pending in taken:
            if not pending.written.done():
                pending.written.set_result(None)

    def not_written(self, taken: list[Pending]) -> None:
        """The carrier was refused or its answer lost: each goes alone (writing a result again
        changes nothing, should the lost request have written it)."""
        for pending in taken:
            self._later(self._alone(pending), "result")

    def send_all(self) -> None:
        self.not_written(self.take())

    async def _alone(self, pending: Pending) -> None:
        try:
            await self._send_alone(pending.item_id, pending.status, pending.detail)
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
