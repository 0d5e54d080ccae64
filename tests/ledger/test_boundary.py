import pytest

from stopdesk.models import Event, WorkItem
from stopdesk.services.errors import IllegalTransition, TaskStopped
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db


def _stop(task):
    return task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)


def test_start_moves_a_queued_item_to_running_with_its_event():
    task = make_task()
    item = make_item(task)
    item_start(item_id=item.pk, actor="worker", worker="w1")
    item.refresh_from_db()
    assert item.state == S.RUNNING
    assert item.started_at is not None and item.lease_until > item.started_at and item.worker == "w1"
    assert Event.objects.filter(item=item, kind="transition", from_state=S.QUEUED, to_state=S.RUNNING).count() == 1


def test_start_after_stop_raises_task_stopped_and_the_item_is_cancelled():
    task = make_task()
    item = make_item(task)
    item_start_target = make_item(task)
    _stop(task)
    with pytest.raises(TaskStopped):
        item_start(item_id=item_start_target.pk, actor="worker")
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.started_at is None


def test_an_item_registered_after_stop_is_recorded_settled_and_refused_at_the_boundary():
    task = make_task()
    _stop(task)
    late = make_item(task)
    assert late.state == S.CANCELLED and late.outcome == "registered after Stop; never started"
    assert Event.objects.filter(item=late, kind="item_registered").exists()
    assert Event.objects.filter(item=late, kind="boundary_refused", to_state=S.CANCELLED).exists()
    with pytest.raises(TaskStopped):
        item_start(item_id=late.pk, actor="worker")
    late.refresh_from_db()
    assert late.state == S.CANCELLED and late.started_at is None


def test_submit_after_stop_is_refused_for_a_running_item():
    task = make_task()
    item = make_item(task, state=S.RUNNING)
    _stop(task)
    with pytest.raises(TaskStopped):
        item_submit(item_id=item.pk, idempotency_key="k-1", actor="worker")
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.submitted_at is None and item.idempotency_key == ""


def test_submit_records_the_idempotency_key_before_the_call():
    task = make_task()
    item = make_item(task)
    item_submit(item_id=item.pk, idempotency_key="crm-42", actor="worker")
    item.refresh_from_db()
    assert (item.state, item.idempotency_key) == (S.RUNNING, "crm-42") and item.submitted_at is not None
    with pytest.raises(IllegalTransition):
        item_submit(item_id=item.pk, idempotency_key="crm-43", actor="worker")


def test_starting_twice_is_an_illegal_transition_naming_the_state():
    item = make_item(make_task(), state=S.RUNNING)
    with pytest.raises(IllegalTransition, match="is running"):
        item_start(item_id=item.pk, actor="worker")


def test_transitions_not_in_the_table_are_refused():
    item = make_item(make_task(), state=S.COMPLETED)
    with pytest.raises(IllegalTransition):
        item_transition(item_id=item.pk, to_state=S.RUNNING, actor="test")
    assert WorkItem.objects.get(pk=item.pk).state == S.COMPLETED


def test_a_late_result_after_cancel_is_an_event_and_a_review_flag_not_an_overwrite():
    task = make_task()
    item = make_item(task, state=S.RUNNING)
    item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test")
    item_finish(item_id=item.pk, succeeded=True, actor="late-worker", outcome="draft written")
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    assert item.needs_review is True
    late = Event.objects.get(item=item, kind="late_result")
    assert late.data["reported"] == S.COMPLETED and "review required" in late.message


def test_uncertain_gets_an_investigate_by_deadline():
    item = make_item(make_task(), state=S.UNCERTAIN)
    assert item.investigate_by is not None and item.investigate_by > item.updated_at


def test_an_uncertain_item_always_says_why():
    task = make_task()
    told = make_item(task, state=S.RUNNING)
    item_transition(item_id=told.pk, to_state=S.UNCERTAIN, actor="t", evidence={"uncertain_because": "no lookup"})
    untold = make_item(task, state=S.RUNNING)
    item_transition(item_id=untold.pk, to_state=S.UNCERTAIN, actor="t", outcome="the agent lost its answer")
    told.refresh_from_db()
    untold.refresh_from_db()
    assert told.evidence["uncertain_because"] == "no lookup"
    assert untold.evidence["uncertain_because"] == "the agent lost its answer"


@pytest.mark.postgres
def test_the_start_is_one_statement_on_postgres(django_assert_num_queries):
    item = make_item(make_task())
    with django_assert_num_queries(1):
        item_start(item_id=item.pk, actor="worker")


def test_audit_events_cannot_be_changed_or_deleted():
    item = make_item(make_task())
    event = Event.objects.filter(item=item).first()
    event.message = "rewritten"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        Event.objects.filter(item=item).delete()
    with pytest.raises(PermissionError):
        Event.objects.filter(item=item).update(message="x")


@pytest.mark.postgres
def test_the_database_refuses_raw_updates_of_events():
    from django.db import DatabaseError, connection, transaction

    item = make_item(make_task())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE stopdesk_event SET message = 'x' WHERE item_id = %s", [item.pk])


@pytest.mark.parametrize(
    ("state", "expected", "late"),
    [
        (S.RUNNING, S.CANCELLED, False),
        (S.AWAITING_RECONCILIATION, S.CANCELLED, False),
        (S.UNCERTAIN, S.CANCELLED, False),
        (S.COMPLETED, S.COMPLETED, True),
        (S.CANCELLED, S.CANCELLED, False),
    ],
)
def test_a_worker_reporting_it_stopped_settles_or_is_kept_as_a_late_result(state, expected, late):
    from stopdesk.services.items import item_report_stopped

    item = make_item(make_task(), state=state)
    item_report_stopped(item_id=item.pk, actor="celery:agent")
    item.refresh_from_db()
    assert item.state == expected
    assert item.needs_review is late
    assert Event.objects.filter(item=item, kind="late_result").exists() is late
