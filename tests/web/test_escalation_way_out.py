"""An escalation on a stale version has a way out: the record is read again through its adapter
(the ledger learns the new version), shown beside the version the proposal expected, and a
person proposes again at the current version or accepts the record as it is."""

from __future__ import annotations

import threading
import time

import pytest
from django.urls import reverse
from django.utils import timezone

from reconcile.models import Compensation, Escalation, RecordDecision, RecordReading
from reconcile.services.compensation import CompensationRefused, compensation_approve
from reconcile.services.escalation import compensation_accept_as_is, compensation_propose_current, compensation_reread
from stopdesk.models import Event, ExternalRecord
from stopdesk.views.auth import REAUTH_SESSION_KEY
from stopdesk.views.selectors import queue_reversals
from tests.factories import set_state_by_hand
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal
from tests.web.test_compensation import _in_thread

pytestmark = pytest.mark.django_db


@pytest.fixture
def approve(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """Approve as a person who entered the password a moment ago, and run what it queued."""

    def run(c, by):  # type: ignore[no-untyped-def]
        with django_capture_on_commit_callbacks(execute=True):
            compensation_approve(compensation_id=c.pk, by=by, reauthenticated_at=timezone.now())
        c.refresh_from_db()
        return c

    return run


@pytest.fixture
def escalated(roles, crm, eager, approve):  # type: ignore[no-untyped-def]
    """A proposal to archive a CRM record; a colleague edits the record (v1 -> v2); the approval
    escalates it."""
    record = crm_effect(system_url("crm"), name="ACME Ltd")
    c = proposal(record, roles["reviewer"])
    crm.edit(record.record_id, actor="a colleague", phone="555-0100")
    approve(c, roles["approver"])
    assert c.state == "escalated"
    return c


def _reauthed(client):  # type: ignore[no-untyped-def]
    session = client.session
    session[REAUTH_SESSION_KEY] = time.time()
    session.save()
    return client


def test_a_stale_escalation_keeps_both_reads_and_the_ledger_learns_the_new_version(escalated, crm):
    record = ExternalRecord.objects.get(pk=escalated.external_record_id)
    assert record.version == "2"
    readings = list(RecordReading.objects.filter(external_record=record, ok=True).order_by("requested_at", "id"))
    assert [r.version for r in readings] == ["1", "2"]  # at proposal, then before the write
    assert readings[0].fields == {"name": "ACME Ltd"}
    assert readings[1].fields == {"name": "ACME Ltd", "phone": "555-0100"}
    learned = Event.objects.get(kind="record_version_learned")
    assert (learned.data["before"], learned.data["after"]) == ("1", "2")
    assert crm.counts.count("archive") == 0


def test_the_escalated_page_shows_the_two_versions_side_by_side_with_what_changed_first(escalated, as_user):
    page = as_user("approver").get(reverse("compensation-detail", args=[escalated.pk])).content.decode()
    table = page[page.index('id="versions-compared"') : page.index("</table>")]
    assert "1 field differs" in table and "Now: version 2 (active)" in table
    assert table.index("phone") < table.index("name")  # the changed field leads
    assert "<code>555-0100</code>" in table and "(absent)" in table
    record = escalated.external_record
    assert f'href="{record.link}"' in page and "open it in crm" in page
    assert "Propose at version 2" in page and "Accept as it is" in page
    assert "Approve and run" not in page  # never against the old version


def test_the_queue_row_of_a_stale_escalation_leads_to_the_comparison(escalated, as_user):
    queue = as_user("approver").get(reverse("review-queue")).content.decode()
    row = queue[queue.index(f'id="compensation-{escalated.pk}"') :]
    row = row[: row.index("</li>")]
    assert "now at version <code>2</code>" in row and "Compare and decide…" in row


def test_proposing_again_at_the_current_version_needs_its_own_approval_and_then_runs(escalated, roles, crm, approve):
    new = compensation_propose_current(compensation_id=escalated.pk, by=roles["approver"], note="Still unwanted.")
    escalated.refresh_from_db()
    assert escalated.state == "rejected" and "Proposed again at version 2" in escalated.reason
    assert not Escalation.objects.filter(compensation=escalated, closed_at__isnull=True).exists()
    assert (new.state, new.expected_version, new.proposed_by) == ("proposed", "2", roles["approver"])
    with pytest.raises(CompensationRefused, match="another approver must approve"):
        approve(new, roles["approver"])
    assert approve(new, roles["approver2"]).state == "done"
    assert crm.get(escalated.external_record.record_id)["status"] == "archived"
    # The archive is a version of its own, and the ledger learns it too.
    assert ExternalRecord.objects.get(pk=escalated.external_record_id).version == "3"
    assert Event.objects.get(kind="compensation_proposed", data__compensation=new.pk).data["supersedes"] == escalated.pk


def test_reject_and_propose_again_from_the_queue_proposes_at_the_version_the_ledger_learned(
    escalated, as_user, roles, crm, approve
):
    # The old loop: the queue's proposal went out at version 1 again and escalated again.
    client = as_user("approver")
    client.post(reverse("compensation-reject", args=[escalated.pk]), {"reason": "Propose it again"})
    response = as_user("reviewer").post(
        reverse("record-propose", args=[escalated.external_record_id]), {"action": "archive", "note": "again"}
    )
    assert response.status_code == 302
    again = Compensation.objects.filter(external_record=escalated.external_record).latest("pk")
    assert again.expected_version == "2"
    assert approve(again, roles["approver2"]).state == "done"
    assert crm.counts.count("archive") == 1


def test_the_way_out_through_the_pages(escalated, as_user, roles):
    client = as_user("approver")
    response = client.post(reverse("compensation-propose-current", args=[escalated.pk]), {"note": "Undo at v2"})
    new = Compensation.objects.filter(external_record=escalated.external_record).latest("pk")
    assert response.status_code == 302 and response["Location"] == reverse("compensation-detail", args=[new.pk])
    page = client.get(response["Location"]).content.decode()
    assert "Proposed again at version 2. Another person with the approver role must approve it." in page
    # The second approver sees it in the queue at version 2.
    old_page = as_user("reviewer").get(reverse("compensation-detail", args=[escalated.pk])).content.decode()
    assert (
        f'Proposed again as <a href="{reverse("compensation-detail", args=[new.pk])}">compensation #{new.pk}</a>'
        in old_page
    )
    assert "at version <code>2</code>: proposed." in old_page
    queue = as_user("approver2").get(reverse("review-queue")).content.decode()
    row = queue[queue.index(f'id="compensation-{new.pk}"') :]
    assert "version <code>2</code>" in row[: row.index("</li>")]


def test_accept_as_is_closes_the_escalation_and_writes_nothing(escalated, as_user, crm):
    client = as_user("approver")
    refused = client.post(reverse("compensation-accept", args=[escalated.pk]), {"note": "  "})
    assert refused.status_code == 400 and "Say why the record can stay" in refused.content.decode()
    escalated.refresh_from_db()
    assert escalated.state == "escalated" and not RecordDecision.objects.exists()
    response = client.post(reverse("compensation-accept", args=[escalated.pk]), {"note": "The colleague kept it."})
    assert response.status_code == 302
    escalated.refresh_from_db()
    assert escalated.state == "rejected" and escalated.reason == "Accepted as it is: The colleague kept it."
    decision = RecordDecision.objects.get()
    assert (decision.kind, decision.compensation_id, decision.note) == (
        "accepted",
        escalated.pk,
        "The colleague kept it.",
    )
    assert not Escalation.objects.filter(compensation=escalated, closed_at__isnull=True).exists()
    assert not queue_reversals().filter(pk=escalated.external_record_id).exists()
    kinds = set(Event.objects.filter(data__compensation=escalated.pk).values_list("kind", flat=True))
    assert {"compensation_accepted_as_is", "record_accepted"} <= kinds
    assert crm.counts.count("archive") == 0 and crm.get(escalated.external_record.record_id)["status"] == "active"


def test_read_again_learns_a_second_edit(escalated, roles, crm):
    crm.edit(escalated.external_record.record_id, actor="a colleague", phone="555-0199")  # v2 -> v3
    compensation_reread(compensation_id=escalated.pk, by=roles["approver"])
    escalated.refresh_from_db()
    assert escalated.observed_version == "3" and escalated.state == "escalated"
    assert ExternalRecord.objects.get(pk=escalated.external_record_id).version == "3"
    latest = RecordReading.objects.filter(compensation=escalated).first()
    assert latest is not None and latest.actor == "user:approver" and latest.fields["phone"] == "555-0199"
    kinds = list(Event.objects.filter(data__reading=latest.pk).order_by("id").values_list("kind", flat=True))
    assert kinds == ["record_read_requested", "record_read"]  # the intent, then the answer


def test_a_read_that_fails_is_recorded_and_teaches_the_ledger_nothing(escalated, roles, crm):
    crm.set_fault("read_500", target=escalated.external_record.record_id)
    compensation_reread(compensation_id=escalated.pk, by=roles["approver"])
    latest = RecordReading.objects.filter(compensation=escalated).first()
    assert latest is not None and latest.ok is False and "HTTP 500" in latest.error
    assert ExternalRecord.objects.get(pk=escalated.external_record_id).version == "2"
    assert Event.objects.filter(kind="record_read_failed", data__reading=latest.pk).exists()


def test_proposing_again_is_refused_while_no_newer_version_is_known(roles, crm, eager):
    record = crm_effect(system_url("crm"))
    c = proposal(record, roles["reviewer"])
    set_state_by_hand(Compensation.objects.filter(pk=c.pk), "escalated")  # same version
    with pytest.raises(CompensationRefused, match="no version newer"):
        compensation_propose_current(compensation_id=c.pk, by=roles["approver"])
    with pytest.raises(CompensationRefused, match="Say why"):
        compensation_accept_as_is(compensation_id=c.pk, by=roles["approver"], note="")
    assert Compensation.objects.get(pk=c.pk).state == "escalated"


def test_the_proposer_is_told_it_escalated_not_that_it_waits_for_approval(escalated, as_user):
    page = as_user("reviewer").get(reverse("compensation-detail", args=[escalated.pk])).content.decode()
    assert "must approve it" not in page
    assert "It did not run and does not wait for an approval" in page
    assert "version <code>1</code> → <code>2</code>" in page


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_people_choosing_a_way_out_at_once_leave_one_decision(roles, crm, eager):
    record = crm_effect(system_url("crm"))
    c = proposal(record, roles["reviewer"])
    crm.edit(record.record_id, actor="a colleague", phone="555-0100")
    compensation_approve(compensation_id=c.pk, by=roles["approver"], reauthenticated_at=timezone.now())
    c.refresh_from_db()
    assert c.state == "escalated"
    barrier = threading.Barrier(2)
    results: list = []
    errors: list = []

    def propose_again():  # type: ignore[no-untyped-def]
        barrier.wait()
        return compensation_propose_current(compensation_id=c.pk, by=roles["approver"])

    def accept():  # type: ignore[no-untyped-def]
        barrier.wait()
        return compensation_accept_as_is(compensation_id=c.pk, by=roles["approver2"], note="Keep it.")

    threads = [_in_thread(propose_again, results, errors), _in_thread(accept, results, errors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 1 and len(errors) == 1 and isinstance(errors[0], CompensationRefused)
    decided = Event.objects.filter(
        kind__in=("compensation_superseded", "compensation_accepted_as_is"), data__compensation=c.pk
    )
    assert decided.count() == 1
    # Either one new proposal at version 2 or one acceptance, never both.
    proposals = Compensation.objects.filter(external_record=record).exclude(pk=c.pk)
    assert proposals.count() + RecordDecision.objects.count() == 1


def test_a_record_edited_before_the_proposal_is_proposed_at_its_current_version(as_user, crm):
    record = crm_effect(system_url("crm"))
    crm.edit(record.record_id, actor="a colleague", phone="555-0100")  # before anyone proposes
    client = as_user("reviewer")
    response = client.post(reverse("record-propose", args=[record.pk]), {"action": "archive", "note": "undo"})
    assert response.status_code == 302
    assert Compensation.objects.get(external_record=record).expected_version == "2"
    page = client.get(response["Location"]).content.decode()
    assert "the record is now at version 2 (stopdesk had recorded 1); proposed at version 2." in page


def test_a_structured_field_reads_as_json_not_as_python(escalated, roles, crm, as_user):
    crm.edit(escalated.external_record.record_id, actor="a colleague", address={"city": "Köln", "zip": None})
    compensation_reread(compensation_id=escalated.pk, by=roles["approver"])
    page = as_user("approver").get(reverse("compensation-detail", args=[escalated.pk])).content.decode()
    assert "{&quot;city&quot;: &quot;Köln&quot;, &quot;zip&quot;: null}" in page
    assert "&#x27;city&#x27;" not in page and "None}" not in page
