"""The suite's state guard (tests/state_guard.py) catches every way around the one writer that a
reading of the source could miss, and lets the writers themselves through."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from reconcile.models import Compensation
from reconcile.services.compensation import compensation_move
from stopdesk.models import ExternalRecord, WorkItem
from stopdesk.notify.delivery import delivery_move
from stopdesk.notify.models import Delivery, Notification
from stopdesk.services.transitions import item_transition
from stopdesk.states import CompensationState, DeliveryState
from stopdesk.states import ItemState as S
from tests import state_guard
from tests.factories import make_external_effect, make_item, make_task, set_state_by_hand
from tests.state_guard import StateWriteOutsideWriter, machines_written

TABLE = WorkItem._meta.db_table


def _caught(write: Callable[[], object]) -> str:
    """Run a write the guard must refuse; return what it recorded (and leave the test clean)."""
    with pytest.raises(StateWriteOutsideWriter), transaction.atomic():
        write()
    (found,) = state_guard.take_found()
    return found


def _raw(sql: str, params: list[object]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.django_db
def test_the_guard_lets_the_transitions_through_and_new_items_start_queued():
    item = make_item(make_task(), state=S.RUNNING)  # item_register (queued) then the transitions
    item_transition(item_id=item.pk, to_state=S.AWAITING_RECONCILIATION, actor="t")
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION and state_guard.take_found() == []


@pytest.mark.django_db
def test_the_one_test_helper_that_sets_a_state_by_hand_passes():
    item = make_item(make_task())
    assert set_state_by_hand(WorkItem.objects.filter(pk=item.pk), S.COMPLETED) == 1
    assert state_guard.take_found() == []


@pytest.mark.django_db
def test_a_receiver_not_spelled_workitem_is_caught():
    item = make_item(make_task())
    queryset = WorkItem.objects.filter(pk=item.pk)
    assert "stopdesk_workitem.state" in _caught(lambda: queryset.update(state=S.RUNNING))
    assert "stopdesk_workitem.state" in _caught(lambda: item.task.items.update(state=S.RUNNING))


@pytest.mark.django_db
def test_a_dict_in_a_variable_is_caught():
    item = make_item(make_task())
    changes = {"state": S.CANCELLED}
    _caught(lambda: WorkItem.objects.filter(pk=item.pk).update(**changes))


@pytest.mark.django_db
def test_setattr_then_save_is_caught():
    item = make_item(make_task())
    setattr(item, "state", S.RUNNING)
    _caught(item.save)
    _caught(lambda: item.save(update_fields=["state"]))


@pytest.mark.django_db
def test_bulk_update_of_the_state_is_caught():
    item = make_item(make_task())
    _caught(lambda: WorkItem.objects.bulk_update([WorkItem(pk=item.pk, state=S.FAILED)], ["state"]))


@pytest.mark.django_db
def test_creating_an_item_in_another_state_than_queued_is_caught():
    task = make_task()
    _caught(lambda: WorkItem.objects.create(task=task, kind="model_request", noun="x", state=S.RUNNING))
    _caught(lambda: WorkItem.objects.bulk_create([WorkItem(task=task, kind="model_request", state=S.COMPLETED)]))
    _caught(lambda: WorkItem.objects.bulk_create([WorkItem(task=task, state=s) for s in (S.QUEUED, S.RUNNING)]))
    # New work in the initial state is no move, one row or many.
    WorkItem.objects.bulk_create([WorkItem(task=task, kind="model_request", noun=n) for n in ("a", "b")])
    assert state_guard.take_found() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sql",
    [
        'UPDATE "stopdesk_workitem" SET "state" = %s WHERE "id" = %s',  # quoted, as Django prints it
        "update stopdesk_workitem set outcome = '', state = %s where id = %s",  # lower-case
        f"UPDATE {TABLE} AS w SET updated_at = updated_at, state = %s WHERE w.id = %s",  # an f-string
    ],
)
def test_sql_however_spelled_is_caught(sql):
    item = make_item(make_task())
    _caught(lambda: _raw(sql, [S.CANCELLED, item.pk]))


@pytest.mark.django_db
def test_a_data_modifying_cte_and_its_sqlite_twin_are_caught():
    item = make_item(make_task())
    if connection.vendor == "postgresql":
        sql = "WITH m AS (UPDATE stopdesk_workitem w SET state = %s WHERE w.id = %s RETURNING w.id) SELECT id FROM m"
    else:
        sql = "UPDATE stopdesk_workitem SET state = %s WHERE id = %s RETURNING id"
    _caught(lambda: _raw(sql, [S.CANCELLED, item.pk]))


@pytest.mark.django_db
def test_a_raw_insert_of_a_running_item_is_caught():
    task = make_task()
    now = timezone.now()
    sql = (
        "INSERT INTO stopdesk_workitem (task_id, kind, noun, noun_plural, mechanism, handle, label, idempotency_key,"
        " detail, state, created_at, updated_at, worker, check_count, outcome, evidence, needs_review)"
        " VALUES (%s, 'model_request', 'x', '', 'manual', '', '', NULL, '{}', 'running', %s, %s, '', 0, '', '{}', %s)"
    )
    _caught(lambda: _raw(sql, [task.pk, now, now, False]))


@pytest.mark.django_db
def test_no_path_is_exempt_not_even_one_called_sandbox():
    item = make_item(make_task())
    code = compile(
        "def write(pk):\n    WorkItem.objects.filter(pk=pk).update(state='cancelled')\n", "sandbox.py", "exec"
    )
    scope: dict[str, object] = {"WorkItem": WorkItem}
    exec(code, scope)  # a writer whose file sits where the old source check never looked
    _caught(lambda: scope["write"](item.pk))  # type: ignore[operator]


@pytest.mark.django_db(transaction=True)
def test_a_write_in_another_thread_fails_the_test_even_when_the_error_is_swallowed():
    import threading

    item = make_item(make_task())

    def careless() -> None:
        try:
            WorkItem.objects.filter(pk=item.pk).update(state=S.CANCELLED)
        except StateWriteOutsideWriter:
            pass  # swallowed: the teardown check still sees it
        finally:
            connection.close()

    thread = threading.Thread(target=careless)
    thread.start()
    thread.join()
    (found,) = state_guard.take_found()
    assert "stopdesk_workitem.state" in found


@pytest.mark.django_db
def test_compensation_and_delivery_states_move_only_through_their_one_function(cast):
    record = ExternalRecord.objects.get(item=make_external_effect(make_task()))
    compensation = Compensation.objects.create(
        external_record=record, action="archive", expected_version="1", proposed_by=cast["reviewer"]
    )
    _caught(lambda: Compensation.objects.filter(pk=compensation.pk).update(state=CompensationState.APPROVED))
    with transaction.atomic():
        compensation_move(compensation, (CompensationState.PROPOSED,), CompensationState.REJECTED, "t", "x", "no")
    compensation.refresh_from_db()
    assert compensation.state == CompensationState.REJECTED

    notification = Notification.objects.create(topic="uncertain", title="t", dedupe_key="guard")
    delivery = Delivery.objects.create(notification=notification, channel="webhook", target="endpoint:1")
    _caught(lambda: Delivery.objects.filter(pk=delivery.pk).update(state=DeliveryState.FAILED))
    moved = delivery_move(
        Q(pk=delivery.pk),
        from_states=(DeliveryState.PENDING,),
        to_state=DeliveryState.SENDING,
        claimed_until=timezone.now() + timedelta(seconds=30),
    )
    assert moved == 1 and state_guard.take_found() == []
    with pytest.raises(ValueError, match="not an allowed move"):
        delivery_move(Q(pk=delivery.pk), from_states=(DeliveryState.PENDING,), to_state=DeliveryState.DELIVERED)


def test_the_guard_reads_the_statement_not_its_spelling():
    written = lambda sql, params=None: [m.table for m in machines_written(sql, params)]  # noqa: E731
    assert written('UPDATE "stopdesk_workitem" SET "lease_until" = %s WHERE "id" = %s') == []
    assert written("UPDATE stopdesk_workitem SET state_note = 'state = x' WHERE id = 1") == []
    assert written("SELECT state FROM stopdesk_workitem WHERE state = 'running'") == []
    assert written("UPDATE stopdesk_workitem SET (outcome, state) = (%s, %s)") == ["stopdesk_workitem"]
    insert = 'INSERT INTO "stopdesk_workitem" ("task_id", "state") VALUES (%s, %s), (%s, %s)'
    assert written(insert, [1, "queued", 2, "queued"]) == []
    assert written(insert, [1, "queued", 2, "running"]) == ["stopdesk_workitem"]
    assert written("INSERT INTO stopdesk_workitem (task_id, state) SELECT 1, 'queued'") == ["stopdesk_workitem"]
    unnest = (
        'INSERT INTO "stopdesk_workitem" ("task_id", "state") SELECT * FROM UNNEST((%s)::bigint[], (%s)::varchar[])'
    )
    assert written(unnest, [[1, 2], ["queued", "queued"]]) == []
    assert written(unnest, [[1, 2], ["queued", "failed"]]) == ["stopdesk_workitem"]
    cast = "INSERT INTO stopdesk_workitem (detail, task_id, state) VALUES (%s::jsonb || %s::jsonb, %s, (%s)::text)"
    assert written(cast, ["{}", "{}", 1, "queued"]) == []
    assert written(cast, ["{}", "{}", 1, "running"]) == ["stopdesk_workitem"]
    assert written('UPDATE "reconcile_compensation" SET "state" = %s') == ["reconcile_compensation"]
    assert written('UPDATE "notify_delivery" SET "attempts" = 1') == []
