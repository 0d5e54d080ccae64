"""The review queue: sections, fragments, and a reviewer's actions on uncertain items."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from reconcile.models import Compensation, Escalation
from stopdesk.models import Event, WorkItem
from stopdesk.states import ItemState
from tests.factories import make_task
from tests.web.conftest import htmx, system_url
from tests.web.scenes import mail_effect, proposal, uncertain_item

pytestmark = pytest.mark.django_db
S = ItemState


def test_queue_lists_overdue_first_with_time_left(as_user):
    later = uncertain_item(label="Later one")
    overdue = uncertain_item(label="Overdue one")
    WorkItem.objects.filter(pk=overdue.pk).update(investigate_by=timezone.now() - timedelta(hours=3))
    WorkItem.objects.filter(pk=later.pk).update(investigate_by=timezone.now() + timedelta(hours=5))
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert html.index("Overdue one") < html.index("Later one")
    assert "overdue by 3\xa0hours" in html and "4\xa0hours left" in html


def test_queue_shows_effects_proposals_and_escalations(as_user, roles):
    record = mail_effect()
    other = mail_effect(make_task("Second reminder run"))
    c = proposal(other, roles["reviewer"], action="report_only")
    html = as_user("approver").get(reverse("review-queue")).content.decode()
    assert f'id="record-{record.pk}"' in html
    assert f'id="compensation-{c.pk}"' in html
    assert f'id="record-{other.pk}"' not in html  # it has a proposal now


def test_queue_section_fragment(as_user):
    uncertain_item()
    response = as_user("reviewer").get(reverse("review-queue"), **htmx("uncertain"))
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="uncertain"') and "<html" not in html


def test_a_big_group_shows_its_first_rows_and_counts_every_item(as_user):
    task = make_task("Lots of uncertainty")
    for n in range(30):
        uncertain_item(task, label=f"Upload {n}")
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert html.count('class="row qitem" id="uncertain-') == 10
    assert "Select all 30 in this group" in html and "Show this group only (20 more)" in html


def test_resolve_form_full_page_and_panel_fragment(as_user):
    item = uncertain_item()
    client = as_user("reviewer")
    assert "<html" in client.get(reverse("item-resolve", args=[item.pk])).content.decode()
    fragment = client.get(reverse("item-resolve", args=[item.pk]), **htmx("action-panel")).content.decode()
    assert "<html" not in fragment and 'name="evidence"' in fragment


def test_resolve_needs_evidence(as_user):
    item = uncertain_item()
    response = as_user("reviewer").post(
        reverse("item-resolve", args=[item.pk]), {"outcome": "completed", "note": "it ran"}
    )
    assert response.status_code == 400 and "needs a note and evidence" in response.content.decode()
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN


def test_resolve_settles_the_item_with_evidence_and_an_event(as_user):
    item = uncertain_item()
    response = as_user("reviewer").post(
        reverse("item-resolve", args=[item.pk]),
        {"outcome": "completed", "note": "Upload landed", "evidence": "portal shows file 2024-q3.csv"},
    )
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert item.evidence["resolution"]["evidence"] == "portal shows file 2024-q3.csv"
    event = Event.objects.filter(item=item, kind="resolved").get()
    assert event.actor == "user:reviewer" and event.from_state == S.UNCERTAIN and event.to_state == S.COMPLETED


def test_extend_deadline_needs_a_reason_and_records_it(as_user):
    item = uncertain_item()
    before = item.investigate_by
    client = as_user("reviewer")
    assert client.post(reverse("item-extend", args=[item.pk]), {"hours": 24, "reason": ""}).status_code == 400
    assert (
        client.post(
            reverse("item-extend", args=[item.pk]), {"hours": 24, "reason": "Vendor answers Monday"}
        ).status_code
        == 302
    )
    item.refresh_from_db()
    assert item.investigate_by - before >= timedelta(hours=23, minutes=59)
    assert Event.objects.filter(item=item, kind="deadline_extended", message="Vendor answers Monday").exists()


def test_escalate_to_a_named_person(as_user, roles):
    item = uncertain_item()
    response = as_user("reviewer").post(
        reverse("item-escalate", args=[item.pk]), {"to": roles["approver"].pk, "reason": "Needs the vendor contact"}
    )
    assert response.status_code == 302
    escalation = Escalation.objects.get(item=item)
    assert escalation.to == roles["approver"] and escalation.by == roles["reviewer"]
    html = as_user("approver").get(reverse("review-queue")).content.decode()
    assert f'id="escalation-{escalation.pk}"' in html and "Needs the vendor contact" in html


def test_propose_lists_the_actions_that_fit_the_record(as_user, crm):
    from tests.web.scenes import crm_effect

    record = crm_effect(crm_url=_crm_url(crm))
    email = mail_effect()
    client = as_user("reviewer")
    crm_form = client.get(reverse("record-propose", args=[record.pk])).content.decode()
    # A reversible record is reversed or accepted as it is; "report only" is for what cannot be.
    assert 'value="archive"' in crm_form and 'value="report_only"' not in crm_form
    mail_form = client.get(reverse("record-propose", args=[email.pk])).content.decode()
    assert 'value="report_only"' in mail_form and 'value="archive"' not in mail_form
    refused = client.post(reverse("record-propose", args=[email.pk]), {"action": "archive"})
    assert refused.status_code == 400
    response = client.post(reverse("record-propose", args=[record.pk]), {"action": "archive", "note": "undo"})
    assert response.status_code == 302
    compensation = Compensation.objects.get(external_record=record)
    assert compensation.expected_version == "1" and compensation.state == "proposed"


def _crm_url(crm) -> str:  # type: ignore[no-untyped-def]
    return system_url("crm")
