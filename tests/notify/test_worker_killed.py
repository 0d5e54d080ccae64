"""A worker killed mid-delivery neither loses the notification nor delivers it twice: the claim
runs out, another worker sends again with the same webhook-id, and the receiver deduplicates."""

from __future__ import annotations

import pytest

from reconcile.sandbox.webhooks import HANG_AFTER_RECORD
from stopdesk.celery import app
from stopdesk.notify.models import Delivery, Notification
from stopdesk.services.transitions import item_transition
from stopdesk.states import DeliveryState, ItemState
from tests.factories import ACTOR, make_item, make_task
from tests.workers.conftest import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
WORKER_ENV = {"STOPDESK_NOTIFY_CLAIM_SECONDS": "2", "STOPDESK_NOTIFY_LOST_JOB_SECONDS": "1"}


def _becomes_uncertain() -> Notification:
    item = make_item(make_task(), state=ItemState.RUNNING)
    item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)  # commits: the job is queued
    return Notification.objects.get(item_id=item.pk)


def test_a_worker_killed_mid_send_is_replaced_and_the_receiver_gets_it_once(
    transactional_db, start_worker, endpoint, receiver
):
    receiver.set_fault(HANG_AFTER_RECORD)  # the receiver takes it, then its answer never comes
    first = start_worker("notify1@test", extra_env=WORKER_ENV)
    note = _becomes_uncertain()
    wait_for(lambda: receiver.received(note.message_id), timeout=30)
    assert Delivery.objects.get(notification=note).state == DeliveryState.SENDING
    first.kill()

    receiver.clear_faults()
    # Written while no worker runs: its job waits in the broker.
    second_note = _becomes_uncertain()
    start_worker("notify2@test", extra_env=WORKER_ENV)
    wait_for(lambda: Delivery.objects.filter(notification=second_note, state=DeliveryState.DELIVERED).exists())

    # The beat job finds the killed send once its claim has run out, and sends it again.
    def resent() -> bool:
        app.send_task("notify.sweep")
        return Delivery.objects.filter(notification=note, state=DeliveryState.DELIVERED).exists()

    wait_for(resent, timeout=30, interval=1.0)
    delivery = Delivery.objects.get(notification=note)
    assert delivery.attempts == 2 and [a.status for a in delivery.log.all()] == [200]
    got = receiver.received(note.message_id)
    assert got is not None and got.arrivals == 2  # the same webhook-id twice ...
    assert [d["webhook_id"] for d in receiver.deliveries()] == [note.message_id, second_note.message_id]
    assert receiver.duplicates == 1  # ... recorded once
