"""A worker killed mid-delivery neither loses the notification nor delivers it twice: the claim
runs out, another worker sends again with the same webhook-id, and the receiver deduplicates."""

from __future__ import annotations

import pytest

from stopdesk.celery import app
from stopdesk.notify.models import Delivery, Notification
from stopdesk.services.transitions import item_transition
from stopdesk.states import DeliveryState, ItemState
from stopdrill.sandbox.webhooks import HANG_AFTER_RECORD
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


def test_a_digest_lives_in_the_database_and_a_worker_killed_mid_send_neither_loses_nor_doubles_it(
    transactional_db, settings, start_worker, digest_endpoint, receiver
):
    from stopdesk.notify.models import Digest
    from stopdesk.notify.topics import Topic
    from stopdesk.services.stop import task_request_stop

    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "DIGEST_WINDOW_SECONDS": 0}
    env = {**WORKER_ENV, "STOPDESK_NOTIFY_DIGEST_WINDOW_SECONDS": "0"}
    task = make_task("Refund customers")
    items = [make_item(task, state=ItemState.RUNNING) for _ in range(20)]
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    for item in items:  # written while no worker runs: only the database knows
        item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)

    receiver.set_fault(HANG_AFTER_RECORD)
    first = start_worker("digest1@test", extra_env=env)
    app.send_task("notify.sweep")
    wait_for(lambda: len(receiver.deliveries()) == 1, timeout=30)
    first.kill()  # mid-send: the receiver has it, the worker never heard back

    receiver.clear_faults()
    start_worker("digest2@test", extra_env=env)

    def resent() -> bool:
        app.send_task("notify.sweep")
        return Delivery.objects.filter(notification__topic=Topic.TASK_DIGEST, state=DeliveryState.DELIVERED).exists()

    wait_for(resent, timeout=30, interval=1.0)
    (message,) = Notification.objects.filter(topic=Topic.TASK_DIGEST)
    (got,) = receiver.deliveries()  # the digest alone: no message per item reached this endpoint
    assert got["webhook_id"] == message.message_id and receiver.received(message.message_id).arrivals == 2
    assert got["payload"]["data"]["total"] == {Topic.ITEM_UNCERTAIN: 20} and got["payload"]["data"]["settled"]
    assert Digest.objects.get().closed_at is not None
