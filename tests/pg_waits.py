"""What PostgreSQL sessions of the test database are waiting for: lets a race test wait until a
thread is really blocked on a lock before it makes the next move."""

from django.db import connection


def lock_waiters() -> int:
    """Sessions of this database waiting for a heavyweight lock (a row's transaction, a relation,
    an advisory lock)."""
    with connection.cursor() as cursor:
        # Inside a transaction PostgreSQL keeps serving the activity it read first; clear that
        # snapshot, or a caller polling while it holds a lock never sees the waiter arrive.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]
