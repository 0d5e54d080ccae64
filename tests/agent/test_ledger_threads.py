"""The gateway's ledger threads keep their database connection from one call to the next, start
afresh after a broken one, and close every connection when the pool closes."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.db import OperationalError, connection

from stopdesk.agent.aio import LedgerThreads, in_thread, ledger_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def backend_gone(pid: int, within_s: float = 5.0) -> bool:
    """A closed connection's backend leaves pg_stat_activity a moment after the client hangs up."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if not cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False


def kill_backend(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def failing_query() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def pids(pool: LedgerThreads, n: int) -> list[int]:
    with ledger_threads(pool):
        return [await in_thread(backend_pid) for _ in range(n)]


def test_a_ledger_thread_keeps_its_connection_and_the_pool_closes_it():
    pool = LedgerThreads(1)
    try:
        kept = asyncio.run(pids(pool, 3))
    finally:
        pool.close()
    assert len(set(kept)) == 1
    assert backend_gone(kept[0])


def test_outside_the_pool_each_call_has_a_connection_of_its_own():
    first, second = asyncio.run(pids_outside())
    assert first != second


async def pids_outside() -> list[int]:
    return [await in_thread(backend_pid) for _ in range(2)]


def test_after_its_connection_breaks_the_thread_connects_afresh():
    pool = LedgerThreads(1)
    try:
        (before,) = asyncio.run(pids(pool, 1))
        kill_backend(before)

        async def after_the_break() -> int:
            with ledger_threads(pool):
                with pytest.raises(OperationalError):
                    await in_thread(failing_query)
                return await in_thread(backend_pid)

        after = asyncio.run(after_the_break())
    finally:
        pool.close()
    assert after != before
