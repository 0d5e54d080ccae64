"""Compensation: fresh permission, a second person, a fresh version read, and one execution."""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from reconcile.models import Compensation
from reconcile.services.compensation import (
    CompensationRefused,
    compensation_approve,
    compensation_execute,
)
from stopdesk.models import Event, StopRequest, WorkItem
from stopdesk.views.auth import REAUTH_SESSION_KEY
from tests.factories import set_state_by_hand
from tests.web.conftest import htmx, system_url
from tests.web.scenes import crm_effect, mail_effect, proposal

pytestmark = pytest.mark.django_db


def _crm_url() -> str:
    return system_url("crm")


@pytest.fixture
def approve(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """POST the approval and run what it queued after commit (the test is inside a transaction)."""

    def post(client, c, data=None):  # type: ignore[no-untyped-def]
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(reverse("compensation-approve", args=[c.pk]), data or {})

    return post


def _reauthed(client):  # type: ignore[no-untyped-def]
    session = client.session
    session[REAUTH_SESSION_KEY] = time.time()
    session.save()
    return client


def test_a_proposer_cannot_approve_their_own_compensation(approve, as_user, roles, crm):
    # A superuser has every permission; the proposer rule still holds.
    record = crm_effect(_crm_url())
    c = proposal(record, roles["admin"])
    client = _reauthed(as_user("admin"))
    response = approve(client, c)
    assert response.status_code == 403 and "another approver must approve" in response.content.decode()
    c.refresh_from_db()
    assert c.state == "proposed" and crm.counts.count("archive") == 0


def test_approval_without_recent_reauthentication_is_refused(approve, as_user, roles, crm, eager):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    response = approve(as_user("approver"), c)
    assert response.status_code == 403 and "Re-enter your password" in response.content.decode()
    c.refresh_from_db()
    assert c.state == "proposed"


def test_an_old_reauthentication_does_not_count(approve, as_user, roles, crm, eager):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    client = as_user("approver")
    session = client.session
    session[REAUTH_SESSION_KEY] = time.time() - settings.STOPDESK_REAUTH_SECONDS - 5
    session.save()
    assert approve(client, c).status_code == 403
    assert Compensation.objects.get(pk=c.pk).state == "proposed"


def test_a_wrong_password_does_not_approve(approve, as_user, roles, crm, eager):
    c = proposal(crm_effect(_crm_url()), roles["reviewer"])
    response = approve(as_user("approver"), c, {"password": "nope"})
    assert response.status_code == 403
    assert Compensation.objects.get(pk=c.pk).state == "proposed"


def test_reauthenticate_then_approve_archives_the_record_with_if_match(approve, as_user, roles, crm, eager):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    client = as_user("approver")
    page = client.get(reverse("reauth"), {"next": reverse("compensation-detail", args=[c.pk])})
    assert page.status_code == 200
    response = client.post(reverse("reauth"), {"password": "approver-pass-123", "next": "/queue/"})
    assert response.status_code == 302 and response["Location"] == "/queue/"
    response = approve(client, c)
    assert response.status_code == 302
    c.refresh_from_db()
    assert c.state == "done" and c.approved_by == roles["approver"] and c.observed_version == "1"
    assert crm.get(record.record_id)["status"] == "archived"
    assert crm.counts.count("archive") == 1
    kinds = list(Event.objects.filter(data__compensation=c.pk).values_list("kind", flat=True))
    assert kinds == [
        "compensation_proposed",
        "compensation_approved",
        "compensation_started",
        "record_read_requested",  # the version read before the write is kept, intent then answer
        "record_read",
        "compensation_done",
    ]


def test_the_password_can_be_entered_in_the_approval_form(approve, as_user, roles, crm, eager):
    c = proposal(crm_effect(_crm_url()), roles["reviewer"])
    response = approve(as_user("approver"), c, {"password": "approver-pass-123"})
    assert response.status_code == 302
    assert Compensation.objects.get(pk=c.pk).state == "done"


def test_a_record_edited_in_between_is_escalated_with_both_versions_and_nothing_written(
    approve, as_user, roles, crm, eager
):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    crm.edit(record.record_id, actor="a colleague", phone="555-0100")  # version 1 -> 2
    client = _reauthed(as_user("approver"))
    approve(client, c)
    c.refresh_from_db()
    assert c.state == "escalated"
    assert (c.expected_version, c.observed_version) == ("1", "2")
    assert crm.counts.count("archive") == 0
    assert crm.get(record.record_id)["status"] == "active"
    page = client.get(reverse("compensation-detail", args=[c.pk])).content.decode()
    assert "approved against version <code>1</code>, the record is now at version <code>2</code>" in page
    queue = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert f'id="compensation-{c.pk}"' in queue and "Nothing was written." in queue
    # It cannot be approved again against the old version.
    with pytest.raises(CompensationRefused):
        compensation_approve(compensation_id=c.pk, by=roles["approver2"], reauthenticated_at=timezone.now())


def test_an_edit_between_the_read_and_the_write_is_caught_by_if_match(roles, crm, eager, monkeypatch):
    from reconcile.mechanisms.http.adapter import HttpOperation

    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    set_state_by_hand(Compensation.objects.filter(pk=c.pk), "approved")
    real_read = HttpOperation.read_version

    def read_then_someone_edits(self, rec, **kwargs):  # type: ignore[no-untyped-def]
        version = real_read(self, rec, **kwargs)
        crm.edit(rec.record_id, actor="a colleague")
        return version

    # The race is staged on the CRM's side; our executor runs unchanged.
    monkeypatch.setattr(HttpOperation, "read_version", read_then_someone_edits)
    compensation_execute(compensation_id=c.pk)
    c.refresh_from_db()
    assert c.state == "escalated" and c.observed_version == "2"
    assert crm.get(record.record_id)["status"] == "active"


def test_a_failing_compensation_fails_on_its_own_without_touching_the_stop(approve, as_user, roles, crm, eager):
    record = crm_effect(_crm_url())
    task_id = record.item.task_id
    items_before = list(WorkItem.objects.filter(task_id=task_id).values_list("id", "state"))
    stop_before = StopRequest.objects.filter(task_id=task_id).values().get()
    c = proposal(record, roles["reviewer"])
    crm.set_fault("fail_500", target=record.record_id)
    approve(_reauthed(as_user("approver")), c)
    c.refresh_from_db()
    assert c.state == "failed" and "HTTP 500" in c.error
    assert list(WorkItem.objects.filter(task_id=task_id).values_list("id", "state")) == items_before
    assert StopRequest.objects.filter(task_id=task_id).values().get() == stop_before
    page = as_user("approver").get(reverse("compensation-detail", args=[c.pk])).content.decode()
    assert "Failed:" in page and "stop is unaffected" in page


def test_report_only_for_a_sent_email_writes_nothing(approve, as_user, roles, eager):
    record = mail_effect()
    c = proposal(record, roles["reviewer"], action="report_only")
    approve(_reauthed(as_user("approver")), c)
    c.refresh_from_db()
    assert c.state == "done" and c.result["reported"] is True


def test_reject_needs_a_reason_and_records_who(as_user, roles, crm):
    c = proposal(crm_effect(_crm_url()), roles["reviewer"])
    client = as_user("approver")
    assert client.post(reverse("compensation-reject", args=[c.pk]), {"reason": ""}).status_code == 400
    assert client.post(reverse("compensation-reject", args=[c.pk]), {"reason": "Customer wants it"}).status_code == 302
    c.refresh_from_db()
    assert c.state == "rejected" and c.rejected_by == roles["approver"] and c.reason == "Customer wants it"


def test_escalate_a_proposal_to_a_named_approver(as_user, roles, crm):
    c = proposal(crm_effect(_crm_url()), roles["reviewer"])
    response = as_user("reviewer").post(
        reverse("compensation-escalate", args=[c.pk]), {"to": roles["approver2"].pk, "reason": "Big customer"}
    )
    assert response.status_code == 302
    c.refresh_from_db()
    assert c.state == "escalated" and c.escalated_to == roles["approver2"]


def test_compensation_page_and_status_fragment(as_user, roles, crm):
    c = proposal(crm_effect(_crm_url()), roles["reviewer"])
    client = as_user("approver")
    full = client.get(reverse("compensation-detail", args=[c.pk]))
    assert full.status_code == 200 and "<html" in full.content.decode() and 'name="password"' in full.content.decode()
    fragment = client.get(reverse("compensation-detail", args=[c.pk]), **htmx("compensation-status"))
    assert fragment.content.decode().lstrip().startswith('<section id="compensation-status"')
    assert fragment.status_code == 286  # proposed is not running: nothing to poll for


def _in_thread(fn, results, errors):  # type: ignore[no-untyped-def]
    def run() -> None:
        try:
            results.append(fn())
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    return threading.Thread(target=run)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_approvers_at_once_execute_it_once(roles, crm, eager):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    barrier = threading.Barrier(2)
    results: list = []
    errors: list = []

    def approve_as(person):  # type: ignore[no-untyped-def]
        def go():  # type: ignore[no-untyped-def]
            barrier.wait()
            return compensation_approve(compensation_id=c.pk, by=person, reauthenticated_at=timezone.now())

        return go

    threads = [_in_thread(approve_as(roles[p]), results, errors) for p in ("approver", "approver2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 1 and len(errors) == 1 and isinstance(errors[0], CompensationRefused)
    c.refresh_from_db()
    assert c.state == "done"
    assert crm.counts.count("archive") == 1
    assert Event.objects.filter(kind="compensation_approved", data__compensation=c.pk).count() == 1
    assert Event.objects.filter(kind="compensation_started", data__compensation=c.pk).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_executions_of_one_approval_run_it_once(roles, crm):
    record = crm_effect(_crm_url())
    c = proposal(record, roles["reviewer"])
    set_state_by_hand(Compensation.objects.filter(pk=c.pk), "approved")  # as if approved; its job delivered twice
    barrier = threading.Barrier(4)
    results: list = []
    errors: list = []

    def execute():  # type: ignore[no-untyped-def]
        barrier.wait()
        return compensation_execute(compensation_id=c.pk)

    threads = [_in_thread(execute, results, errors) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert crm.counts.count("archive") == 1
    assert Compensation.objects.get(pk=c.pk).state == "done"
