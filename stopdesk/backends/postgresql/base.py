"""Django's PostgreSQL backend, with a connection health check that costs no round trip when
there is nothing to check.

With persistent connections (`CONN_MAX_AGE`) and `CONN_HEALTH_CHECKS`, Django asks a reused
connection `SELECT 1` at the start of each request: a round trip before every page and every
runtime API call (an agent's registration before a tool call is five more). A server that
ends a connection (a restart, `pg_terminate_backend`, an idle timeout) says so on the socket: its
goodbye, an error message, or the socket closed, all of which make an idle connection's socket
readable. So an idle connection whose socket has nothing to read has not been ended by the
server, and is usable without asking; one that has something to read (that goodbye, or a notice)
is asked `SELECT 1` as before. A connection lost silently (no goodbye reaches the socket) is found
by the statement that uses it, as `SELECT 1` would have been."""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return super().is_usable()
        try:
            # poll, not select: a process holding many sockets (the watch server) has descriptors
            # past select's limit of 1,024.
            waiting = select.poll()
            waiting.register(conn.fileno(), select.POLLIN)
            readable = bool(waiting.poll(0))
        except (OSError, ValueError):
            return super().is_usable()
        return not readable or super().is_usable()
