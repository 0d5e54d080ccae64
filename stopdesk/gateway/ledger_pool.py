"""The gateway's connections to the ledger on its event loop: a psycopg pool of autocommit
connections with the Django database's parameters, for the two statements on a forwarded call's
path (`fast_calls.py`): the registration with its retry gate and boundary before the call goes
upstream, and the answer's record (before the client hears it; for a read, just after). Each is one statement, and so its
own commit, waiting for the disk's flush as every commit does by default.

Everything else the gateway asks of the ledger goes through its ledger threads (`LedgerThreads`):
Django's ORM is not for the loop. A statement on the loop waits for no thread; through a thread,
a call waits twice more (handed to the thread, and its answer handed back): about 0.1 to 0.3 ms
each way here, on a call whose whole cost is a few milliseconds.

PostgreSQL only, and only while results are durable (the default): under the operator's opt-out
(`STOPDESK_DURABLE_RESULTS=0`) a result's commit does not wait for the flush, which these
connections do not know how to tell apart, so the threads take both statements there. Opened
with the gateway, closed after it; no statement while the gateway is idle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from stopdesk.services.sql import is_postgres, loop_connection_params, results_durable


class LedgerPool:
    """Up to `size` connections, opened on the gateway's start (`running`)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if is_postgres() and results_durable():
            self._pool = AsyncConnectionPool(
                kwargs={**loop_connection_params(), "autocommit": True},
                min_size=1,
                max_size=self.size,
                open=False,
                name="stopdesk-gateway-ledger",
            )
            await self._pool.open(wait=False)
        try:
            yield
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()

    @property
    def usable(self) -> bool:
        """Whether the forwarded calls' statements run here (else through the ledger threads)."""
        return self._pool is not None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise RuntimeError("the gateway's ledger pool is not open")
        async with self._pool.connection() as conn:
            yield conn
