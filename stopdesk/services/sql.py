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
