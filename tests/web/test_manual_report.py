"""Work with no status lookup, after Stop: it shows when it turns uncertain, and a reviewer who knows
what happened reports it before then (done or not done, with evidence) instead of waiting for it
to land in the review queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from reconcile.services.reconcile import sweep_once
from stopdesk.models import Event, WorkItem
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.web.conftest import htmx
from tests.web.scenes import uncertain_item
from tests.web.test_item_page import manual_after_stop

pytestmark = pytest.mark.django_db
S = ItemState


def report(client, item: WorkItem, **data: str):  # type: ignore[no-untyped-def]
    return client.post(reverse("item-report", args=[item.pk]), data)


def test_a_manual_item_after_stop_shows_its_deadline_on_the_task_page(as_user):
    item = manual_after_stop()
    html = as_user("operator").get(reverse("task-detail", args=[item.task_id])).content.decode()
    head = html[html.index(f'id="item-{item.pk}"') :].replace("\xa0", " ")
    head = head[: head.index("</div>")]
    assert "report within 59 minutes" in head or "report within 1 hour" in head
    assert "Turns uncertain at " in head


def test_the_task_pages_live_refresh_keeps_the_deadline(as_user):
    item = manual_after_stop()
    response = as_user("operator").get(reverse("task-detail", args=[item.task_id]), **htmx("live"))
    assert response.status_code == 200 and "<html" not in response.content.decode()
    assert "report within" in response.content.decode()


def test_reporting_done_before_the_deadline_settles_it_and_the_deadline_passes_quietly(as_user):
    item = manual_after_stop()
    response = report(as_user("reviewer"), item, done="done", evidence="Royal Mail receipt 88412", note="Posted.")
    assert response.status_code == 302 and response["Location"] == reverse("item-detail", args=[item.pk])
    item.refresh_from_db()
    assert (item.state, item.outcome) == (S.COMPLETED, "reported done: Posted.")
    assert item.evidence["report"]["evidence"] == "Royal Mail receipt 88412"
    event = Event.objects.get(item=item, kind="reported")
    assert (event.actor, event.from_state, event.to_state) == ("user:reviewer", S.AWAITING_RECONCILIATION, S.COMPLETED)
    # At the deadline the sweep finds nothing to make uncertain.
    sweep_once(now=item.cancel_requested_at + timedelta(hours=2))
    item.refresh_from_db()
    assert item.state == S.COMPLETED and not item.needs_review


def test_reporting_not_done_after_stop_records_it_cancelled(as_user):
    item = manual_after_stop()
    response = report(as_user("reviewer"), item, done="not_done", evidence="The letters are still in the tray.")
    assert response.status_code == 302
    item.refresh_from_db()
    assert (item.state, item.outcome) == (S.CANCELLED, "reported not done")


def test_a_running_manual_item_whose_cancel_was_requested_can_be_reported_too(as_user):
    from stopdesk.services.stop import task_request_stop

    task = make_task("Call the suppliers")
    item = make_item(task, state=S.RUNNING, mechanism="manual", noun="call")
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    assert report(as_user("reviewer"), item, done="done", evidence="Call log 10:14").status_code == 302
    assert WorkItem.objects.get(pk=item.pk).state == S.COMPLETED


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"done": "done", "evidence": "  "}, "A report needs evidence"),
        ({"evidence": "receipt"}, "Say whether it was done."),
        ({"done": "maybe", "evidence": "receipt"}, "Say whether it was done."),
    ],
)
def test_a_report_without_an_answer_or_evidence_is_refused_and_writes_nothing(as_user, data, message):
    item = manual_after_stop()
    events = Event.objects.count()
    response = report(as_user("reviewer"), item, **data)
    assert response.status_code == 400
    html = response.content.decode()
    assert message in html and 'role="alert"' in html
    assert WorkItem.objects.get(pk=item.pk).state == S.AWAITING_RECONCILIATION
    assert Event.objects.count() == events


def test_work_that_can_be_looked_up_or_is_already_uncertain_is_not_reported_here(as_user):
    uncertain = uncertain_item()
    client = as_user("reviewer")
    response = report(client, uncertain, done="done", evidence="receipt")
    assert response.status_code == 400 and "this upload is uncertain" in response.content.decode()
    assert WorkItem.objects.get(pk=uncertain.pk).state == S.UNCERTAIN


def test_once_the_deadline_made_it_uncertain_the_report_is_refused_and_resolve_is_offered(as_user):
    item = manual_after_stop()
    sweep_once(now=item.cancel_requested_at + timedelta(hours=1, seconds=1))
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    client = as_user("reviewer")
    response = report(client, item, done="done", evidence="receipt")
    assert response.status_code == 400 and "this letter is uncertain" in response.content.decode()
    assert reverse("item-resolve", args=[item.pk]) in response.content.decode()


@pytest.mark.parametrize("who", ["operator", "approver"])
def test_only_reviewers_report(as_user, who):
    item = manual_after_stop()
    assert report(as_user(who), item, done="done", evidence="receipt").status_code == 403
    assert WorkItem.objects.get(pk=item.pk).state == S.AWAITING_RECONCILIATION
