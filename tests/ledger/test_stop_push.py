"""The stop hub on the database at hand: pushed by LISTEN/NOTIFY on PostgreSQL, polled on SQLite
(`make test-sqlite`), and either way a watcher hears of the Stop once it commits, never before."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from stopdesk.push.hub import StopHub
from stopdesk.services.items import task_create
from stopdesk.services.stop import task_request_stop

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_watcher_hears_of_stop_when_it_commits_and_not_before():
    hub = StopHub(poll_s=0.05)
    try:
        task = task_create(title="Analyse invoices", actor="test")
        heard = threading.Event()
        hub.watch(task.pk, lambda *_: heard.set())
        if connection.vendor == "postgresql":
            assert hub.listening.wait(10)
        with transaction.atomic():
            task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
            assert not heard.wait(0.5), "heard of a Stop that had not committed"
        assert heard.wait(5)
        assert hub.watching() == 0
        assert hub.listening.is_set() == (connection.vendor == "postgresql")
    finally:
        hub.close()


def test_a_watcher_is_told_the_stop_time_the_task_recorded():
    # The time rides on the notification (PostgreSQL), or comes from the poll's read (SQLite).
    hub = StopHub(poll_s=0.05)
    try:
        task = task_create(title="Analyse invoices", actor="test")
        heard: list[tuple[int, object]] = []
        done = threading.Event()
        hub.watch(task.pk, lambda task_id, at: (heard.append((task_id, at)), done.set()))
        if connection.vendor == "postgresql":
            assert hub.listening.wait(10)
        outcome = task_request_stop(task_id=task.pk, actor="test", reason="wrong customer", dispatch=lambda ids: None)
        assert done.wait(5)
        task.refresh_from_db()
        assert heard == [(task.pk, task.stop_requested_at)]
        assert outcome.stop_request.requested_at == task.stop_requested_at
        event = task.events.get(kind="stop_requested")
        assert (event.at, event.actor, event.message) == (task.stop_requested_at, "test", "wrong customer")
    finally:
        hub.close()


def test_a_watch_of_a_task_already_stopped_is_answered_at_once():
    hub = StopHub(poll_s=5.0)
    try:
        task = task_create(title="Analyse invoices", actor="test")
        task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
        heard: list[object] = []
        hub.watch_checked(task.pk, lambda task_id, at: heard.append((task_id, at)))
        assert heard and heard[0][0] == task.pk and heard[0][1] is not None
    finally:
        hub.close()
