"""Delivery to a real webhook receiver (signature verified there), email by role and choice,
retries with backoff, the delivery log, and the admin's re-send."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from stopdesk.notify.delivery import deliveries_due, notifications_deliver
from stopdesk.notify.models import Delivery, DeliveryAttempt, EmailPreference, Notification, WebhookEndpoint
from stopdesk.notify.timed import notifications_scan
from stopdesk.notify.topics import Topic
from stopdesk.permissions import roles_ensure
from stopdesk.services.transitions import item_transition
from stopdesk.states import DeliveryState, ItemState
from stopdrill.sandbox.webhooks import FAIL_500
from tests.factories import ACTOR, make_item, make_task

pytestmark = pytest.mark.django_db
D = DeliveryState


def _uncertain_item():  # type: ignore[no-untyped-def]
    item = make_item(make_task("Export invoices"), state=ItemState.RUNNING, label="invoice export")
    item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)
    return Notification.objects.get(item_id=item.pk)


def test_a_webhook_is_signed_verified_by_the_receiver_and_logged(endpoint, receiver):
    note = _uncertain_item()
    assert notifications_deliver([note.pk]) == {D.DELIVERED: 1}
    (got,) = receiver.deliveries()
    assert got["webhook_id"] == note.message_id and got["verified"]
    assert got["payload"]["type"] == "stopdesk.item_uncertain"
    assert "invoice export" in got["payload"]["text"]  # what a Slack or Teams simple webhook shows
    assert got["payload"]["data"]["item_id"] == note.item_id
    delivery = Delivery.objects.get(notification=note)
    assert delivery.state == D.DELIVERED and delivery.attempts == 1 and delivery.last_status == 200
    assert [a.status for a in delivery.log.all()] == [200]


def test_a_wrong_secret_is_refused_by_the_receiver_and_retried_with_backoff_until_it_fails(endpoint, receiver):
    endpoint.secret = WebhookEndpoint().secret  # a fresh secret the receiver does not know
    endpoint.save()
    note = _uncertain_item()
    notifications_deliver([note.pk])
    delivery = Delivery.objects.get(notification=note)
    assert delivery.state == D.RETRYING and delivery.last_status == 401
    assert delivery.next_attempt_at > timezone.now()
    assert receiver.deliveries() == [] and len(receiver.rejected) == 1
    first_wait = delivery.next_attempt_at - delivery.log.get().at
    time.sleep(0.25)
    notifications_deliver(deliveries_due())
    delivery.refresh_from_db()
    second_wait = delivery.next_attempt_at - delivery.log.last().at
    assert delivery.attempts == 2 and second_wait > first_wait  # exponential backoff
    time.sleep(0.45)
    notifications_deliver(deliveries_due())
    delivery.refresh_from_db()
    assert delivery.state == D.FAILED and delivery.attempts == 3 and delivery.next_attempt_at is None
    assert [a.status for a in delivery.log.all()] == [401, 401, 401]


def test_a_failing_endpoint_gets_the_same_message_again_once_it_recovers(endpoint, receiver):
    receiver.set_fault(FAIL_500)
    note = _uncertain_item()
    notifications_deliver([note.pk])
    assert Delivery.objects.get().state == D.RETRYING
    receiver.clear_faults()
    assert deliveries_due() == []  # not before its backoff
    time.sleep(0.25)
    notifications_deliver(deliveries_due())
    delivery = Delivery.objects.get()
    assert delivery.state == D.DELIVERED and [a.status for a in delivery.log.all()] == [500, 200]
    assert [d["webhook_id"] for d in receiver.deliveries()] == [note.message_id]


def test_per_item_email_goes_only_to_people_who_asked_for_it_among_those_who_take_the_topic(cast, mailoutbox):
    from django.contrib.auth.models import Group

    roles_ensure()
    cast["reviewer"].groups.add(Group.objects.get(name="reviewers"))
    cast["approver"].groups.add(Group.objects.get(name="approvers"))
    notifications_deliver([_uncertain_item().pk])
    assert mailoutbox == []  # the reviewer takes the topic by role, as a digest
    # The approver asks for each item; the reviewer asks for each item of no topic.
    EmailPreference.objects.create(user=cast["approver"], topics=[Topic.ITEM_UNCERTAIN], per_item=True)
    EmailPreference.objects.create(user=cast["reviewer"], topics=[], per_item=True)
    notifications_deliver([_uncertain_item().pk])
    assert [m.to[0] for m in mailoutbox] == ["approver@example.test"]
    assert mailoutbox[0].subject.startswith("[stopdesk]") and "/tasks/" in mailoutbox[0].body


def test_delivering_twice_sends_once(endpoint, receiver):
    note = _uncertain_item()
    notifications_deliver([note.pk])
    notifications_deliver([note.pk])
    assert Delivery.objects.count() == 1 and len(receiver.deliveries()) == 1 and receiver.duplicates == 0


def test_an_admin_re_sends_a_delivery_with_the_same_webhook_id(endpoint, receiver, admin_client):
    note = _uncertain_item()
    notifications_deliver([note.pk])
    delivery = Delivery.objects.get()
    page = admin_client.get(reverse("admin:notify_delivery_change", args=[delivery.pk]))
    assert page.status_code == 200 and b"200" in page.content
    response = admin_client.post(
        reverse("admin:notify_delivery_changelist"), {"action": "resend", "_selected_action": [delivery.pk]}
    )
    assert response.status_code == 302
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.log.last().manual
    assert receiver.duplicates == 1 and len(receiver.deliveries()) == 1


def test_deadlines_near_and_passed_and_an_unsettled_stop_notify_once_each(settings):
    from stopdesk.services.stop import task_request_stop

    now = timezone.now()
    task = make_task()
    near = make_item(task, state=ItemState.RUNNING)
    item_transition(item_id=near.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR, investigate_by=now + timedelta(hours=1))
    passed = make_item(task, state=ItemState.RUNNING)
    item_transition(
        item_id=passed.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR, investigate_by=now - timedelta(minutes=5)
    )
    later = make_item(task, state=ItemState.RUNNING)
    item_transition(
        item_id=later.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR, investigate_by=now + timedelta(hours=5)
    )
    make_item(task, state=ItemState.RUNNING)  # keeps the stop unsettled
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "STOP_UNSETTLED_MINUTES": 0}

    written = notifications_scan(now=now + timedelta(seconds=1))
    assert written == {Topic.INVESTIGATE_PASSED: 1, Topic.INVESTIGATE_NEAR: 1, Topic.STOP_UNSETTLED: 1}
    assert Notification.objects.get(topic=Topic.INVESTIGATE_NEAR).item_id == near.pk
    assert Notification.objects.get(topic=Topic.INVESTIGATE_PASSED).item_id == passed.pk
    assert notifications_scan(now=now + timedelta(seconds=2)) == dict.fromkeys(written, 0)
    # The near one's deadline passes later: one more notification, for it alone.
    later_scan = notifications_scan(now=now + timedelta(hours=1, minutes=1))
    assert later_scan[Topic.INVESTIGATE_PASSED] == 1 and later_scan[Topic.INVESTIGATE_NEAR] == 0


@contextlib.contextmanager
def _synchronous_commit_when_attempts_are_recorded() -> Iterator[list[str]]:
    """What PostgreSQL says of `synchronous_commit` inside the transaction that records each
    delivery attempt (asked on the same connection just before the attempt's row is written)."""
    seen: list[str] = []

    def observe(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("INSERT") and DeliveryAttempt._meta.db_table in sql:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('synchronous_commit')")
                seen.append(cursor.fetchone()[0])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(observe):
        yield seen


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("durable", [True, False], ids=["default", "opted-out"])
def test_a_delivery_result_waits_for_the_flush_unless_the_operator_opts_out(endpoint, receiver, settings, durable):
    if not durable:
        settings.STOPDESK = {**settings.STOPDESK, "DURABLE_RESULTS": False}  # STOPDESK_DURABLE_RESULTS=0
    note = _uncertain_item()
    with _synchronous_commit_when_attempts_are_recorded() as seen:
        assert notifications_deliver([note.pk]) == {D.DELIVERED: 1}
    assert seen == ["on" if durable else "off"]
