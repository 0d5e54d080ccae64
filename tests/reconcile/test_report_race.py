"""A reviewer's early report racing the deadline sweep on PostgreSQL, in threads with their own
connections: exactly one of them decides the item, and the record says which."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections

from reconcile.services.reconcile import item_reconcile, sweep_once
from reconcile.services.report import item_report
from reconcile.services.review import ReviewRefused
from stopdesk.models import Event, WorkItem
from stopdesk.permissions import roles_ensure
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
ROUNDS = 8


@pytest.fixture
def reviewer(cast):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Group

    roles_ensure()
    cast["reviewer"].groups.add(Group.objects.get(name="reviewers"))
    return cast["reviewer"]


def test_a_report_and_the_deadline_sweep_never_both_decide_the_item(reviewer):
    outcomes = []
    for n in range(ROUNDS):
        # Every other round the person is a moment slower than the sweep, so both orders are seen.
        lag = 0.0 if n % 2 == 0 else 0.3
        task = make_task("Post the renewal letters")
        item = make_item(task, state=S.RUNNING, mechanism="manual", noun="letter")
        task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
        item_reconcile(item_id=item.pk)
        item.refresh_from_db()
        deadline = item.cancel_requested_at + timedelta(hours=1, seconds=1)
        gate = threading.Barrier(2)
        refused: list[str] = []

        def report() -> None:
            try:
                gate.wait()
                time.sleep(lag)
                item_report(item_id=item.pk, done=True, note="", evidence="receipt 88412", by=reviewer)
            except ReviewRefused as exc:
                refused.append(str(exc))
            finally:
                connections.close_all()

        def sweep() -> None:
            try:
                gate.wait()
                sweep_once(now=deadline, concurrency=1)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=report), threading.Thread(target=sweep)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        item.refresh_from_db()
        kinds = list(
            Event.objects.filter(item=item, kind__in=("reported", "reconciled")).values_list("kind", flat=True)
        )
        if item.state == S.COMPLETED:
            assert kinds == ["reported"] and not refused
        else:
            assert item.state == S.UNCERTAIN and kinds == ["reconciled"]
            assert refused and "is uncertain" in refused[0]
        outcomes.append(item.state)
    assert set(outcomes) == {S.COMPLETED, S.UNCERTAIN}
    assert WorkItem.objects.filter(state=S.AWAITING_RECONCILIATION).count() == 0
