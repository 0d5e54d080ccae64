"""The outbox is written with the event that causes it, and only then; each notifying fact once."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import Q

from reconcile.services.compensation import compensation_propose
from stopdesk.models import WorkItem
from stopdesk.notify.models import Notification
from stopdesk.notify.topics import Topic
from stopdesk.services.items import item_finish, item_transition
from stopdesk.services.transitions import items_move
from stopdesk.states import ItemState
from tests.factories import ACTOR, make_external_effect, make_item, make_task

pytestmark = pytest.mark.django_db
S = ItemState


def test_an_item_becoming_uncertain_writes_one_notification_with_its_deadline():
    item = make_item(make_task(), state=S.RUNNING)
    item_transition(item_id=item.pk, to_state=S.UNCERTAIN, actor=ACTOR)
    (note,) = Notification.objects.filter(topic=Topic.ITEM_UNCERTAIN)
    item.refresh_from_db()
    assert note.item_id == item.pk and note.task_id == item.task_id
    assert note.data["investigate_by"] == item.investigate_by.isoformat()
    assert "investigate by" in note.title


def test_a_rolled_back_transition_leaves_no_notification():
    item = make_item(make_task(), state=S.RUNNING)
    with pytest.raises(RuntimeError), transaction.atomic():
        item_transition(item_id=item.pk, to_state=S.UNCERTAIN, actor=ACTOR)
        assert Notification.objects.count() == 1
        raise RuntimeError("the caller's transaction fails after the event")
    assert Notification.objects.count() == 0
    item.refresh_from_db()
    assert item.state == S.RUNNING


def test_a_set_based_move_to_uncertain_notifies_once_per_item_and_other_moves_not_at_all():
    task = make_task()
    items = [make_item(task, state=S.AWAITING_RECONCILIATION) for _ in range(3)]
    queued = make_item(task)
    moved = items_move(
        where=Q(task=task),
        from_states=(S.QUEUED,),
        to_state=S.CANCELLED,
        actor=ACTOR,
        kind="stop_cancelled",
        message="",
    )
    assert moved == 1 and not Notification.objects.exists()
    moved = items_move(
        where=Q(task=task),
        from_states=(S.AWAITING_RECONCILIATION,),
        to_state=S.UNCERTAIN,
        actor=ACTOR,
        kind="reconciled",
        message="no answer",
    )
    assert moved == 3
    notes = Notification.objects.filter(topic=Topic.ITEM_UNCERTAIN)
    assert sorted(n.item_id for n in notes) == sorted(i.pk for i in items)
    assert queued.pk not in {n.item_id for n in notes}


def test_a_late_result_notifies_and_an_ordinary_finish_does_not():
    task = make_task()
    item_finish(item_id=make_item(task, state=S.RUNNING).pk, succeeded=True, actor=ACTOR)
    assert not Notification.objects.exists()
    cancelled = make_item(task, state=S.CANCELLED)
    item_finish(item_id=cancelled.pk, succeeded=True, actor=ACTOR, outcome="it finished after all")
    (note,) = Notification.objects.all()
    assert note.topic == Topic.LATE_RESULT and note.item_id == cancelled.pk


def test_a_compensation_proposal_notifies_approvers(cast):
    item = make_external_effect(make_task())
    record = item.external_records.get()
    compensation = compensation_propose(record_id=record.pk, action="archive", note="undo", by=cast["admin"])
    (note,) = Notification.objects.filter(topic=Topic.COMPENSATION_PROPOSED)
    assert note.data["compensation_id"] == compensation.pk
    assert WorkItem.objects.filter(pk=note.item_id).exists()
