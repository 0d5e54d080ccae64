"""The queue page's age and passed deadlines, the admins' deliveries page, and each person's email choices."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from stopdesk.notify.delivery import notifications_deliver
from stopdesk.notify.digest import digests_send
from stopdesk.notify.models import Delivery, EmailPreference, Notification
from stopdesk.notify.topics import Topic
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import ACTOR, make_item, make_task

pytestmark = pytest.mark.django_db


def _uncertain(hours_left: float) -> None:
    item = make_item(make_task(), state=ItemState.RUNNING)
    item_transition(
        item_id=item.pk,
        to_state=ItemState.UNCERTAIN,
        actor=ACTOR,
        investigate_by=timezone.now() + timedelta(hours=hours_left),
    )


def test_the_queue_says_how_old_its_oldest_entry_is_and_how_many_deadlines_passed(as_user):
    _uncertain(-2)
    _uncertain(-1)
    _uncertain(5)
    from stopdesk.models import WorkItem

    WorkItem.objects.filter(state=ItemState.UNCERTAIN).update(updated_at=timezone.now() - timedelta(hours=3))
    page = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert "Oldest entry waiting <strong>3\xa0hours" in page
    assert "<strong>2</strong> investigate-by deadlines passed" in page


def test_the_queue_counts_stop_at_a_cap_and_say_so_and_metrics_count_exactly():
    from stopdesk.notify.selectors import review_queue_facts

    for _ in range(3):
        _uncertain(-1)
    capped = review_queue_facts(cap=2)
    assert (str(capped.uncertain), str(capped.past_deadline), capped.waiting_compensations) == ("2+", "2+", 0)
    exact = review_queue_facts()
    assert (exact.uncertain, exact.past_deadline) == (3, 3)
    assert review_queue_facts(cap=3).past_deadline == 3 and not hasattr(
        review_queue_facts(cap=3).past_deadline, "capped"
    )


def test_the_deliveries_page_is_for_admins_and_lists_deliveries(as_user, roles):
    _uncertain(1)
    digests_send(now=timezone.now() + timedelta(minutes=5))  # the reviewers' digest of it
    notifications_deliver(list(Notification.objects.values_list("id", flat=True)))
    assert Delivery.objects.exists()
    assert as_user("reviewer").get(reverse("notify-deliveries")).status_code == 302  # not staff: sign in as one
    page = as_user("admin").get(reverse("notify-deliveries"))
    assert page.status_code == 200
    delivery = Delivery.objects.first()
    assert f'id="delivery-{delivery.pk}"' in page.content.decode() and "Delivered" in page.content.decode()


def test_a_person_chooses_their_email_topics_and_a_bad_topic_writes_nothing(as_user, roles):
    client = as_user("approver")
    page = client.get(reverse("notify-email")).content.decode()
    assert 'value="compensation_proposed" checked' in page  # the approvers' default
    assert 'value="item_uncertain" checked' not in page
    bad = client.post(reverse("notify-email"), {"topics": ["item_uncertain", "everything"]})
    assert bad.status_code == 400 and "Unknown topic(s): everything" in bad.content.decode()
    assert not EmailPreference.objects.exists()
    client.post(reverse("notify-email"), {"topics": [Topic.ITEM_UNCERTAIN]})
    assert EmailPreference.objects.get(user=roles["approver"]).topics == [Topic.ITEM_UNCERTAIN]
    assert 'value="compensation_proposed" checked' not in client.get(reverse("notify-email")).content.decode()


def test_a_person_asks_for_one_email_per_item_besides_the_digest(as_user, roles):
    client = as_user("reviewer")
    page = client.get(reverse("notify-email")).content.decode()
    assert 'name="per_item"' in page and 'name="per_item" aria-describedby="per-item-help" checked' not in page
    assert 'value="task_digest"' not in page  # a digest goes with the topics it gathers
    client.post(reverse("notify-email"), {"topics": [Topic.ITEM_UNCERTAIN], "per_item": "on"})
    choice = EmailPreference.objects.get(user=roles["reviewer"])
    assert choice.per_item and choice.topics == [Topic.ITEM_UNCERTAIN]
    assert (
        'name="per_item" aria-describedby="per-item-help" checked'
        in client.get(reverse("notify-email")).content.decode()
    )
