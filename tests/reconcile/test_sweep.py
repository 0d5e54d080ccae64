"""The sweep: bounded batches, SKIP LOCKED claims, one failure never stops it, overdue flagged."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import Mechanism
from reconcile.services.reconcile import items_claim_due, sweep_once
from stopdesk.models import CancellationAttempt, Event
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.reconcile.conftest import configure_system

S = ItemState


def awaiting(task, n, mechanism="manual"):  # type: ignore[no-untyped-def]
    items = [make_item(task, state=S.RUNNING, mechanism=mechanism) for _ in range(n)]
    for item in items:
        item_transition(item_id=item.pk, to_state=S.AWAITING_RECONCILIATION, actor="test", next_check_at=timezone.now())
    return items


@pytest.mark.django_db
def test_sweep_takes_a_bounded_batch(settings):
    task = make_task()
    awaiting(task, 5)
    report = sweep_once(batch=3, concurrency=1)
    assert report.claimed == 3
    assert sweep_once(batch=3, concurrency=1).claimed == 2
    assert sweep_once(batch=3, concurrency=1).claimed == 0  # rescheduled, not due again yet


@pytest.mark.django_db
def test_manual_item_becomes_uncertain_at_the_deadline_and_is_flagged_when_overdue(settings):
    settings.STOPDESK_MECHANISMS = {"manual": {"deadline_s": 60, "investigate_by_hours": 1}}
    task = make_task()
    (item,) = awaiting(task, 1)
    now = timezone.now()
    sweep_once(now=now, concurrency=1)
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION
    sweep_once(now=now + timedelta(seconds=61), concurrency=1)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by == now + timedelta(seconds=61, hours=1)
    report = sweep_once(now=now + timedelta(hours=2), concurrency=1)
    item.refresh_from_db()
    assert report.flagged_overdue == 1 and item.needs_review
    assert Event.objects.filter(item=item, kind="investigation_overdue").count() == 1
    assert sweep_once(now=now + timedelta(hours=3), concurrency=1).flagged_overdue == 0


class Exploding(Mechanism):
    """An adapter with a bug outside the remote call: it cannot even be built."""

    name = "exploding"

    def __init__(self, settings=None, peers=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("bug")


@pytest.fixture
def exploding():  # type: ignore[no-untyped-def]
    registry.register(Exploding)
    yield
    registry.unregister("exploding")
    registry.reset()


@pytest.mark.django_db
def test_one_items_failure_never_stops_the_sweep(exploding, settings):
    task = make_task()
    items = awaiting(task, 3)
    items[1].mechanism = "exploding"
    items[1].save(update_fields=["mechanism"])
    # ...and one whose adapter raises inside the remote call: recorded as an unanswered attempt.
    items[2].mechanism, items[2].idempotency_key = "http", "k"
    configure_system(settings, "broken", lookup_url="http://127.0.0.1:9/{nonexistent_placeholder}")
    items[2].detail = {"http": {"system": "broken"}}
    items[2].save(update_fields=["mechanism", "idempotency_key", "detail"])
    with_cancel = make_item(task, state=S.RUNNING)
    item_transition(
        item_id=with_cancel.pk, to_state=S.AWAITING_RECONCILIATION, actor="test", next_check_at=timezone.now()
    )
    report = sweep_once(concurrency=1)
    assert report.claimed == 4 and report.errors == 1
    assert {r.item_id for r in report.results if r.action != "error"} == {items[0].pk, items[2].pk, with_cancel.pk}
    assert CancellationAttempt.objects.get(item=items[2]).observed_status == "KeyError"
    items[1].refresh_from_db()
    assert items[1].next_check_at > timezone.now()  # it comes back later


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweeps_never_process_the_same_item():
    task = make_task()
    items = awaiting(task, 60)
    start = threading.Barrier(4)
    claimed: list[list[int]] = []
    lock = threading.Lock()

    def sweeper() -> None:
        try:
            start.wait()
            for _ in range(5):
                report = sweep_once(batch=7, concurrency=2)
                with lock:
                    claimed.append([r.item_id for r in report.results])
        finally:
            connection.close()

    threads = [threading.Thread(target=sweeper) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = Counter(i for batch in claimed for i in batch)
    assert set(counts) == {i.pk for i in items}
    assert max(counts.values()) == 1
    per_item = Counter(CancellationAttempt.objects.values_list("item_id", flat=True))
    assert max(per_item.values()) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_of_a_batch_are_disjoint():
    task = make_task()
    awaiting(task, 40)
    start = threading.Barrier(5)
    got: list[list[int]] = []

    def claim() -> None:
        try:
            start.wait()
            got.append(items_claim_due(limit=10))
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = [i for batch in got for i in batch]
    assert len(flat) == len(set(flat)) == 40
