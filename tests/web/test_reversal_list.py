"""The reversal list fits what happened: effects completed before Stop are marked and left off
unless a reviewer puts them there; one person accepts effects as they are (many at once, one
note, an audit entry each); approval stays for what writes; the result text says what happened."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from reconcile.models import Compensation, RecordDecision
from reconcile.services.compensation import compensation_actions
from reconcile.services.records import RecordDecisionRefused, records_accept_as_is
from stopdesk.models import Event
from stopdesk.views.auth import REAUTH_SESSION_KEY
from stopdesk.views.selectors import queue_before_stop, queue_reversals
from tests.web.conftest import htmx, system_url
from tests.web.scenes import crm_effect, mail_effect, proposal

pytestmark = pytest.mark.django_db


def _section(html: str, section_id: str) -> str:
    start = html.index(f'<section id="{section_id}"')
    return html[start : html.index("</section>", start)]


def test_effects_completed_before_stop_are_marked_and_not_on_the_reversal_list(as_user, crm):
    before = crm_effect(system_url("crm"), name="Done before Stop", before_stop=True)
    after = crm_effect(system_url("crm"), name="Done after Stop")
    assert list(queue_reversals()) == [after]
    assert list(queue_before_stop()) == [before]
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    reversals, pre_stop = _section(html, "reversals"), _section(html, "before-stop")
    assert f'id="record-{after.pk}"' in reversals and f'id="record-{before.pk}"' not in reversals
    assert f'id="record-{before.pk}"' in pre_stop and "completed before Stop" in pre_stop


def test_a_reviewer_puts_an_effect_completed_before_stop_on_the_reversal_list(as_user, roles, crm):
    before = crm_effect(system_url("crm"), before_stop=True)
    response = as_user("reviewer").post(reverse("record-flag", args=[before.pk]), {"note": "Wrong customer"})
    assert response.status_code == 302
    assert list(queue_reversals()) == [before] and not queue_before_stop().exists()
    decision = RecordDecision.objects.get()
    assert (decision.kind, decision.by, decision.note) == ("flagged", roles["reviewer"], "Wrong customer")
    assert Event.objects.filter(kind="record_flagged", data__decision=decision.pk).exists()
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert "completed before Stop</span>, put here by a reviewer" in _section(html, "reversals")


def test_one_reviewer_accepts_many_effects_with_one_note_each_its_own_event(as_user, roles, crm):
    records = [crm_effect(system_url("crm"), name=f"Vendor {n}", before_stop=True) for n in range(3)]
    kept = crm_effect(system_url("crm"), name="Not chosen", before_stop=True)
    client = as_user("reviewer")
    response = client.post(
        reverse("records-accept"),
        {
            "record": [r.pk for r in records],
            "listed": [r.pk for r in [*records, kept]],
            "note": "Asked for before Stop.",
        },
    )
    assert response.status_code == 302
    decisions = RecordDecision.objects.filter(kind="accepted")
    assert sorted(d.external_record_id for d in decisions) == sorted(r.pk for r in records)
    assert {(d.by_id, d.note) for d in decisions} == {(roles["reviewer"].pk, "Asked for before Stop.")}
    events = Event.objects.filter(kind="record_accepted")
    assert sorted(e.data["decision"] for e in events) == sorted(d.pk for d in decisions)
    assert not Compensation.objects.exists()  # nothing to approve: nothing is written anywhere
    assert list(queue_before_stop()) == [kept] and not queue_reversals().exists()
    assert "Accepted 3 effects as they are." in client.get(reverse("review-queue")).content.decode()


def test_accept_all_on_the_page_takes_every_listed_effect(as_user, crm):
    records = [crm_effect(system_url("crm"), name=f"Vendor {n}") for n in range(2)]
    response = as_user("reviewer").post(
        reverse("records-accept"), {"listed": [r.pk for r in records], "all": "1", "note": "Fine as they are."}
    )
    assert response.status_code == 302
    assert RecordDecision.objects.filter(kind="accepted").count() == 2 and not queue_reversals().exists()


def test_accepting_needs_a_note_and_a_refused_batch_writes_nothing(roles, crm):
    free = crm_effect(system_url("crm"), name="Free")
    busy = crm_effect(system_url("crm"), name="Busy")
    proposal(busy, roles["reviewer"])
    with pytest.raises(RecordDecisionRefused, match="Say why"):
        records_accept_as_is(record_ids=[free.pk], by=roles["reviewer"], note=" ")
    with pytest.raises(RecordDecisionRefused, match="compensation in progress"):
        records_accept_as_is(record_ids=[free.pk, busy.pk], by=roles["reviewer"], note="ok")
    with pytest.raises(RecordDecisionRefused, match="reviewer role"):
        records_accept_as_is(record_ids=[free.pk], by=roles["approver"], note="ok")
    assert not RecordDecision.objects.exists() and not Event.objects.filter(kind="record_accepted").exists()


def test_accepting_twice_says_it_once(roles, crm):
    record = crm_effect(system_url("crm"))
    for _ in range(2):
        records_accept_as_is(record_ids=[record.pk], by=roles["reviewer"], note="ok")
    assert RecordDecision.objects.count() == 1 and Event.objects.filter(kind="record_accepted").count() == 1


def test_a_reversible_record_is_not_offered_report_only(crm):
    record = crm_effect(system_url("crm"))
    assert [a.name for a in compensation_actions(record)] == ["archive"]
    assert [a.name for a in compensation_actions(mail_effect())] == ["report_only"]


def test_a_report_only_result_says_what_happened_and_no_empty_version(
    as_user, roles, eager, django_capture_on_commit_callbacks
):
    c = proposal(mail_effect(), roles["reviewer"], action="report_only")
    client = as_user("approver")
    session = client.session
    session[REAUTH_SESSION_KEY] = time.time()
    session.save()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("compensation-approve", args=[c.pk]))
    page = client.get(reverse("compensation-detail", args=[c.pk])).content.decode()
    assert "Reported only: nothing was sent to outbox; the sent email stays as it is." in page
    assert "at version ." not in page and "at version <code></code>" not in page
    assert Event.objects.get(kind="compensation_done", data__compensation=c.pk).message == (
        "Reported only: nothing was sent to outbox."
    )


def test_the_reversals_fragment_keeps_its_accept_form(as_user, crm):
    after = crm_effect(system_url("crm"))
    html = as_user("reviewer").get(reverse("review-queue"), **htmx("reversals")).content.decode()
    assert html.lstrip().startswith('<section id="reversals"')
    assert f'id="record-{after.pk}"' in html and "Accept the chosen ones" in html and "csrfmiddlewaretoken" in html
