"""The health check of a reused PostgreSQL connection (stopdesk/backends/postgresql): nothing is
asked of an idle connection the server has not ended; one the server ended is found unusable, and
the next request's connection is a new one that works."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _other_connection() -> psycopg.Connection:
    params = dict(connection.get_connection_params())
    for django_only in ("context", "cursor_factory"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


def _last_statement(pid: int) -> str:
    with _other_connection() as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None, f"backend {pid} is gone"
    return str(row[0])


def test_an_idle_connection_the_server_kept_is_usable_without_a_statement():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last thing asked'")
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    assert connection.is_usable() is True
    # Django's own check would have sent SELECT 1 over this connection: the server saw nothing.
    assert _last_statement(pid) == "SELECT pg_backend_pid()"


def test_a_connection_the_server_ended_is_found_unusable_and_replaced():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with _other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while connection.is_usable():  # the server's goodbye reaches the socket within moments
        assert time.monotonic() < deadline, "a connection the server ended still looked usable after 5 s"
        time.sleep(0.01)
    # What Django does at a request's start with a connection that fails the check.
    connection.health_check_done = False
    connection.close_if_health_check_failed()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (new_pid,) = cursor.fetchone()
    assert new_pid != pid
