"""A task's per-item alerts reach each subscriber as a digest: one message with counts and a link
after a window, then one when the task settles. One message per item only for who asks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db.models import Q
from django.utils import timezone

from stopdesk.notify.delivery import delivery_resend, notifications_deliver
from stopdesk.notify.digest import digests_send
from stopdesk.notify.models import Delivery, Digest, EmailPreference, Notification
from stopdesk.notify.topics import Topic
from stopdesk.permissions import roles_ensure
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_transition, items_move
from stopdesk.states import ItemState, Kind
from tests.factories import ACTOR, make_item, make_task

pytestmark = pytest.mark.django_db
S = ItemState
AFTER_WINDOW = timedelta(minutes=2)


def _refunds(n: int, *, running: int = 0):  # type: ignore[no-untyped-def]
    task = make_task("Refund customers")
    items = [
        make_item(task, state=S.RUNNING, kind=Kind.EXTERNAL_OPERATION, noun="refund", mechanism="http")
        for _ in range(n + running)
    ]
    return task, items


def _become_uncertain(items) -> None:  # type: ignore[no-untyped-def]
    for item in items:  # one by one, as reconciliation finds them
        item_transition(item_id=item.pk, to_state=S.UNCERTAIN, actor=ACTOR)


def _deliver_everything() -> None:
    notifications_deliver(
        list(Notification.objects.filter(expanded_at__isnull=True).order_by("id").values_list("id", flat=True))
    )


def _reviewer(cast):  # type: ignore[no-untyped-def]
    roles_ensure()
    cast["reviewer"].groups.add(Group.objects.get(name="reviewers"))
    return cast["reviewer"]


def _per_subscriber() -> dict[str, int]:
    counts: dict[str, int] = {}
    for target in Delivery.objects.values_list("target", flat=True):
        counts[target] = counts.get(target, 0) + 1
    return counts


def test_one_stop_with_150_uncertain_items_reaches_each_subscriber_in_at_most_three_messages(
    cast, digest_endpoint, receiver, mailoutbox
):
    reviewer = _reviewer(cast)
    task, items = _refunds(150, running=3)
    started = timezone.now()
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    _become_uncertain(items[:150])
    _deliver_everything()
    digests_send(now=started + AFTER_WINDOW)
    _deliver_everything()
    for item in items[150:]:
        item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    digests_send(now=started + AFTER_WINDOW * 2)
    _deliver_everything()

    assert Notification.objects.filter(topic=Topic.ITEM_UNCERTAIN).count() == 150  # every fact is kept
    assert _per_subscriber() == {f"endpoint:{digest_endpoint.pk}": 2, f"user:{reviewer.pk}": 2}
    assert [m.to for m in mailoutbox] == [[reviewer.email], [reviewer.email]]
    assert len(receiver.deliveries()) == 2


def test_the_first_message_counts_and_links_and_the_follow_up_says_the_stop_settled(digest_endpoint, receiver):
    task, items = _refunds(150, running=3)
    started = timezone.now()
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    _become_uncertain(items[:150])
    assert digests_send(now=started + timedelta(seconds=5)) == 0  # still gathering
    assert digests_send(now=started + AFTER_WINDOW) == 1
    _deliver_everything()
    (first,) = receiver.deliveries()
    data = first["payload"]["data"]
    assert first["verified"] and first["payload"]["type"] == "stopdesk.task_digest"
    assert data["total"] == {Topic.ITEM_UNCERTAIN: 150} and data["new"] == data["total"]
    assert data["stopped"] and not data["settled"] and data["items"] == {S.UNCERTAIN: 150, S.RUNNING: 3}
    assert first["payload"]["text"].startswith(
        "Stop of task 'Refund customers': 150 items became uncertain; 3 still running or queued."
    )
    assert f"/tasks/{task.pk}/" in first["payload"]["text"] and data["url"].endswith(f"/tasks/{task.pk}/")

    # Nothing new and not settled: no update.
    assert digests_send(now=started + AFTER_WINDOW * 2) == 0
    item_transition(item_id=items[150].pk, to_state=S.UNCERTAIN, actor=ACTOR)
    for item in items[151:]:
        item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    assert digests_send(now=started + AFTER_WINDOW * 3) == 1
    _deliver_everything()
    follow_up = receiver.deliveries()[1]["payload"]
    assert follow_up["text"].startswith(
        "Stop of task 'Refund customers' has settled: 151 items became uncertain.\n"
        "Since the last message: 1 item became uncertain.\n"
        "Items now: 151 uncertain, 2 completed."
    )
    assert follow_up["data"]["settled"] and follow_up["data"]["sequence"] == 2
    assert Digest.objects.get().closed_at is not None


def test_a_subscriber_who_asks_for_per_item_alerts_gets_them_besides_the_digest(
    cast, endpoint, digest_endpoint, receiver, mailoutbox
):
    reviewer = _reviewer(cast)
    EmailPreference.objects.create(user=cast["approver"], topics=[Topic.ITEM_UNCERTAIN], per_item=True)
    _task, items = _refunds(5)
    _become_uncertain(items)
    digests_send(now=timezone.now() + AFTER_WINDOW)
    _deliver_everything()
    assert _per_subscriber() == {
        f"endpoint:{endpoint.pk}": 6,  # five items and the digest
        f"user:{cast['approver'].pk}": 6,
        f"endpoint:{digest_endpoint.pk}": 1,
        f"user:{reviewer.pk}": 1,
    }


def test_a_task_that_settles_within_the_window_gets_one_message(digest_endpoint, receiver):
    task, items = _refunds(4)
    _become_uncertain(items)
    assert digests_send(now=timezone.now() + AFTER_WINDOW) == 1
    _deliver_everything()
    (only,) = receiver.deliveries()
    assert only["payload"]["data"]["settled"] and only["payload"]["data"]["total"] == {Topic.ITEM_UNCERTAIN: 4}
    assert only["payload"]["text"].startswith("Task 'Refund customers' has nothing running or queued: 4 items")
    # A later fact of the same task opens a new digest rather than reopening the sent one.
    late = make_item(task, state=S.CANCELLED)
    item_finish(item_id=late.pk, succeeded=True, actor=ACTOR, outcome="it finished after all")
    assert digests_send(now=timezone.now() + AFTER_WINDOW) == 1
    assert Digest.objects.count() == 2 and not Digest.objects.filter(closed_at__isnull=True).exists()
    latest = Notification.objects.filter(topic=Topic.TASK_DIGEST).order_by("-id").first()
    assert latest is not None and latest.data["total"] == {Topic.LATE_RESULT: 1}


def test_while_a_task_keeps_running_updates_come_at_most_once_per_repeat_interval(settings, digest_endpoint):
    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "DIGEST_REPEAT_MINUTES": 30}
    _task, items = _refunds(6, running=1)
    now = timezone.now()
    _become_uncertain(items[:2])
    assert digests_send(now=now + AFTER_WINDOW) == 1
    _become_uncertain(items[2:4])
    assert digests_send(now=now + timedelta(minutes=10)) == 0  # new facts, but too soon
    assert digests_send(now=now + timedelta(minutes=33)) == 1
    assert digests_send(now=now + timedelta(minutes=70)) == 0  # nothing new since
    _become_uncertain(items[4:6])
    item_finish(item_id=items[6].pk, succeeded=True, actor=ACTOR)
    assert digests_send(now=now + timedelta(minutes=71)) == 1  # settled: the follow-up at once
    messages = list(Notification.objects.filter(topic=Topic.TASK_DIGEST).order_by("id"))
    assert [m.data["new"] for m in messages] == [{Topic.ITEM_UNCERTAIN: 2}] * 3
    assert [m.data["settled"] for m in messages] == [False, False, True]


def test_each_fact_is_counted_in_one_message_and_a_resent_message_repeats_its_counts(digest_endpoint, receiver):
    _task, items = _refunds(9, running=1)
    now = timezone.now()
    _become_uncertain(items[:3])
    assert digests_send(now=now + AFTER_WINDOW) == 1
    assert digests_send(now=now + AFTER_WINDOW) == 0  # a second sweep at the same moment adds nothing
    items_move(
        where=Q(pk__in=[i.pk for i in items[3:9]]),
        from_states=(S.RUNNING,),
        to_state=S.UNCERTAIN,
        actor=ACTOR,
        kind="reconciled",
        message="no answer",
    )
    item_finish(item_id=items[9].pk, succeeded=True, actor=ACTOR)
    assert digests_send(now=now + AFTER_WINDOW * 2) == 1
    _deliver_everything()
    messages = [d["payload"]["data"] for d in receiver.deliveries()]
    assert [m["new"][Topic.ITEM_UNCERTAIN] for m in messages] == [3, 6]
    assert messages[-1]["total"] == {Topic.ITEM_UNCERTAIN: 9}

    # The receiver lost the answer to the follow-up; it comes again under the same webhook-id.
    follow_up = Notification.objects.filter(topic=Topic.TASK_DIGEST).order_by("-id").first()
    assert follow_up is not None
    delivery_resend(Delivery.objects.get(notification=follow_up).pk)
    assert receiver.duplicates == 1 and [d["payload"]["data"] for d in receiver.deliveries()] == messages
