"""A compensation writes where the configuration says, to the recorded record, and shows the
request it will make before approval and the one it made after."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from reconcile.models import Compensation
from stopdesk.models import ExternalRecord, WorkItem
from stopdesk.services.items import item_attach_record, item_finish, item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_submit
from stopdesk.states import Kind
from stopdesk.views.auth import REAUTH_SESSION_KEY
from tests.factories import ACTOR, make_task
from tests.web.conftest import system_url
from tests.web.scenes import proposal

pytestmark = pytest.mark.django_db


def _acc10_with_a_hard_coded_reversal(crm_url: str) -> ExternalRecord:
    """The reproduction's item: its own declaration hard-codes archiving acc-9 (a row written
    before such declarations were refused; the doors refuse them now), and it recorded acc-10."""
    task = make_task("Onboard new customers")
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor=ACTOR, mechanism="http")
    item_submit(item_id=item.pk, idempotency_key=f"onboard-{item.pk}", actor=ACTOR)
    WorkItem.objects.filter(pk=item.pk).update(
        detail={
            "http": {
                "system": "crm",
                "record_url": crm_url + "/records/{record_id}",
                "reverse": {"action": "archive", "url": crm_url + "/records/acc-9/archive"},
            }
        }
    )
    record = item_attach_record(
        item_id=item.pk,
        system="crm",
        record_id="acc-10",
        effect="created",
        actor=ACTOR,
        version="1",
        reversible=True,
        reversal="archive",
    )
    item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    return record


def _approver(as_user):  # type: ignore[no-untyped-def]
    approver = as_user("approver")
    session = approver.session
    session[REAUTH_SESSION_KEY] = time.time()
    session.save()
    return approver


def test_an_approved_archive_writes_the_recorded_record_not_the_one_the_item_named(
    as_user, roles, crm, eager, django_capture_on_commit_callbacks
):
    """The reproduction: acc-10 was recorded, the item's declaration named acc-9's archive URL."""
    crm.seed("acc-9", name="Bystander Ltd")
    crm.seed("acc-10", name="ACME Ltd")
    c = proposal(_acc10_with_a_hard_coded_reversal(system_url("crm")), roles["reviewer"])
    with django_capture_on_commit_callbacks(execute=True):
        _approver(as_user).post(reverse("compensation-approve", args=[c.pk]))
    assert Compensation.objects.get(pk=c.pk).state == "done"
    assert (crm.get("acc-9")["status"], crm.get("acc-10")["status"]) == ("active", "archived")


def test_the_compensation_page_shows_the_request_before_approval_and_the_one_sent_after(
    as_user, roles, crm, eager, django_capture_on_commit_callbacks
):
    crm_url = system_url("crm")
    crm.seed("acc-9", name="Bystander Ltd")
    crm.seed("acc-10", name="ACME Ltd")
    c = proposal(_acc10_with_a_hard_coded_reversal(crm_url), roles["reviewer"])
    approver = _approver(as_user)
    before = approver.get(reverse("compensation-detail", args=[c.pk])).content.decode()
    assert f"POST {crm_url}/records/acc-10/archive" in before and "Request on approval" in before
    assert "acc-9" not in before
    with django_capture_on_commit_callbacks(execute=True):
        approver.post(reverse("compensation-approve", args=[c.pk]))
    c = Compensation.objects.get(pk=c.pk)
    assert c.result["request"] == f"POST {crm_url}/records/acc-10/archive"
    after = approver.get(reverse("compensation-detail", args=[c.pk])).content.decode()
    assert "Request sent" in after and f"POST {crm_url}/records/acc-10/archive" in after
    assert "Request on approval" not in after
