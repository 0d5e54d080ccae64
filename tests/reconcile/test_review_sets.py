"""Decisions on many uncertain items at once: one transaction, one audited event per item with its
own evidence, each item's from-state checked, and items that moved meanwhile reported."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from reconcile.models import Escalation
from reconcile.services.review import ReviewRefused, item_resolve
from reconcile.services.review_sets import items_acknowledge, items_escalate, items_extend, items_resolve
from stopdesk.models import Event, WorkItem
from stopdesk.services.items import item_finish
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.web.queue_scenes import unknown_call

S = ItemState


@pytest.fixture
def reviewer(roles):  # type: ignore[no-untyped-def]
    return roles["reviewer"]


@pytest.fixture
def roles(cast):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group

    from stopdesk.permissions import roles_ensure

    roles_ensure()
    cast["reviewer"].groups.add(Group.objects.get(name="reviewers"))
    cast["approver"].groups.add(Group.objects.get(name="approvers"))
    return cast


def _calls(n: int) -> list[WorkItem]:
    task = make_task("Refund March duplicates")
    return [unknown_call(task, tool="payments.refund", system="payments") for _ in range(n)]


def test_resolving_many_items_writes_one_event_each_with_its_own_evidence(reviewer):
    items = _calls(5)
    decided = items_resolve(
        item_ids=[i.pk for i in items],
        outcome=S.FAILED,
        note="Provider shows no refund for these keys",
        evidence="Provider dashboard search by idempotency key, 14:02",
        by=reviewer,
    )
    assert decided.done == sorted(i.pk for i in items) and decided.moved == []
    for item in items:
        item.refresh_from_db()
        assert item.state == S.FAILED
        resolution = item.evidence["resolution"]
        assert resolution["idempotency_key"] == item.idempotency_key and resolution["batch"] == decided.batch
        event = Event.objects.get(item=item, kind="resolved")
        assert event.actor == "user:reviewer" and (event.from_state, event.to_state) == (S.UNCERTAIN, S.FAILED)
        assert event.data["evidence"]["resolution"]["idempotency_key"] == item.idempotency_key


def test_items_that_moved_meanwhile_are_reported_and_not_overwritten(reviewer, roles):
    items = _calls(3)
    first = items[0]
    item_resolve(item_id=first.pk, outcome=S.COMPLETED, note="Found it", evidence="receipt 77", by=roles["reviewer"])
    decided = items_resolve(
        item_ids=[i.pk for i in items], outcome=S.FAILED, note="Not there", evidence="search", by=reviewer
    )
    assert decided.moved == [first.pk] and decided.done == [items[1].pk, items[2].pk]
    first.refresh_from_db()
    assert first.state == S.COMPLETED and first.evidence["resolution"]["evidence"] == "receipt 77"
    assert Event.objects.filter(item=first, kind="resolved").count() == 1


def test_a_decision_without_a_note_writes_nothing(reviewer):
    items = _calls(2)
    with pytest.raises(ReviewRefused, match="needs a note and evidence"):
        items_resolve(item_ids=[i.pk for i in items], outcome=S.FAILED, note=" ", evidence="x", by=reviewer)
    assert not Event.objects.filter(kind="resolved").exists()
    assert set(WorkItem.objects.filter(pk__in=[i.pk for i in items]).values_list("state", flat=True)) == {S.UNCERTAIN}


def test_only_a_reviewer_decides(cast):
    items = _calls(1)
    with pytest.raises(ReviewRefused, match="reviewer role"):
        items_resolve(item_ids=[items[0].pk], outcome=S.FAILED, note="n", evidence="e", by=cast["operator"])


def test_extending_moves_each_deadline_on_from_where_it_stood(reviewer):
    items = _calls(2)
    past = timezone.now() - timedelta(hours=5)
    WorkItem.objects.filter(pk=items[0].pk).update(investigate_by=past)
    before = WorkItem.objects.get(pk=items[1].pk).investigate_by
    decided = items_extend(item_ids=[i.pk for i in items], hours=24, reason="Vendor answers Monday", by=reviewer)
    assert len(decided.done) == 2
    overdue, later = (WorkItem.objects.get(pk=i.pk) for i in items)
    assert overdue.investigate_by > timezone.now() + timedelta(hours=23)  # from now, not from the past deadline
    assert later.investigate_by - before == timedelta(hours=24)
    event = Event.objects.get(item=later, kind="deadline_extended")
    assert event.message == "Vendor answers Monday" and event.data["from"] == before.isoformat()


def test_escalating_opens_one_escalation_per_item_each_with_its_event(reviewer, roles):
    items = _calls(3)
    decided = items_escalate(
        item_ids=[i.pk for i in items], to=roles["approver"], reason="Needs the provider contact", by=reviewer
    )
    assert len(decided.done) == 3
    escalations = Escalation.objects.filter(item__in=items)
    assert escalations.count() == 3 and {e.to for e in escalations} == {roles["approver"]}
    for e in escalations:
        assert Event.objects.get(item_id=e.item_id, kind="escalated").data["escalation"] == e.pk


def test_resolving_closes_the_items_open_escalations(reviewer, roles):
    items = _calls(2)
    items_escalate(item_ids=[i.pk for i in items], to=roles["approver"], reason="Ask finance", by=reviewer)
    items_resolve(item_ids=[i.pk for i in items], outcome=S.FAILED, note="No refund", evidence="ledger", by=reviewer)
    assert not Escalation.objects.filter(item__in=items, closed_at__isnull=True).exists()


def test_acknowledging_late_results_keeps_each_state_and_its_late_report(reviewer):
    task = make_task("Invoice batch 7")
    late = []
    for _ in range(3):
        item = make_item(task, state=S.RUNNING)
        item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test")
        item_finish(item_id=item.pk, succeeded=True, actor="system:reconcile", outcome="completed after cancel")
        late.append(item)
    decided = items_acknowledge(item_ids=[i.pk for i in late], note="Drafts are harmless", by=reviewer)
    assert len(decided.done) == 3
    for item in late:
        item.refresh_from_db()
        assert item.state == S.CANCELLED and not item.needs_review
        event = Event.objects.get(item=item, kind="late_result_acknowledged")
        assert event.data["late_result"]["reported"] == S.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_deciding_the_same_group_at_once_decide_each_item_once(cast):
    from django.contrib.auth.models import Group

    from stopdesk.permissions import roles_ensure

    roles_ensure()
    for name in ("reviewer", "approver"):
        cast[name].groups.add(Group.objects.get(name="reviewers"))
    ids = [i.pk for i in _calls(40)]
    results, start = {}, threading.Barrier(2)

    def decide(name: str, outcome: str) -> None:
        try:
            start.wait()
            results[name] = items_resolve(item_ids=ids, outcome=outcome, note=name, evidence="e", by=cast[name])
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=("reviewer", S.FAILED)),
        threading.Thread(target=decide, args=("approver", S.COMPLETED)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    a, b = results["reviewer"], results["approver"]
    assert sorted(a.done + b.done) == ids and set(a.done).isdisjoint(b.done)
    assert sorted(a.moved) == sorted(b.done) and sorted(b.moved) == sorted(a.done)
    assert Event.objects.filter(item_id__in=ids, kind="resolved").count() == 40
