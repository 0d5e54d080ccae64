"""The stop matrix for Celery workers: a real worker on Redis, the ledger as the answer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection

from reconcile.services.cancel import item_cancel
from stopdesk.agent.workers import dispatch
from stopdesk.celery import app
from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.transitions import item_start, item_transition
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile import agent_tasks
from tests.reconcile.helpers import events, sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "celery": {"call_timeout_s": 0.5, "deadline_s": 5.0, "backoff_initial_s": 0.5, "recheck_interval_s": 0.5}
    }
    settings.STOPDESK = {**settings.STOPDESK, "HEARTBEAT_SECONDS": 1}


@pytest.fixture
def worker() -> Iterator[None]:
    app.conf.task_always_eager = False
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10):
        yield
    connection.close()


def stop_task(task) -> list[int]:  # type: ignore[no-untyped-def]
    from stopdesk.services.stop import task_request_stop

    dispatched: list[int] = []
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=dispatched.extend)
    return dispatched


def wait_for(item: WorkItem, states: set[str], timeout: float = 10.0) -> WorkItem:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item.refresh_from_db()
        if item.state in states:
            return item
        time.sleep(0.05)
    raise AssertionError(f"item stayed {item.state}")


def test_queued_message_is_cancelled_by_stop_and_refused_by_the_worker(fast):
    task = make_task()
    item = dispatch(agent_tasks.steps, task=task, noun="draft", actor="test", args=[3, 0.1])
    stop_task(task)
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        time.sleep(1.0)  # the message is delivered; the boundary refuses it
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.started_at is None
    connection.close()


def test_running_worker_stops_between_steps_and_the_ledger_confirms(fast, worker, clock):
    task = make_task()
    item = dispatch(agent_tasks.steps, task=task, noun="draft", actor="test", args=[50, 0.1])
    wait_for(item, {S.RUNNING})
    assert stop_task(task) == [item.pk]
    item_cancel(item_id=item.pk)
    attempt = CancellationAttempt.objects.get(item=item)
    assert attempt.action == "cancel" and attempt.detail["revoke_acknowledged_by"]  # the broadcast was heard
    wait_for(item, {S.CANCELLED})
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.outcome == "stopped between steps"


def test_task_that_ignores_the_stop_ends_completed(fast, worker, clock):
    task = make_task()
    item = dispatch(agent_tasks.stubborn, task=task, noun="draft", actor="test", args=[1.0])
    wait_for(item, {S.RUNNING})
    stop_task(task)
    item_cancel(item_id=item.pk)
    wait_for(item, {S.COMPLETED})
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.cancel_requested_at is not None


def test_worker_that_never_answers_is_uncertain_after_the_deadline(fast, clock):
    task = make_task()
    item = item_register(
        task=task, kind=Kind.LOCAL_WORKER, noun="draft", actor="test", mechanism="celery", handle="c-1"
    )
    item_start(item_id=item.pk, actor="test", worker="gone@host", lease_seconds=1)
    stop_task(task)
    item_cancel(item_id=item.pk)  # nobody acknowledges the revoke
    time.sleep(1.1)  # the lease runs out: no heartbeat
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    first = CancellationAttempt.objects.filter(item=item).first()
    assert first.detail["revoke_acknowledged_by"] == []


def test_duplicate_cancel_broadcasts_one_revoke(fast, worker, clock):
    task = make_task()
    item = dispatch(agent_tasks.steps, task=task, noun="draft", actor="test", args=[50, 0.1])
    wait_for(item, {S.RUNNING})
    stop_task(task)
    stop_task(task)
    item_cancel(item_id=item.pk)
    item_cancel(item_id=item.pk)
    wait_for(item, {S.CANCELLED})
    clock.advance(60)
    sweep_until_settled(clock, item)
    assert CancellationAttempt.objects.filter(item=item, action="cancel").count() == 1


def test_worker_result_after_a_recorded_cancel_is_a_late_result(fast, worker, clock):
    task = make_task()
    item = dispatch(agent_tasks.stubborn, task=task, noun="draft", actor="test", args=[2.0])
    wait_for(item, {S.RUNNING})
    stop_task(task)
    item_cancel(item_id=item.pk)
    clock.advance(10)  # past the deadline on our clock: uncertain
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="user:reviewer", outcome="resolved: cancelled")
    time.sleep(2.5)  # the stubborn task finishes and reports
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.needs_review
    assert [e.data["reported"] for e in events(item, "late_result")] == [S.COMPLETED]
