"""An AsyncClient's `write_results` calls, on their way together.

A call made while none is on its way goes at once. Calls made while one is on its way wait for it
and then go together, in the next request (up to the server's limit of rows a request). So a lone
run's results cost what they did, and a thousand runs ending together (a Stop of hundreds of tasks
at once, each run reporting its end) cost a few requests instead of a thousand, each of which took
the client's loop and the server away from what was still running.

The server writes a request's rows in one transaction: one row refused refuses them all, and
nothing is written. Rows of different callers must not fail each other, so when a request of
several callers' rows is refused, each caller's rows go again on their own and each caller gets
its own answer (a result written twice changes nothing). A request that fails for any other reason
(the server's error after the client's retries, the connection) fails every caller in it, as it
would have failed each of them alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from stopdesk.protocol.errors import ServerError, StopdeskError
from stopdesk.protocol.types import MAX_RESULTS

Rows = list[dict[str, Any]]


class ResultsTogether:
    def __init__(self, send: Callable[[Rows], Awaitable[Any]]) -> None:
        self._send = send  # one request of these rows
        self._queue: list[tuple[Rows, asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def write(self, rows: Rows) -> None:
        """Returns once `rows` are written, with whichever other calls' rows went with them."""
        loop = asyncio.get_running_loop()
        sender = self._sender
        sending = sender is not None and not sender.done()
        elsewhere = sender is not None and sending and sender.get_loop() is not loop
        if not rows or len(rows) > MAX_RESULTS or elsewhere:
            # Refused by the server as they are (nothing to join them to), or a call from another
            # event loop than the one sending: on its own.
            await self._send(rows)
            return
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((rows, done))
        if not sending:
            self._sender = loop.create_task(self._send_queued(), name="stopdesk-results")
        await done

    async def _send_queued(self) -> None:
        batch: list[tuple[Rows, asyncio.Future[None]]] = []
        try:
            while self._queue:
                batch, rows = [], Rows()
                while self._queue and len(rows) + len(self._queue[0][0]) <= MAX_RESULTS:
                    entry = self._queue.pop(0)
                    batch.append(entry)
                    rows.extend(entry[0])
                await self._send_batch(batch, rows)
                batch = []
        except BaseException as exc:  # the loop is closing: nobody waits on forever
            for _, done in [*batch, *self._queue]:
                _answer(done, StopdeskError("The client closed before these results were sent."))
            self._queue.clear()
            if not isinstance(exc, Exception):
                raise

    async def _send_batch(self, batch: list[tuple[Rows, asyncio.Future[None]]], rows: Rows) -> None:
        try:
            await self._send(rows)
        except StopdeskError as exc:
            if len(batch) == 1 or isinstance(exc, ServerError):
                for _, done in batch:
                    _answer(done, exc)
                return
            # One caller's rows refused the request: each caller's rows on their own.
            for own, done in batch:
                try:
                    await self._send(own)
                except Exception as alone:
                    _answer(done, alone)
                else:
                    _answer(done, None)
            return
        except Exception as exc:
            for _, done in batch:
                _answer(done, exc)
            return
        for _, done in batch:
            _answer(done, None)


def _answer(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():  # its caller was cancelled meanwhile
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
