"""A request PostgreSQL picks as a deadlock victim is run again, not answered 500: its transaction
was rolled back whole, so nothing of it happened, and a runtime's report must not be lost to a
lock race (an integration's Stop report that answered 500 left its item unsettled).

The deadlock is made for real: another session holds the task's row and then asks for the task's
gate while the request (closing the task) holds the gate and waits for the row. The request
waited first, so its deadlock check runs first and PostgreSQL rolls it back."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from stopdesk.client import Client
from stopdesk.models import Task
from stopdesk.services.items import task_create
from stopdesk.services.transitions.gate import GATE_CLASS, gate_key
from tests.pg_waits import lock_waiters

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_request_chosen_as_a_deadlock_victim_is_run_again_and_answers(live_server, runtime_token, pg_dsn):
    runtime, token = runtime_token
    task = task_create(title="closing under a lock race", actor="test", runtime=runtime)
    connection.close()
    holder_error: list[BaseException] = []
    row_held = threading.Event()
    release = threading.Event()

    def other_session() -> None:
        try:
            with psycopg.connect(pg_dsn) as other, other.transaction():
                other.execute("SELECT id FROM stopdesk_task WHERE id = %s FOR UPDATE", [task.pk])
                row_held.set()
                release.wait(30)  # the request now holds the gate and waits for this row
                other.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [GATE_CLASS, gate_key(task.pk)])
                time.sleep(0.3)  # the request's second run waits behind this session
        except BaseException as exc:
            holder_error.append(exc)

    holder = threading.Thread(target=other_session)
    holder.start()
    assert row_held.wait(10)
    answered: list[object] = []

    def close() -> None:
        with Client(live_server.url, token) as sd:
            try:
                answered.append(sd.close_task(task.pk))
            except Exception as exc:
                answered.append(exc)

    closer = threading.Thread(target=close)
    closer.start()
    deadline = time.monotonic() + 10
    while lock_waiters() < 1:  # the request holds the gate, waiting for the task's row
        assert time.monotonic() < deadline, "the request never waited for the row"
        time.sleep(0.01)
    connection.close()
    release.set()
    holder.join(30)
    closer.join(30)
    assert holder_error == []  # the other session was not the victim: the request was
    [info] = answered
    assert not isinstance(info, Exception), info
    assert Task.objects.get(pk=task.pk).closed_at is not None
