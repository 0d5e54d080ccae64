"""Small database helpers shared by the services."""

from __future__ import annotations

import functools
import select
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import DateTimeField, Func
from django.db.utils import load_backend

if TYPE_CHECKING:
    import psycopg


class ClockNow(Func):
    """The wall clock at evaluation time. Django's Now() is the statement start on PostgreSQL, which
    can be earlier than a lock wait the statement went through; the boundary needs the moment the
    row was actually written."""

    template = "CLOCK_TIMESTAMP()"
    output_field = DateTimeField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:  # type: ignore[override]
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')", ()


@dataclass(frozen=True)
class TokenHeld:
    """A runtime's token as a caller read it earlier (the agent door remembers the tokens it has
    read): a statement given it checks, in itself, that the runtime still holds that token, not
    revoked, not rotated, not renamed (its name is the events' actor), and writes nothing if not.
    That is the read the caller skipped, made in the write's own statement, so no later than it."""

    token_hash: str
    name: str

    @staticmethod
    def params(held: TokenHeld | None) -> dict[str, Any]:
        """The statement's parameters for `HELD_BY_RUNTIME_SQL`: none held, no check."""
        return {"token": held.token_hash if held else None, "runtime_name": held.name if held else ""}


# The condition `TokenHeld` adds, on the runtime `%(runtime)s`.
HELD_BY_RUNTIME_SQL = """(%(token)s::text IS NULL OR EXISTS (
        SELECT 1 FROM stopdesk_runtime r
        WHERE r.id = %(runtime)s::bigint AND r.token_hash = %(token)s::text AND r.name = %(runtime_name)s::text
          AND r.revoked_at IS NULL))"""


def is_postgres() -> bool:
    # Read from the configured engine, not `connection`: on an event loop each task has its own
    # `connection`, and the agent door asks on every request (it built a connection object each time).
    return _vendor(connections.settings[DEFAULT_DB_ALIAS]["ENGINE"]) == "postgresql"


@functools.cache
def _vendor(engine: str) -> str:
    return str(load_backend(engine).DatabaseWrapper.vendor)


@contextmanager
def read_snapshot(*, sqlite_transaction: bool = True) -> Iterator[None]:
    """Everything read inside sees the database as of one moment: on PostgreSQL a transaction
    `REPEATABLE READ, READ ONLY`; on SQLite one transaction, whose reads are one snapshot already
    (`sqlite_transaction=False` opens none there, for a caller whose transaction would take the
    write lock). Inside a caller's transaction, the caller's isolation applies."""
    if connection.in_atomic_block or not (is_postgres() or sqlite_transaction):
        yield
        return
    with transaction.atomic():
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def server_side_cursor() -> Any:
    """A cursor that binds parameters on the server, so PostgreSQL prepares a statement after a
    few runs (the connection's prepare_threshold) instead of parsing and planning it every time:
    for the boundary's CTE, about twice the starts per second. Django's own cursors bind on the client and
    never prepare. Wrapped like Django's, so it is logged, counted and has its errors translated."""
    import psycopg

    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    # django-stubs type these as taking a CursorWrapper; Django passes them the driver's cursor.
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)  # type: ignore[arg-type]


async def fetchone_async(conn: psycopg.AsyncConnection[Any], statement: str, params: dict[str, Any] | list[Any]) -> Any:
    """One statement on an asyncio caller's own connection, and its first row (None if none)."""
    async with conn.cursor() as cursor:
        await cursor.execute(statement, params)
        return await cursor.fetchone()


def loop_connection_params() -> dict[str, Any]:
    """The default database's connection parameters, as Django connects (the test database under
    tests), for a psycopg connection of an asyncio caller's own (a pool on its loop), without what
    only Django's own cursors use."""
    params = dict(connections["default"].get_connection_params())
    for django_only in ("context", "cursor_factory"):
        params.pop(django_only, None)
    return params


def close_thread_connections(pool: ThreadPoolExecutor, threads: int) -> None:
    """Close the database connection of each of the pool's `threads` threads (tests, before
    dropping the database; a server's end)."""
    barrier = threading.Barrier(threads)

    def close() -> None:
        barrier.wait(timeout=5)  # one call per thread: each waits until all threads have one
        connection.close()

    for future in [pool.submit(close) for _ in range(threads)]:
        future.result(timeout=10)


def thread_connection_ready(*, wait_for_flush: bool = True) -> None:
    """Before a call on a long-lived thread that sees no requests (Django checks connections per
    request): a connection that failed or outlived CONN_MAX_AGE is checked and replaced if unusable,
    and one the server closed while it sat idle (its socket has something to read: the server's
    goodbye) is replaced, so the call does not fail on it; neither costs a round trip. Then
    `commits_wait_for_flush(wait_for_flush)`."""
    raw = connection.connection
    if raw is not None:
        if connection.errors_occurred or (connection.close_at is not None and time.monotonic() >= connection.close_at):
            connection.close_if_unusable_or_obsolete()
        elif _readable(raw):
            connection.close()
    commits_wait_for_flush(wait_for_flush)


def _readable(raw: Any) -> bool:
    try:
        ready, _, _ = select.select([raw.fileno()], [], [], 0)
    except (OSError, ValueError, AttributeError):
        return True  # no usable socket: replace the connection
    return bool(ready)


def results_durable() -> bool:
    """Whether a commit that records an outcome waits for the disk flush: yes unless the operator
    opted out (`STOPDESK_DURABLE_RESULTS=0`, settings.STOPDESK["DURABLE_RESULTS"])."""
    return bool(settings.STOPDESK.get("DURABLE_RESULTS", True))


def commits_wait_for_flush(wait: bool) -> None:
    """Whether this connection's commits wait until PostgreSQL has flushed them to disk (its
    default) or return once they are in its write-ahead log (`synchronous_commit` off). A commit
    that does not wait is still all or nothing; a crash of the database server (not of the caller)
    may lose the last such commits, and any commit that waits flushes every one made before it.
    `wait=False` (a caller whose commits record outcomes it may lose) is honoured only when the
    operator opted out of durable results (`results_durable`); otherwise they wait too.
    Kept on the connection until changed, and set only when it changes."""
    if not is_postgres():
        return
    wait = wait or results_durable()
    connection.ensure_connection()
    raw = connection.connection
    known = getattr(connection, "stopdesk_commit_waits", None)
    current = known[1] if known is not None and known[0] is raw else None
    if current == wait or (current is None and wait):
        return  # unchanged; a new connection waits unless the server is configured otherwise: leave that
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('synchronous_commit', %s, false)", ["on" if wait else "off"])
    connection.stopdesk_commit_waits = (raw, wait)  # type: ignore[attr-defined]
