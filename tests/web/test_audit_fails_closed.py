"""Failing closed: when the audit event of an action cannot be written, the action does not happen.

Each test installs a real PostgreSQL trigger that refuses the one event kind the action writes
(as a full disk, a lost partition or a revoked grant would refuse it), then checks that nothing
of the action is left: the states, the rows it would create, the stamps it would set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from reconcile.models import Compensation
from reconcile.services.compensation import compensation_approve
from reconcile.services.review import item_resolve
from stopdesk.models import Event, StopRequest, Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_start
from stopdesk.states import CompensationState, ItemState
from tests.factories import ACTOR, make_item, make_task
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal, uncertain_item

S = ItemState
pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


@pytest.fixture
def refuse_event() -> Iterator[object]:
    """refuse_event(kind): from now on, inserting an event of that kind fails in the database.
    (DDL inside the test's transaction is rolled back with it; a test that runs in autocommit
    has it dropped here.)"""

    def refuse(kind: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                CREATE OR REPLACE FUNCTION test_refuse_event() RETURNS trigger AS $$
                BEGIN
                    RAISE EXCEPTION 'audit log unavailable: % not written', NEW.kind;
                END;
                $$ LANGUAGE plpgsql
                """
            )
            cursor.execute(
                "CREATE TRIGGER test_refuse_event BEFORE INSERT ON stopdesk_event FOR EACH ROW"
                f" WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION test_refuse_event()"
            )

    yield refuse
    if not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_refuse_event ON stopdesk_event")
            cursor.execute("DROP FUNCTION IF EXISTS test_refuse_event()")


def test_a_stop_whose_event_cannot_be_written_does_not_stop_the_task(refuse_event):
    task = make_task()
    running = make_item(task, state=S.RUNNING)
    queued = make_item(task)
    events = Event.objects.count()
    refuse_event("stop_requested")
    with pytest.raises(DatabaseError, match="audit log unavailable"):
        task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    task.refresh_from_db()
    assert task.stop_requested_at is None
    assert not StopRequest.objects.filter(task=task).exists()
    assert {i.pk: i.state for i in WorkItem.objects.filter(task=task)} == {running.pk: S.RUNNING, queued.pk: S.QUEUED}
    assert WorkItem.objects.filter(task=task, cancel_requested_at__isnull=False).count() == 0
    assert Event.objects.count() == events


@pytest.mark.django_db(transaction=True)
def test_a_boundary_pass_whose_event_cannot_be_written_does_not_start_the_item(refuse_event):
    # In autocommit, as a worker runs it: on PostgreSQL the pass is one statement, its own transaction.
    item = make_item(make_task())
    events = Event.objects.count()
    refuse_event("transition")
    with pytest.raises(DatabaseError, match="audit log unavailable"):
        item_start(item_id=item.pk, actor=ACTOR, worker="w1")
    item.refresh_from_db()
    assert (item.state, item.started_at, item.worker) == (S.QUEUED, None, "")
    assert Event.objects.count() == events


def test_a_compensation_whose_approval_cannot_be_recorded_is_not_approved_nor_run(refuse_event, roles, crm):
    record = crm_effect(system_url("crm"))
    compensation = proposal(record, roles["reviewer"])
    before = crm.get(record.record_id)
    events = Event.objects.count()
    refuse_event("compensation_approved")
    with pytest.raises(DatabaseError, match="audit log unavailable"):
        compensation_approve(compensation_id=compensation.pk, by=roles["approver"], reauthenticated_at=timezone.now())
    compensation = Compensation.objects.get(pk=compensation.pk)
    assert (compensation.state, compensation.approved_by_id, compensation.approved_at) == (
        CompensationState.PROPOSED,
        None,
        None,
    )
    assert Event.objects.count() == events
    assert crm.get(record.record_id) == before  # nothing ran against the CRM


def test_a_review_decision_whose_event_cannot_be_written_leaves_the_item_uncertain(refuse_event, roles):
    item = uncertain_item()
    events = Event.objects.count()
    refuse_event("resolved")
    with pytest.raises(DatabaseError, match="audit log unavailable"):
        item_resolve(
            item_id=item.pk, outcome=S.COMPLETED, note="Paid", evidence="PSP shows it paid", by=roles["reviewer"]
        )
    item.refresh_from_db()
    assert (item.state, item.finished_at) == (S.UNCERTAIN, None)
    assert "resolution" not in (item.evidence or {})
    assert Event.objects.count() == events
    assert Task.objects.get(pk=item.task_id).settled_at is None
