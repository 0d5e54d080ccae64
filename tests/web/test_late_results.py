"""Late results in the review queue: a report that contradicted a recorded outcome is kept as an
event, shown to reviewers, and acknowledged with a note; the recorded state never changes."""

from __future__ import annotations

import pytest
from django.urls import reverse

from stopdesk.models import Event, WorkItem
from stopdesk.services.items import item_finish
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.web.conftest import htmx

pytestmark = pytest.mark.django_db
S = ItemState


def late_item(label: str = "Vendor letter draft") -> WorkItem:
    item = make_item(make_task("Invoice batch 7"), state=S.RUNNING, label=label)
    item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test", outcome="cancelled; confirmed by read-back")
    item_finish(item_id=item.pk, succeeded=True, actor="system:reconcile", outcome="completed after cancel")
    item.refresh_from_db()
    return item


def test_the_queue_lists_late_results_with_what_was_recorded_and_reported(as_user):
    item = late_item()
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert f'id="late-{item.pk}"' in html
    section = html[html.index('id="late"') :]
    assert "Recorded <strong>cancelled</strong>; later reported <strong>completed</strong>" in section


def test_the_late_section_is_an_htmx_fragment(as_user):
    late_item()
    html = as_user("reviewer").get(reverse("review-queue"), **htmx("late")).content.decode()
    assert html.lstrip().startswith('<section id="late"') and "<html" not in html


def test_acknowledging_needs_a_note_and_writes_nothing_without_one(as_user):
    item = late_item()
    events = Event.objects.count()
    response = as_user("reviewer").post(reverse("item-acknowledge", args=[item.pk]), {"note": "  "})
    assert response.status_code == 400 and "Say what you found" in response.content.decode()
    assert WorkItem.objects.get(pk=item.pk).needs_review is True
    assert Event.objects.count() == events


def test_acknowledging_clears_the_flag_keeps_the_state_and_is_audited(as_user):
    item = late_item()
    client = as_user("reviewer")
    assert (
        "<html" not in client.get(reverse("item-acknowledge", args=[item.pk]), **htmx("action-panel")).content.decode()
    )
    response = client.post(reverse("item-acknowledge", args=[item.pk]), {"note": "Draft exists; discarded by hand."})
    assert response.status_code == 302
    item.refresh_from_db()
    assert (item.state, item.needs_review) == (S.CANCELLED, False)
    event = Event.objects.get(item=item, kind="late_result_acknowledged")
    assert event.actor == "user:reviewer" and event.data["late_result"]["reported"] == S.COMPLETED
    assert f'id="late-{item.pk}"' not in client.get(reverse("review-queue")).content.decode()
    # A second acknowledgement has nothing to act on.
    again = client.post(reverse("item-acknowledge", args=[item.pk]), {"note": "again"})
    assert again.status_code == 400


@pytest.mark.parametrize(("who", "status"), [("operator", 403), ("approver", 403)])
def test_only_reviewers_acknowledge(as_user, who, status):
    item = late_item()
    response = as_user(who).post(reverse("item-acknowledge", args=[item.pk]), {"note": "fine"})
    assert response.status_code == status
    assert WorkItem.objects.get(pk=item.pk).needs_review is True


def test_anonymous_is_sent_to_sign_in(client):
    item = late_item()
    response = client.get(reverse("item-acknowledge", args=[item.pk]))
    assert response.status_code == 302 and reverse("login") in response["Location"]
