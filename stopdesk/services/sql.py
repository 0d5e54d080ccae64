"""Small database helpers shared by the services."""

from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Func


class ClockNow(Func):
    """The wall clock at evaluation time. Django's Now() is the statement start on PostgreSQL, which
    can be earlier than a lock wait the statement went through; the boundary needs the moment the
    row was actually written."""

    template = "CLOCK_TIMESTAMP()"
    output_field = DateTimeField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple[Any, ...]]:  # type: ignore[override]
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')", ()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


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
