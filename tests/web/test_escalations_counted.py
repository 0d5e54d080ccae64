"""An escalation is counted the same on the review queue and in the admin: an open escalation row
for each item or compensation waiting on a person, whoever escalated it (a reviewer, or stopdesk
itself when a record changed under an approved compensation)."""

from __future__ import annotations

import re
import time

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reconcile.models import Compensation, Escalation
from reconcile.services.compensation import compensation_escalate
from reconcile.services.review import item_escalate
from stopdesk.views.auth import REAUTH_SESSION_KEY
from tests.factories import set_state_by_hand
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal, uncertain_item

pytestmark = pytest.mark.django_db


def queue_count(as_user) -> int:  # type: ignore[no-untyped-def]
    page = as_user("reviewer").get(reverse("review-queue")).content.decode()
    match = re.search(r'href="#escalations">Escalations <span class="n">(\d+)</span>', page)
    assert match, "the queue shows no escalation count"
    return int(match.group(1))


def admin_count(roles, **filters: str) -> int:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(roles["admin"])
    page = client.get(reverse("admin:reconcile_escalation_changelist"), filters).content.decode()
    match = re.search(r"(\d+) escalations?\b", page)
    assert match, "the admin shows no escalation count"
    return int(match.group(1))


def stale_escalation(as_user, roles, crm, approve_posted):  # type: ignore[no-untyped-def]
    """Approved against version 1 while a colleague made it version 2: stopdesk escalates it."""
    record = crm_effect(system_url("crm"), name="Stale Ltd")
    c = proposal(record, roles["reviewer"])
    crm.edit(record.record_id, actor="a colleague", phone="555-0100")
    client = as_user("approver")
    session = client.session
    session[REAUTH_SESSION_KEY] = time.time()
    session.save()
    approve_posted(client, c)
    c.refresh_from_db()
    assert c.state == "escalated"
    return c


@pytest.fixture
def approve_posted(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    def post(client, c):  # type: ignore[no-untyped-def]
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(reverse("compensation-approve", args=[c.pk]))

    return post


def test_a_compensation_stopdesk_escalated_is_one_escalation_in_the_queue_and_in_the_admin(
    as_user, roles, crm, eager, approve_posted
):
    c = stale_escalation(as_user, roles, crm, approve_posted)

    assert queue_count(as_user) == 1
    assert admin_count(roles) == 1
    escalation = Escalation.objects.get(compensation=c)
    assert escalation.by is None and escalation.closed_at is None
    assert "now at version 2" in escalation.reason


def test_the_queue_and_the_admin_count_the_same_escalations(as_user, roles, crm, eager, approve_posted):
    item = uncertain_item()
    item_escalate(item_id=item.pk, to=roles["approver"], reason="Ask the partner.", by=roles["reviewer"])
    handed = proposal(crm_effect(system_url("crm"), name="Handed Ltd"), roles["reviewer"])
    compensation_escalate(compensation_id=handed.pk, by=roles["approver"], to=roles["approver2"], reason="Yours.")
    stale_escalation(as_user, roles, crm, approve_posted)

    assert queue_count(as_user) == admin_count(roles, status="open") == 3


@pytest.mark.django_db(transaction=True)
def test_compensations_already_waiting_get_their_open_row_when_the_database_is_migrated(roles, crm):
    waiting = proposal(crm_effect(system_url("crm"), name="Before Ltd"), roles["reviewer"])
    # As an escalation by stopdesk itself left it before such escalations wrote a row.
    set_state_by_hand(
        Compensation.objects.filter(pk=waiting.pk), "escalated", reason="The record changed.", decided_at=timezone.now()
    )
    executor = MigrationExecutor(connection)
    executor.migrate([("reconcile", "0003_roles")])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    row = Escalation.objects.get(compensation=waiting)
    assert (row.by, row.to, row.reason, row.closed_at) == (None, None, "The record changed.", None)
