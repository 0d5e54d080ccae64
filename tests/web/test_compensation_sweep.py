"""Compensations are never left half-done: a lost job is queued again, a lost worker escalates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reconcile.models import Compensation
from reconcile.services.compensation import compensation_execute, compensations_sweep
from stopdesk.models import Event
from tests.factories import set_state_by_hand
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal

pytestmark = pytest.mark.django_db


def _approved_long_ago(c: Compensation, roles, minutes: int = 5) -> None:  # type: ignore[no-untyped-def]
    # As if approved (through the flow the other tests cover) and its job lost with the broker.
    set_state_by_hand(
        Compensation.objects.filter(pk=c.pk),
        "approved",
        approved_by=roles["approver"],
        approved_at=timezone.now() - timedelta(minutes=minutes),
    )


def test_an_approved_compensation_whose_job_was_lost_is_queued_again_and_runs_once(roles, crm):
    record = crm_effect(system_url("crm"))
    c = proposal(record, roles["reviewer"])
    _approved_long_ago(c, roles)
    queued: list[int] = []
    swept = compensations_sweep(enqueue=queued.append)
    assert swept["requeued"] == [c.pk] and queued == [c.pk]
    compensation_execute(compensation_id=c.pk)
    compensation_execute(compensation_id=c.pk)  # the original job turns up after all
    assert Compensation.objects.get(pk=c.pk).state == "done"
    assert crm.counts.count("archive") == 1


def test_a_recent_approval_is_left_to_its_own_job(roles, crm):
    record = crm_effect(system_url("crm"))
    c = proposal(record, roles["reviewer"])
    _approved_long_ago(c, roles, minutes=0)
    assert compensations_sweep(enqueue=lambda pk: None)["requeued"] == []


def test_a_compensation_whose_worker_died_mid_run_is_escalated_not_retried(roles, crm):
    record = crm_effect(system_url("crm"))
    c = proposal(record, roles["reviewer"])
    set_state_by_hand(
        Compensation.objects.filter(pk=c.pk),
        "running",
        approved_by=roles["approver"],
        started_at=timezone.now() - timedelta(minutes=30),
    )
    queued: list[int] = []
    swept = compensations_sweep(enqueue=queued.append)
    c.refresh_from_db()
    assert swept["interrupted"] == [c.pk] and queued == []
    assert c.state == "escalated" and "Check the record" in Event.objects.get(kind="compensation_interrupted").message
    assert crm.counts.count("archive") == 0
    # A second sweep finds nothing more to do.
    assert compensations_sweep(enqueue=queued.append) == {"requeued": [], "interrupted": []}
