"""The batched canceller's claim lease on real PostgreSQL: renewed while held, ended by a release
or by the holder's own plan for the item, never waiting for a row a writer holds, and run out
within one lease once nobody renews it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from reconcile.services.lease import ClaimLease
from reconcile.services.reconcile import items_claim, items_due
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from tests.factories import make_item, make_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def claimed(count: int, lease_s: float):  # type: ignore[no-untyped-def]
    task = make_task()
    ids = [make_item(task, state=ItemState.RUNNING).pk for _ in range(count)]
    now = timezone.now()
    assert items_claim(item_ids=ids, now=now, hold_s=lease_s) == ids
    return ids, now, now + timedelta(seconds=lease_s)


def until_of(item_id: int):  # type: ignore[no-untyped-def]
    return WorkItem.objects.get(pk=item_id).next_check_at


def test_a_renewal_pushes_every_held_item_one_lease_past_now():
    ids, now, until = claimed(3, lease_s=20)
    lease = ClaimLease(item_ids=ids, now=now, until=until)
    time.sleep(0.05)

    assert lease.renew() == 3
    assert all(until < until_of(i) <= timezone.now() + timedelta(seconds=20) for i in ids)


def test_released_items_and_items_the_holder_rescheduled_are_not_renewed():
    (released, rescheduled, held), now, until = claimed(3, lease_s=20)
    lease = ClaimLease(item_ids=[released, rescheduled, held], now=now, until=until)
    lease.release([released])
    # The holder's plan for this one (a next check in 2 s) lands before its release.
    planned = timezone.now() + timedelta(seconds=2)
    WorkItem.objects.filter(pk=rescheduled).update(next_check_at=planned)

    assert lease.renew() == 1
    assert (until_of(released), until_of(rescheduled)) == (until, planned)
    assert until_of(held) > until


def test_a_row_a_writer_holds_is_skipped_not_waited_for_and_renewed_next_time():
    (busy, free), now, until = claimed(2, lease_s=20)
    lease = ClaimLease(item_ids=[busy, free], now=now, until=until)
    locked, done = threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with transaction.atomic():
                WorkItem.objects.select_for_update().get(pk=busy)
                locked.set()
                done.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    assert locked.wait(10)
    started = time.monotonic()
    try:
        assert lease.renew() == 1
        assert time.monotonic() - started < 1.0
        assert until_of(busy) == until
    finally:
        done.set()
        thread.join(10)

    assert lease.renew() == 2
    assert until_of(busy) > until


def test_the_claim_outlives_its_lease_while_renewed_and_is_due_one_lease_after_it_stops():
    lease_s = 0.8
    (item,), now, until = claimed(1, lease_s=lease_s)

    with ClaimLease(item_ids=[item], now=now, until=until):
        time.sleep(3 * lease_s)
        assert items_due(item_ids=[item]) == [], "still held, long after its first lease ran out"
    stopped = timezone.now()

    assert until_of(item) <= stopped + timedelta(seconds=lease_s)
    time.sleep(lease_s)
    assert items_due(item_ids=[item]) == [item]
